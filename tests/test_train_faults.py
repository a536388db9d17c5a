"""g3-train on a bad partition (one rank's part damaged, inconsistent between neighbours, the wrong number of
ranks) and on non-finite or too large values: a clear message on every rank, non-zero exit, within seconds."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch

from g3mpi.format import file_sha256, part_name, read_meta, write_meta
from tests.train_runs import error_lines, metrics, parts, read_ds, rewrite_part, train  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


def _flip_byte(d, root):
    path = d / part_name(1)
    b = bytearray(path.read_bytes())
    b[len(b) // 2] ^= 0x01
    path.write_bytes(bytes(b))
    return 1, "part-00001.h5", "checksum mismatch"


def _truncate(d, root):
    path = d / part_name(1)
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 3])
    return 1, "part-00001.h5", "checksum mismatch"


def _truncate_noverify(d, root):
    _truncate(d, root)
    return 1, "part-00001.h5", "not a readable HDF5 file"


def _crash_hdf5_noverify(d, root):
    # one byte of the datatype message of part 1's partition_id attribute (a variable-length string's class bits
    # 0x01 -> 0x63): h5py 3.16 / HDF5 2.0.0 die with a segmentation fault reading it (found by fuzzing part files
    # with --no-verify; the rank used to die without a message)
    path = d / part_name(1)
    b = bytearray(path.read_bytes())
    i = b.find(b"partition_id\x00")
    assert i > 0 and b.count(b"partition_id\x00") == 1 and b[i + 16:i + 18] == b"\x19\x01", "layout changed"
    b[i + 17] = 0x63
    path.write_bytes(bytes(b))
    return 1, "part-00001.h5", "reading it crashed the HDF5 library (SIGSEGV"


def _swap(d, root):
    a, b = d / part_name(0), d / part_name(1)
    tmp = d / "x.h5"
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    return [0, 1], "part-0000{r}.h5", "checksum mismatch"


def _swap_noverify(d, root):
    _swap(d, root)
    return [0, 1], "part-0000{r}.h5", "swapped"


def _bad_column(d, root):
    ind = read_ds(d, 1, "indices")
    n_local = len(read_ds(d, 1, "in_degree"))
    ind[len(ind) // 2] = n_local + 7
    rewrite_part(d, 1, indices=ind)
    return 1, "part-00001.h5", f"column index {n_local + 7} out of range"


def _row_out_of_order(d, root):
    # a row's sources in another order than FORMAT.md's: trained as if sorted (the runtime sorts its blocks), now
    # refused as a format violation (left open by the fuzzing campaign)
    ip, ind = read_ds(d, 1, "indptr"), read_ds(d, 1, "indices")
    r = next(r for r in range(len(ip) - 1) if len(np.unique(ind[ip[r]:ip[r + 1]])) > 1)
    ind[ip[r]:ip[r + 1]] = ind[ip[r]:ip[r + 1]][::-1].copy()
    rewrite_part(d, 1, indices=ind)
    return 1, "part-00001.h5", f"the sources of owned row {r} "


def _nan_feature(d, root):
    x = read_ds(d, 0, "features")
    x[3, 2] = np.nan
    rewrite_part(d, 0, features=x)
    return 0, "part-00000.h5", "features of node 3 are not finite as float32 (column 2: nan; "


def _bad_send_row(d, root):
    rows = read_ds(d, 0, "send_rows")
    n_owned = len(read_ds(d, 0, "labels"))
    rows[0] = n_owned + 3
    rewrite_part(d, 0, send_rows=rows)
    return 0, "part-00000.h5", "send row out of range"


def _other_partition(d, root):
    shutil.copy(root / "p2other" / part_name(1), d / part_name(1))
    meta = read_meta(d)
    meta["files"][part_name(1)] = file_sha256(d / part_name(1))
    write_meta(d, meta)
    return 1, "part-00001.h5", "belongs to partition"


def _neighbour_mismatch(d, root):
    # part 0 expects a node of part 1 that part 1 does not send: every file is valid on its own (its halo sorted,
    # owned by part 1), the pair is not
    halo = read_ds(d, 0, "halo_ids")
    with h5py.File(d / part_name(1), "r") as f:
        lo, hi = int(f.attrs["owned_start"]), int(f.attrs["owned_end"])
    mine = np.nonzero((halo >= lo) & (halo < hi))[0]
    # a free ID just above one of them (boundary-first: part 1's boundary rows are its first IDs, no gap below)
    j = next(int(j) for j in mine if halo[j] + 1 < min(halo[j + 1] if j + 1 < len(halo) else hi, hi))
    halo[j] += 1
    rewrite_part(d, 0, halo_ids=halo)
    return 0, "part-00000.h5", "halo node IDs from part-00001.h5 (rank 1) differ"


def _halo_degree_mismatch(d, root):
    # part 0's copy of a halo node's in-degree differs from its owner's: no single file can show it (the owned rows'
    # in-degrees are checked against the CSR, the halo rows' are not), and GCN trained with the wrong
    # normalisation, exit status 0 (found by fuzzing part files with --no-verify)
    deg = read_ds(d, 0, "in_degree")
    n_owned = len(read_ds(d, 0, "labels"))
    deg[n_owned] += 1
    rewrite_part(d, 0, in_degree=deg)
    return 0, "part-00000.h5", "the degrees of the"


def _recv_parts_2d(d, root):
    # once deadlocked every rank: the halo check failed on rank 0 before its Alltoall, rank 1 waited in it
    rewrite_part(d, 0, recv_parts=read_ds(d, 0, "recv_parts").reshape(-1, 1))
    return 0, "part-00000.h5", "'recv_parts' has shape"


def _unlabelled_train_node(d, root):
    labels = read_ds(d, 1, "labels")
    labels[np.flatnonzero(read_ds(d, 1, "train_mask"))[0]] = -1
    rewrite_part(d, 1, labels=labels)
    return 1, "part-00001.h5", "train_mask contains 1 unlabelled nodes"


def _no_train_nodes(d, root):
    for p in (0, 1):
        rewrite_part(d, p, train_mask=np.zeros_like(read_ds(d, p, "train_mask")))
    return [0, 1], d.name, "the graph has no training nodes"


def _orig_id_owned_twice(d, root):
    # part 1 owns one of part 0's original IDs instead of its own: each part file passes its checks (IDs in
    # range, strictly increasing, checksums right), the partition does not
    mine, theirs = read_ds(d, 1, "orig_ids"), read_ds(d, 0, "orig_ids")
    lo = np.concatenate([[-1], mine[:-1]])
    hi = np.concatenate([mine[1:], [theirs.max() + 1]])
    i, v = next((i, v) for i in range(len(mine)) for v in theirs if lo[i] < v < hi[i])
    mine[i] = v
    rewrite_part(d, 1, orig_ids=mine)
    return [0, 1], d.name, "the parts do not own every original node ID exactly once"


LOAD_FAULTS = {
    "byte_flipped": (_flip_byte, []),
    "truncated": (_truncate, []),
    "truncated_no_verify": (_truncate_noverify, ["--no-verify"]),
    "hdf5_crash_no_verify": (_crash_hdf5_noverify, ["--no-verify"]),
    "swapped": (_swap, []),
    "swapped_no_verify": (_swap_noverify, ["--no-verify"]),
    "column_out_of_range": (_bad_column, []),
    "row_out_of_order": (_row_out_of_order, []),
    "nan_feature": (_nan_feature, []),
    "send_row_out_of_range": (_bad_send_row, []),
    "part_of_other_partition": (_other_partition, []),
    "neighbour_mismatch": (_neighbour_mismatch, []),
    "halo_degree_mismatch": (_halo_degree_mismatch, []),
    "recv_parts_2d": (_recv_parts_2d, []),
    "unlabelled_train_node": (_unlabelled_train_node, []),
    "no_train_nodes": (_no_train_nodes, []),
    "orig_id_owned_twice": (_orig_id_owned_twice, []),
    # the same start-up checks with the watchdog's deadline-polled collectives (error texts of unequal sizes)
    "byte_flipped_watchdog": (_flip_byte, ["--comm-timeout", "30"]),
    "neighbour_mismatch_watchdog": (_neighbour_mismatch, ["--comm-timeout", "30"]),
    "no_train_nodes_watchdog": (_no_train_nodes, ["--comm-timeout", "30"]),
}


@pytest.mark.parametrize("fault", list(LOAD_FAULTS))
def test_bad_part_every_rank_exits(fault, parts, tmp_path):
    d = tmp_path / "p2"
    shutil.copytree(parts / "p2", d)
    make, extra = LOAD_FAULTS[fault]
    bad, fname, what = make(d, parts)
    bad = bad if isinstance(bad, list) else [bad]
    p = train(2, d, tmp_path / "run", "--epochs", "2", *extra, check=False, timeout=120)
    assert p.returncode != 0, p.stderr
    lines = error_lines(p.stderr)
    assert sorted(lines) == sorted(bad), p.stderr                  # the failing ranks, named by the job's lines
    assert all(len(v) == 1 for v in lines.values()), p.stderr      # one line each
    for r in bad:
        assert fname.format(r=r) in lines[r][0] and what in lines[r][0], p.stderr
    assert "Traceback" not in p.stderr and "Segmentation" not in p.stderr
    assert not (tmp_path / "run").exists()                          # nothing written


def test_no_validation_nodes(parts, tmp_path):
    """No validation nodes: a warning, the last evaluated model kept, early stopping off, strict JSON (an
    accuracy over an empty split is null, not NaN)."""
    d = tmp_path / "p2"
    shutil.copytree(parts / "p2", d)
    for p in (0, 1):
        rewrite_part(d, p, val_mask=np.zeros_like(read_ds(d, p, "val_mask")))
    p = train(2, d, tmp_path / "run", "--epochs", "4", "--eval-every", "2", "--patience", "1")
    assert "no validation nodes or pairs: the model of the last evaluated epoch is kept, and --patience is ignored" \
        in p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text(), parse_constant=pytest.fail)
    assert summary["best_epoch"] == summary["epochs"] == 4 and summary["val_acc"] is None
    assert summary["test_acc"] is not None
    lines = [json.loads(x, parse_constant=pytest.fail) for x in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["val_acc"] for r in lines if "val_acc" in r] == [None, None]


def test_wrong_number_of_ranks(parts, tmp_path):
    p = train(2, parts / "p3", tmp_path / "run", "--epochs", "2", check=False, timeout=120)
    assert p.returncode != 0
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1]
    for r in (0, 1):
        assert "meta.json" in lines[r][0] and "3 parts but 2 ranks" in lines[r][0]


@pytest.mark.parametrize("where", ["loss", "convs.1.lin_l.bias"])
def test_nonfinite_stops_and_keeps_checkpoint(where, parts, tmp_path):
    run = tmp_path / "run"
    spec = "1:5" if where == "loss" else f"0:5:{where}"
    p = train(2, parts / "p2", run, "--model", "sage", "--epochs", "8", "--checkpoint-every", "2", check=False,
              timeout=150, env={"G3_TEST_NAN": spec})
    assert p.returncode != 0
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1] and all(len(v) == 1 for v in lines.values()), p.stderr
    bad = 1 if where == "loss" else 0
    want = "the loss" if where == "loss" else f"the gradient of {where}"
    assert f"non-finite value (NaN or Inf) in {want} at epoch 5 on this rank" in lines[bad][0]
    assert "training stopped at epoch 5" in lines[1 - bad][0]
    assert "Traceback" not in p.stderr
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["epoch"] == 4
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert [r["epoch"] for r in metrics(run)] == [1, 2, 3, 4]
    assert not (run / "model.pt").exists()


@pytest.mark.parametrize("value", [3e38, 1e25])
def test_features_too_large_for_float32(value, parts, tmp_path):
    """Finite features too large for float32 training (left open by the fuzzing campaign). 3e38 ended the run with
    'non-finite value in the loss', naming no file; 1e25 made some of Adam's second moments infinite, which froze
    their parameters, and the run exited 0. Now a warning on load names the file, and every rank stops at the first
    epoch with one line naming the part file and the rank whose features are too large."""
    d = tmp_path / "p2"
    shutil.copytree(parts / "p2", d)
    x = read_ds(d, 0, "features")
    x[3, 2] = value
    rewrite_part(d, 0, features=x)
    run = tmp_path / "run"
    p = train(2, d, run, "--epochs", "4", "--dropout", "0", check=False, timeout=150)   # (no dropout of the entry)
    assert p.returncode != 0, p.stderr
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1] and all(len(v) == 1 for v in lines.values()), p.stderr
    for r in (0, 1):
        assert "at epoch 1" in lines[r][0], p.stderr   # (here the summed gradients, beyond 2^64; or the loss, NaN)
        assert f"the features in {d}/part-00000.h5 (rank 0) reach {np.float32(value):.3g}, beyond 2^64" \
            in lines[r][0], p.stderr
    assert "part-00000.h5: the features of 1 node(s) reach" in p.stderr   # the warning on load (rank 0's)
    assert "Traceback" not in p.stderr
    assert not (run / "checkpoint.pt").exists() and not (run / "model.pt").exists()
    print(f"value {value:g}: exit status {p.returncode} after {p.elapsed:.1f} s")
