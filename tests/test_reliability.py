"""Reliability of g3-train under real mpiexec: bad partitions on one rank, halo inconsistency between neighbours,
the communication watchdog, a rank killed with SIGKILL, non-finite values, checkpoints and exact resume.

Every multi-rank run has a timeout, so a hang fails the test instead of hanging CI. Test-only fault hooks are
the ``G3_TEST_*`` variables of ``g3mpi.train.faults``.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from g3mpi.format import array_sha256, file_sha256, part_name, read_meta, write_meta
from tests.conftest import mpiexec, run_mpi, tool_env
from tests.graphs import partition, random_graph

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)

MOD = "g3mpi.cli.train"
FAST = ["--no-progress", "--log-level", "WARNING", "--hidden", "8"]
#: --comm-timeout of the watchdog tests: well above every legitimate wait of one rank for another before the fault under
#: test. On 2 busy cores the ranks took 12-16 s to start and reached the first start-up check up to 2.0 s apart (torch's
#: import alone differs by that much), and building the Trainer differed by up to 1.7 s: 2 s fired there at times
COMM_TIMEOUT = 6


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    g = random_graph(n=200, f=8, c=4, seed=5)
    root = tmp_path_factory.mktemp("rel_parts")
    for P in (2, 3):
        partition(g, P, root / f"p{P}", seed=P)
    partition(g, 2, root / "p2other", seed=11)   # another partition of the same graph
    return root


def train(P, parts_dir, out, *extra, check=True, timeout=180, env=None):
    cmd = [mpiexec(), "-n", str(P), sys.executable, "-m", "mpi4py", "-m", MOD, *FAST, *map(str, extra)]
    if parts_dir is not None:
        cmd += ["--parts", str(parts_dir)]
    if out is not None:
        cmd += ["--out", str(out)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env={**tool_env(), **(env or {})}, timeout=timeout)
    p.elapsed = time.monotonic() - t0
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\nstderr:\n{p.stderr}")
    return p


def error_lines(stderr: str) -> dict:
    """rank -> the g3-train error lines of that rank."""
    out = {}
    for line in stderr.splitlines():
        if line.startswith("g3-train: error: [rank "):
            r = int(line.split("[rank ", 1)[1].split("]", 1)[0])
            out.setdefault(r, []).append(line)
    return out


def rewrite_part(d: Path, p: int, **datasets) -> None:
    """Replace datasets of part p in place, with correct dataset and meta.json checksums (a file that passes
    every checksum but carries bad content)."""
    path = d / part_name(p)
    with h5py.File(path, "r+") as f:
        for k, v in datasets.items():
            v = np.asarray(v)
            if f[k].shape == v.shape and f[k].dtype == v.dtype:
                f[k][...] = v
            else:
                del f[k]
                f.create_dataset(k, data=v)
            f[k].attrs["sha256"] = array_sha256(v)
    meta = read_meta(d)
    meta["files"][path.name] = file_sha256(path)
    write_meta(d, meta)


def read_ds(d: Path, p: int, k: str) -> np.ndarray:
    with h5py.File(d / part_name(p), "r") as f:
        return f[k][()]


# -- bad input on load ------------------------------------------------------------------------------------------
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
    assert sorted(lines) == [0, 1], p.stderr                       # every rank said something
    assert all(len(v) == 1 for v in lines.values()), p.stderr      # one line each
    for r in (0, 1):
        if r in bad:
            assert fname.format(r=r) in lines[r][0] and what in lines[r][0], p.stderr
        else:
            assert "stopping" in lines[r][0] and f"{bad}" in lines[r][0], p.stderr
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
    assert "no validation nodes: the model of the last evaluated epoch is kept, and --patience is ignored" \
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


# -- checkpoints and resume -------------------------------------------------------------------------------------
def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_resume_is_bit_identical(parts, tmp_path):
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "3", "--checkpoint-every", "2", *args)
    assert torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)["epoch"] == 3
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "6")
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)
    ma, mb = _metrics(tmp_path / "straight"), _metrics(tmp_path / "split")
    assert [r["epoch"] for r in mb] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(ma, mb):
        for k in ("loss", "train_acc", "val_acc", "test_acc"):
            assert ra[k] == rb[k], (ra["epoch"], k)
    for name in ("model.pt",):
        sa = torch.load(tmp_path / "straight" / name, weights_only=True)
        sb = torch.load(tmp_path / "split" / name, weights_only=True)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with h5py.File(tmp_path / "straight" / "predictions.h5") as fa, h5py.File(tmp_path / "split" / "predictions.h5") as fb:
        assert np.array_equal(fa["logits"][:], fb["logits"][:])
    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert (sa["best_epoch"], sa["test_acc"], sa["final_loss"]) == (sb["best_epoch"], sb["test_acc"], sb["final_loss"])
    # the timings summarise the run's 6 epochs (metrics.jsonl), not only the 3 the resumed job trained
    assert sb["epoch_time_median_s"] == statistics.median(r["epoch_time_s"] for r in mb)
    assert sb["compute_time_median_s"] == statistics.median(max(r["rank_compute_s"]) for r in mb)
    assert sb["bytes_sent_per_epoch"] == sa["bytes_sent_per_epoch"] > 0


def test_resume_after_an_off_grid_last_epoch(parts, tmp_path):
    """A run of 4 epochs with --eval-every 3 evaluates after epoch 4 because it is its last: resumed to 6 epochs
    it must select, log and predict as a straight 6-epoch run, which never evaluated at epoch 4 (an audit found
    the resumed run keeping that evaluation: another best epoch and other predictions)."""
    args = ["--eval-every", "3", "--dropout", "0.6", "--lr", "0.2", "--seed", "1"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "4", *args)
    assert "val_acc" in _metrics(tmp_path / "split")[3]
    (tmp_path / "split" / ".checkpoint.pt.x1y2.tmp").write_bytes(b"a write a crash interrupted")
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "6")
    assert not list((tmp_path / "split").glob(".*"))
    ma, mb = _metrics(tmp_path / "straight"), _metrics(tmp_path / "split")
    strip = ("epoch_time_s", "rank_compute_s", "rank_blocked_s", "rank_comm_s", "rank_overlap", "rank_allreduce_s",
             "rank_rss_bytes")
    assert [{k: v for k, v in r.items() if k not in strip} for r in ma] == \
        [{k: v for k, v in r.items() if k not in strip} for r in mb]
    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert (sa["best_epoch"], sa["val_acc"], sa["test_acc"]) == (sb["best_epoch"], sb["val_acc"], sb["test_acc"])
    a = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_continues_early_stopping_and_keeps_the_best_model(parts, tmp_path):
    """With --lr 0 the parameters never change, so the first evaluation stays the best and --patience 3 stops a
    straight run at epoch 4. A run checkpointed at epoch 2 (one evaluation without improvement) and resumed
    must stop there too, with the same best epoch: the checkpoint carries the count and the best accuracy. The
    checkpoint holds the best model itself (model.pt of the run that wrote it). (A mutation run found the count
    and the best accuracy untested: counting from 0 again, or from a best accuracy of -1, after resuming passed
    every test, as did predictions.h5 naming the last epoch as its best_epoch; a checkpoint without the best
    model failed only where a test edits that model.)"""
    args = ["--lr", "0", "--patience", "3", "--eval-every", "1", "--seed", "2"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "10", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "2", *args)
    ck = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    best = torch.load(tmp_path / "split" / "model.pt", weights_only=True)
    assert (ck["epoch"], ck["since_best"], ck["best"]["epoch"]) == (2, 1, 1)
    assert sorted(ck["best"]["state"]) == sorted(best)
    assert all(torch.equal(ck["best"]["state"][k], best[k]) for k in best)
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "10")
    for run in ("straight", "split"):
        s = json.loads((tmp_path / run / "summary.json").read_text())
        assert (s["epochs"], s["best_epoch"]) == (4, 1), run
        with h5py.File(tmp_path / run / "predictions.h5") as f:   # the predictions say whose they are
            assert f.attrs["best_epoch"] == 1, run
    assert [r["epoch"] for r in _metrics(tmp_path / "split")] == [1, 2, 3, 4]


def test_resume_refuses_a_finished_run(parts, tmp_path):
    """Resuming a run that finished (or stopped early) rewrote its outputs from the checkpoint: null timings,
    and an older model when the last epoch was off the --eval-every grid (audit). Now refused, files untouched."""
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "3", "--eval-every", "2")
    before = {f.name: f.read_bytes() for f in run.iterdir()}
    p = train(2, None, None, "--resume", run, check=False, timeout=120)
    assert p.returncode != 0
    assert "checkpoint.pt: already at epoch 3: nothing to train with --epochs 3" in error_lines(p.stderr)[0][0]
    assert {f.name: f.read_bytes() for f in run.iterdir()} == before
    # the last checkpoint written but not the outputs (a full disk, a kill): the resume writes them, as they were
    for name in ("summary.json", "model.pt", "predictions.h5"):
        (run / name).unlink()
    train(2, None, None, "--resume", run)
    assert (run / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]
    # the summary is the one the run wrote, its timings too (they were null: no epoch trained in the resumed job)
    sa, sb = json.loads(before["summary.json"]), json.loads((run / "summary.json").read_text())
    memory = ("peak_rss_bytes_max", "rank_peak_rss_bytes")
    assert {k: v for k, v in sb.items() if k not in memory} == {k: v for k, v in sa.items() if k not in memory}
    with h5py.File(run / "predictions.h5") as f, h5py.File(io.BytesIO(before["predictions.h5"])) as ref:
        assert f.attrs["best_epoch"] == ref.attrs["best_epoch"]   # the off-grid last evaluation competed again
        assert np.array_equal(f["logits"][:], ref["logits"][:])
    a = torch.load(io.BytesIO(before["model.pt"]), weights_only=True)
    assert all(torch.equal(v, torch.load(run / "model.pt", weights_only=True)[k]) for k, v in a.items())
    early = tmp_path / "early"
    train(2, parts / "p2", early, "--epochs", "200", "--patience", "1", "--lr", "0.5")
    stopped = json.loads((early / "summary.json").read_text())["epochs"]
    assert stopped < 200
    p = train(2, None, None, "--resume", early, "--epochs", "300", check=False, timeout=120)
    assert p.returncode != 0
    assert f"the run stopped early at epoch {stopped}" in error_lines(p.stderr)[1][0]
    train(2, None, None, "--resume", early, "--epochs", str(stopped + 2), "--patience", "50")   # the escape


def test_resume_refuses_incompatible(parts, tmp_path):
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "2")
    before = (run / "checkpoint.pt").read_bytes()
    p = train(2, None, None, "--resume", run, "--epochs", "4", "--hidden", "16", check=False, timeout=120)
    assert p.returncode != 0
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1]
    assert "checkpoint.pt: incompatible configuration: hidden = 8 in the checkpoint but 16 now" in lines[0][0]
    p = train(2, parts / "p2other", None, "--resume", run, "--epochs", "4", check=False, timeout=120)
    assert p.returncode != 0
    assert "checkpoint.pt: was written for partition" in error_lines(p.stderr)[1][0]
    assert (run / "checkpoint.pt").read_bytes() == before


def _extra_parameter(ck):
    ck["model"]["convs.9.bias"] = torch.zeros(3)
    return "its model does not fit the configured one: not in the model convs.9.bias"


def _adam_state_shape(ck):
    ck["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2, 2)
    return "its optimizer state 'exp_avg' of parameter 0 is (2, 2)"


def _short_rng(ck):
    ck["rng"] = ck["rng"][:10]
    return "its rng state has 10 bytes"


def _best_model_shape(ck):
    k = sorted(ck["best"]["state"])[0]
    ck["best"]["state"][k] = torch.zeros(7, 7)
    return f"its best model does not fit the configured one: {k} is (7, 7)"


def _nan_parameter(ck):
    k = sorted(ck["model"])[0]
    ck["model"][k].view(-1)[0] = float("nan")
    return f"its model's parameter {k!r} has non-finite values"


def test_resume_refuses_states_that_do_not_fit(parts, tmp_path):
    """A checkpoint of the right layout and configuration whose tensors do not fit the model (found by fuzzing
    --resume): an extra parameter made Trainer.restore's load_state_dict fail with a traceback on every rank, an
    Adam state of another shape failed in the first step, a short RNG state in set_rng_state, a best model of
    other shapes at the end when writing model.pt; a NaN parameter trained on to 'non-finite value in the loss'
    (the --init-from check refuses it). Each is now refused before the run directory is touched, one line per
    rank naming the checkpoint."""
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "2")
    good = torch.load(run / "checkpoint.pt", weights_only=True)
    for edit in (_extra_parameter, _adam_state_shape, _short_rng, _best_model_shape, _nan_parameter):
        ck = torch.load(run / "checkpoint.pt", weights_only=True)
        what = edit(ck)
        torch.save(ck, run / "checkpoint.pt")
        before = {f.name: f.read_bytes() for f in run.iterdir()}
        p = train(2, None, None, "--resume", run, "--epochs", "4", check=False, timeout=120)
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        lines = error_lines(p.stderr)
        assert sorted(lines) == [0, 1] and all(len(v) == 1 for v in lines.values()), p.stderr
        assert all("checkpoint.pt: " + what in v[0] for v in lines.values()), p.stderr
        assert {f.name: f.read_bytes() for f in run.iterdir()} == before
        torch.save(good, run / "checkpoint.pt")


def test_resume_on_another_partition_of_the_same_graph(tmp_path):
    """A checkpoint carries over to another partition of the same graph, with another number of ranks (a job
    restarted on a smaller or larger allocation): 3 epochs on 2 ranks, then 3 more on 3 ranks give the model of 6
    epochs on 2 ranks, up to float rounding (parameters are replicated, dropout is keyed by original node ID).
    A partition of another graph, or one whose meta.json does not name its graph, is refused."""
    from data_tools.partition import main as partition_main
    from g3mpi.format import write_graph
    write_graph(tmp_path / "g.h5", random_graph(n=200, f=8, c=4, seed=5))
    write_graph(tmp_path / "h.h5", random_graph(n=200, f=8, c=4, seed=6))
    for graph, P, method, out in (("g", 2, "random", "g2"), ("g", 3, "metis", "g3"), ("h", 3, "metis", "h3")):
        assert partition_main([str(tmp_path / f"{graph}.h5"), "--parts", str(P), "--method", method,
                               "--out", str(tmp_path / out), "--no-progress"]) == 0
    assert read_meta(tmp_path / "g2")["graph_sha256"] == read_meta(tmp_path / "g3")["graph_sha256"] \
        != read_meta(tmp_path / "h3")["graph_sha256"]
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    train(2, tmp_path / "g2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, tmp_path / "g2", tmp_path / "split", "--epochs", "3", *args)
    before = (tmp_path / "split" / "checkpoint.pt").read_bytes()
    p = train(3, tmp_path / "h3", None, "--resume", tmp_path / "split", "--epochs", "6", check=False, timeout=120)
    assert p.returncode != 0
    assert "and it splits another graph (graph_sha256 differs)" in error_lines(p.stderr)[2][0]
    assert (tmp_path / "split" / "checkpoint.pt").read_bytes() == before
    p = train(3, tmp_path / "g3", None, "--resume", tmp_path / "split", "--epochs", "6", "--log-level", "INFO")
    assert "trained on another partition of the same graph (random, 2 parts)" in p.stderr
    assert f"parts = {str(tmp_path / 'g3')!r}".replace("'", '"') in (tmp_path / "split" / "config.toml").read_text()
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 6 and b["partition"]["num_parts"] == 3
    for k in a["model"]:
        assert torch.linalg.norm(a["model"][k] - b["model"][k]) <= 1e-5 * torch.linalg.norm(a["model"][k]), k
    ma, mb = _metrics(tmp_path / "straight"), _metrics(tmp_path / "split")
    assert [r["epoch"] for r in mb] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(ma, mb):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-5 * abs(ra["loss"]), ra["epoch"]
        assert (ra["val_acc"], ra["test_acc"]) == (rb["val_acc"], rb["test_acc"]), ra["epoch"]
    with h5py.File(tmp_path / "straight" / "predictions.h5") as fa, h5py.File(tmp_path / "split" / "predictions.h5") as fb:
        np.testing.assert_allclose(fb["logits"][:], fa["logits"][:], rtol=1e-5, atol=1e-6)


# -- a stop signal (time limit, scancel, kill) -------------------------------------------------------------------
def _signalled(cmd, env: dict, send, ready) -> tuple[subprocess.Popen, str]:
    """Start ``cmd``; once ``ready()`` (polled for up to 120 s) call ``send(proc)``; wait for the end (killing it
    if it outlives 120 s more). Returns the process and its stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**tool_env(), **env})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        send(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, err


@pytest.mark.parametrize("target", ["mpiexec", "one rank"])
def test_stop_signal_checkpoints_at_an_epoch_boundary_and_resume_is_exact(target, parts, tmp_path):
    """SIGTERM to mpiexec (forwarded to every rank, as at a batch job's time limit) or SIGUSR1 to one rank only:
    every rank stops after the same epoch with its checkpoint written, exit status 75, nothing else written;
    --resume then continues exactly as a run that was never stopped."""
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "100000", *args, *FAST]

    def send(proc):
        if target == "mpiexec":
            proc.send_signal(signal.SIGTERM)
        else:
            os.kill(int((pids / "rank-1.pid").read_text()), signal.SIGUSR1)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids)}, send, ready=lambda: (run / "metrics.jsonl").exists()
                           and len((run / "metrics.jsonl").read_text().splitlines()) >= 2)
    assert proc.returncode == 75, err
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert e >= 2
    assert [r["epoch"] for r in _metrics(run)] == list(range(1, e + 1))
    # mpiexec forwards SIGTERM to both ranks, maybe an epoch apart: the line says so when only one had it then
    why = r"SIGTERM( on 1 of 2 ranks)?" if target == "mpiexec" else "SIGUSR1 on 1 of 2 ranks"
    assert re.search(f"g3-train: stopped by {why} after epoch {e} of 100000: {re.escape(str(run))}/checkpoint.pt is "
                     f"written; continue with: mpiexec -n 2 g3-train --resume {re.escape(str(run))}\n", err), err
    assert not error_lines(err), err
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.jsonl"]
    train(2, None, None, "--resume", run, "--epochs", e + 2)
    train(2, parts / "p2", tmp_path / "straight", "--epochs", e + 2, *args)
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == e + 2
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)
    for ra, rb in zip(_metrics(tmp_path / "straight"), _metrics(run), strict=True):
        for k in ("epoch", "loss", "train_acc", "val_acc", "test_acc"):
            assert ra[k] == rb[k], (ra["epoch"], k)


def test_a_second_run_in_a_run_directory_in_use_is_refused(parts, tmp_path):
    """Two runs in one run directory at once. Before the lock, a --resume of a run still training trained beside
    it, and a --force run deleted its files and wrote its own: a real run of each on Cora left a checkpoint of
    epoch 222 (the resume's, written after the first run's of epoch 246), metrics.jsonl and summary.json of 20
    epochs (the --force run's; the first run's metrics went to a deleted file), every job exiting 0 or stopped.
    Now the second one is refused on every rank, naming the directory and the first run's rank 0, and nothing of
    the first run is touched; once it has ended the directory is free (no lock file left) and --resume continues
    it."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "100000", "--checkpoint-every", "1", *FAST]
    second = []

    def second_runs_then_stop(proc):
        # (--time-limit: without the lock, each would stop after its first epoch instead of running on)
        second.append(train(2, None, None, "--resume", run, "--time-limit", "0.1", check=False, timeout=120))
        second.append(train(2, parts / "p2", run, "--force", "--epochs", "100000", "--time-limit", "0.1",
                            check=False, timeout=120))
        proc.send_signal(signal.SIGTERM)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids)}, second_runs_then_stop,
                           ready=lambda: (run / "checkpoint.pt").exists())
    holder = f"process {(pids / 'rank-0.pid').read_text().strip()} on {socket.gethostname()}"
    for p in second:
        assert p.returncode == 1, p.stderr
        lines = error_lines(p.stderr)
        assert lines == {r: [f"g3-train: error: [rank {r}] {run}: another g3-train run is using this run directory "
                             f"({holder} holds .g3-train.lock); wait for it to end, or choose another --out"]
                         for r in (0, 1)}, p.stderr
    assert proc.returncode == 75, err
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert [r["epoch"] for r in _metrics(run)] == list(range(1, e + 1))
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.jsonl"]
    train(2, None, None, "--resume", run, "--epochs", e + 1)
    assert [r["epoch"] for r in _metrics(run)] == list(range(1, e + 2))
    assert ".g3-train.lock" not in {x.name for x in run.iterdir()}


def test_stop_signal_during_start_up_stops_after_the_first_epoch(parts, tmp_path):
    """SIGUSR1 to a rank still starting up (here: stalled after loading its part, as under a loaded batch
    system) is a stop request like any other: the run stops after epoch 1 with its checkpoint, status 75.
    Before, MPICH's own SIGUSR1 handler (installed by MPI_Init) swallowed it until g3-train installed its
    handlers before training: the run went on (under srun with timeout(1), until the SIGKILL 60 s later)."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "5", *FAST]

    def send(proc):
        time.sleep(0.2)   # rank 1 is loading its part or stalled after it: still starting up
        os.kill(int((pids / "rank-1.pid").read_text()), signal.SIGUSR1)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids), "G3_TEST_STALL": "1:startup:4"}, send,
                           ready=(pids / "rank-1.pid").exists)
    assert proc.returncode == 75, err
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by SIGUSR1 on 1 of 2 ranks after epoch 1 of 5" in err, err


def test_stop_signal_while_importing_torch(parts, tmp_path):
    """SIGUSR1 to every rank while it imports torch (most of a rank's start-up, seconds under load; here each rank
    sends it to itself as the import begins) stops the run after epoch 1 with its checkpoint, status 75, the line
    naming the signal. Before, g3-train installed its handlers after that import: MPICH's SIGUSR1 handler swallowed
    the request and the run went on (a rank that had its handlers already and one that had not yet made the line
    say "a stop signal on 1 rank(s)", which test_slurm's G3_TIMEOUT test did not expect)."""
    run = tmp_path / "run"
    p = run_mpi(2, "tests.mpi_stop_at_import", *FAST, "--parts", parts / "p2", "--out", run, "--epochs", "5",
                check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by SIGUSR1 after epoch 1 of 5" in p.stderr, p.stderr


def test_time_limit_stops_with_a_checkpoint(parts, tmp_path):
    """--time-limit S: the run stops at the first epoch end after S seconds as on a stop signal (checkpoint, exit
    75 on every rank, the line naming the limit), and the limit is not saved for a resumed run."""
    run = tmp_path / "run"
    p = train(2, parts / "p2", run, "--epochs", "100000", "--time-limit", "2", check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert f"g3-train: stopped by the time limit (--time-limit 2) after epoch {e} of 100000" in p.stderr, p.stderr
    assert "time_limit = 0.0" in (run / "config.toml").read_text()
    train(2, None, None, "--resume", run, "--epochs", e + 1)


def test_time_limit_passed_on_one_rank_only(parts, tmp_path):
    """The limit is timed by each rank's own clock: when it has passed on one rank only at an epoch end, every
    rank stops there, and the line still names the time limit (it said "a stop signal on 1 rank(s)")."""
    run = tmp_path / "run"
    p = run_mpi(2, "tests.mpi_time_limit", *FAST, "--parts", parts / "p2", "--out", run, "--epochs", "50",
                "--time-limit", "1000", check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by the time limit (--time-limit 1000) after epoch 1 of 50" in p.stderr, p.stderr


# -- faults during training -------------------------------------------------------------------------------------
@pytest.mark.parametrize("P", [1, 2, 3])
def test_watchdog_text_messages_between_ranks(P):
    """The start-up's and the outputs' control messages (an error text or None) arrive as sent on every rank,
    with and without a deadline, and never through pickle (tests/mpi_watchdog.py refuses it)."""
    p = run_mpi(P, "tests.mpi_watchdog", timeout=120)
    assert f"WATCHDOG TEXT OK {P}" in p.stdout, p.stdout + p.stderr


def test_watchdog_names_stalled_neighbour(parts, tmp_path):
    run = tmp_path / "run"
    p = train(3, parts / "p3", run, "--epochs", "8", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=150,
              env={"G3_TEST_STALL": "1:3:120"})
    t_end = time.time()
    assert p.returncode != 0
    lines = [x for r, v in error_lines(p.stderr).items() if r != 1 for x in v]
    assert lines, p.stderr
    msg = lines[0]
    assert "communication timeout" in msg and "waiting for rank 1" in msg and "forward direction" in msg, msg
    assert "layer 'gcn0'" in msg and "epoch 3" in msg, msg
    # the job ended long before the stalled rank woke up: within the timeout plus a few seconds after epoch 2
    assert [r["epoch"] for r in _metrics(run)] == [1, 2]
    assert t_end - (run / "metrics.jsonl").stat().st_mtime < 30


def test_watchdog_names_the_rank_it_receives_from(tmp_path):
    """Three parts joined by a cycle of one-way edges: rank r receives only from rank r + 1 and sends only to rank
    r - 1 (mod 3). Rank 1 stalls in epoch 3: a rank that times out names the rank whose message it waits for, not
    the one it sends to. (A mutation run found this untested: naming the rank at the same position of the send
    list passed every test, since in the tests' other graphs every rank sends to the ranks it receives from.)"""
    from data_tools.build import write_partition
    from g3mpi.format import Graph
    from tests.graphs import csr_from_edges
    n = 30
    ring = np.arange(n)
    nxt = ring // 10 * 10 + (ring + 1) % 10           # a ring inside each part of 10 nodes, both directions
    src = np.concatenate([ring, nxt, [10, 20, 0]])     # 10 -> 0: part 0 receives from part 1, and so on
    dst = np.concatenate([nxt, ring, [0, 10, 20]])
    indptr, indices = csr_from_edges(src, dst, n)
    x = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    g = Graph(indptr, indices, x, ring % 2, ring % 3 == 0, ring % 3 == 1, ring % 3 == 2,
              dict(num_classes=2, source="one-way cycle"))
    write_partition(g, ring // 10, 3, tmp_path / "parts", method="random", seed=0)
    p = train(3, tmp_path / "parts", tmp_path / "run", "--epochs", "8", "--comm-timeout", COMM_TIMEOUT,
              check=False, timeout=150, env={"G3_TEST_STALL": "1:3:120"})
    assert p.returncode != 0
    lines = {r: v for r, v in error_lines(p.stderr).items() if r != 1}
    assert lines, p.stderr
    for r, v in lines.items():
        assert "communication timeout" in v[0] and f"waiting for rank {(r + 1) % 3} in" in v[0], v[0]


def test_watchdog_covers_startup_checks(parts, tmp_path):
    """A rank stalled before the start-up halo check (before the first epoch) ends the job after --comm-timeout,
    one line per waiting rank naming the check; the other ranks once blocked in its Alltoall until it woke up."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    p = train(3, parts / "p3", run, "--epochs", "4", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=120,
              env={"G3_TEST_STALL": "1:startup:300", "G3_TEST_PIDFILE": str(pids)})
    t_end = time.time()
    assert p.returncode != 0
    lines = [x for r, v in error_lines(p.stderr).items() if r != 1 for x in v]
    assert lines, p.stderr
    for msg in lines:
        assert "communication timeout: blocked" in msg and f"--comm-timeout {COMM_TIMEOUT}" in msg, msg
        assert "in the start-up check 'halo lists'" in msg, msg
    assert not run.exists()   # it ended before the run directory was made
    # within the timeout plus a few seconds of the ranks' start (each wrote its pid when it began loading)
    assert t_end - max(f.stat().st_mtime for f in pids.iterdir()) < 30


def test_watchdog_covers_predictions_turns(parts, tmp_path):
    """A rank stalled before its turn writing predictions.h5 ends the job after --comm-timeout: the rank after it
    names it, rank 0 (waiting for the file back from the last rank) names the last rank; of the outputs only the
    checkpoint of the finished training is written."""
    run = tmp_path / "run"
    p = train(3, parts / "p3", run, "--epochs", "2", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=120,
              env={"G3_TEST_STALL": "1:predictions:300"})
    t_end = time.time()
    assert p.returncode != 0
    lines = {r: v for r, v in error_lines(p.stderr).items() if r != 1}
    assert lines, p.stderr
    waits = {0: "waiting for rank 2 in the ranks' turns writing predictions.h5 (rank 2 writes last",
             2: "waiting for rank 1 in the ranks' turns writing predictions.h5 (rank 1 writes before rank 2)"}
    for r, v in lines.items():
        assert len(v) == 1 and "communication timeout: blocked" in v[0], p.stderr
        assert waits[r] in v[0] and "after epoch 2" in v[0], v[0]
    # (and rank 0's temporary .predictions.h5.tmp, which a --resume removes)
    written = sorted(f.name for f in run.iterdir() if f.name[0] != ".")
    assert written == ["checkpoint.pt", "config.toml", "metrics.jsonl"], written
    assert t_end - (run / "checkpoint.pt").stat().st_mtime < 30


def test_watchdog_allows_slow_turns_writing_predictions(parts, tmp_path):
    """Every rank's turn writing predictions.h5 takes 0.6 x --comm-timeout (3.6 s under 6): the run succeeds. A
    rank's wait spans the turns before its own (rank 2: 7.2 s here), so the deadline is the timeout per turn waited
    for (the reviewer's finding: the whole wait was held to one timeout and every such run ended without its
    outputs)."""
    run = tmp_path / "run"
    train(3, parts / "p3", run, "--epochs", "2", "--comm-timeout", COMM_TIMEOUT, timeout=120,
          env={"G3_TEST_STALL": f"*:predictions:{0.6 * COMM_TIMEOUT:g}"})
    assert (run / "summary.json").exists() and (run / "predictions.h5").exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_one_rank_then_resume(parts, tmp_path):
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p3"),
           "--out", str(run), "--epochs", "100000", "--checkpoint-every", "2", *FAST]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**tool_env(), "G3_TEST_PIDFILE": str(pids)})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run / "checkpoint.pt").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert (run / "checkpoint.pt").exists()
        time.sleep(1.0)  # well inside later epochs
        rank_pids = [int((pids / f"rank-{r}.pid").read_text()) for r in range(3)]
        t_kill = time.monotonic()
        os.kill(rank_pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert waited < 30, waited
    t0 = time.monotonic()
    while any(_alive(p) for p in rank_pids) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert not any(_alive(p) for p in rank_pids), "orphan rank processes"
    # the last checkpoint is intact and the run continues from it, taking over the lock file the killed one left
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    e = ckpt["epoch"]
    assert e >= 2 and e % 2 == 0
    assert (run / ".g3-train.lock").read_text() == f"{rank_pids[0]} {socket.gethostname()}\n"
    train(3, None, None, "--resume", run, "--epochs", str(e + 2))
    assert [r["epoch"] for r in _metrics(run)] == list(range(1, e + 3))
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == e + 2
    assert not (run / ".g3-train.lock").exists()


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
    assert [r["epoch"] for r in _metrics(run)] == [1, 2, 3, 4]
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
