"""g3-prepare ogb on OGB's binary layout (raw/data.npz, raw/node-label.npz, as ogbn-papers100M ships): small
datasets written here, stored and deflated, imported, and compared with the same graph given as CSV raw files."""
from __future__ import annotations

import gzip

import numpy as np
import pytest

from g3mpi.format import load_graph
from tests.conftest import run_module
from tests.prepare_runs import fails, out_dir  # noqa: F401 (out_dir: a fixture)

SLOW_TESTS = ("test_binary_cli_equals_csv", "test_binary_errors")


def write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(f"{line}\n" for line in lines))


def arrays(n=40, f=3, c=4, m=120, seed=0, feat_dtype=np.float16):
    rng = np.random.default_rng(seed)
    e = rng.integers(0, n, size=(2, m))
    x = rng.standard_normal((n, f)).astype(feat_dtype)
    y = rng.integers(0, c, n).astype(np.float64)
    y[[3, 7, 11]] = np.nan                                # unlabelled, as in ogbn-papers100M
    labelled = rng.permutation(np.flatnonzero(~np.isnan(y)))
    split = dict(train=labelled[:20], valid=labelled[20:27], test=labelled[27:])
    return e, x, y, split


def write_split(root, split, scheme="time"):
    for name, idx in split.items():
        write_gz(root / "split" / scheme / f"{name}.csv.gz", [str(i) for i in idx])


def make_binary(root, e, x, y, split, compressed: bool, label_shape=(-1, 1)):
    """The OGB binary layout of (e, x, y, split): np.savez (members stored) or np.savez_compressed (deflated)."""
    save = np.savez_compressed if compressed else np.savez
    (root / "raw").mkdir(parents=True)
    save(root / "raw" / "data.npz", edge_index=e, node_feat=x, edge_feat=np.zeros((e.shape[1], 0)),
         num_nodes_list=np.array([len(x)]), num_edges_list=np.array([e.shape[1]]))
    save(root / "raw" / "node-label.npz", node_label=y.astype(np.float32).reshape(label_shape))
    write_split(root, split)
    return root


def make_csv(root, e, x, y, split):
    """The same graph in OGB's CSV layout (features written as the float32 values of the stored ones)."""
    write_gz(root / "raw" / "edge.csv.gz", [f"{u},{v}" for u, v in e.T])
    write_gz(root / "raw" / "num-node-list.csv.gz", [str(len(x))])
    write_gz(root / "raw" / "node-feat.csv.gz", [",".join(repr(float(v)) for v in row.astype(np.float32))
                                                 for row in x])
    write_gz(root / "raw" / "node-label.csv.gz", ["nan" if np.isnan(v) else str(int(v)) for v in y])
    write_split(root, split)
    return root


def same_graph(a, b):
    ga, gb = load_graph(a), load_graph(b)
    for k in ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(ga, k), getattr(gb, k), err_msg=k)
    for k in ("num_nodes", "num_edges", "feature_dim", "num_classes", "symmetric", "source"):
        assert ga.attrs[k] == gb.attrs[k], k


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("fortran", [False, True])
def test_binary_equals_csv_in_blocks(tmp_path, monkeypatch, compressed, fortran):
    """Blocks of 7 edges and 5 feature rows (several per pass, a partial last one), in memory and out of core."""
    from data_tools.importers import ogb_binary
    from data_tools.importers.common import PrepareOptions, write_raw_graph
    from data_tools.importers.ogb import load_ogb
    e, x, y, split = arrays()
    if fortran:
        e = np.asfortranarray(e)
    b = make_binary(tmp_path / "bin" / "ogbn_t", e, x, y, split, compressed)
    c = make_csv(tmp_path / "csv" / "ogbn_t", e, x, y, split)
    monkeypatch.setattr(ogb_binary, "EDGE_CHUNK", 7)
    monkeypatch.setattr(ogb_binary, "FEATURE_BLOCK_BYTES", 5 * 3 * 2)
    for opts in (PrepareOptions(quiet=True), PrepareOptions(quiet=True, memory_budget=12 * 48, symmetrize=True)):
        write_raw_graph(tmp_path / "b.h5", load_ogb(b, quiet=True), opts, work=tmp_path)
        write_raw_graph(tmp_path / "c.h5", load_ogb(c, quiet=True), opts, work=tmp_path)
        same_graph(tmp_path / "b.h5", tmp_path / "c.h5")
        (tmp_path / "b.h5").unlink()
        (tmp_path / "c.h5").unlink()


def test_binary_cli_equals_csv(tmp_path):
    e, x, y, split = arrays(feat_dtype=np.float32)
    b = make_binary(tmp_path / "bin" / "ogbn_t", e, x, y, split, compressed=True, label_shape=(-1,))
    c = make_csv(tmp_path / "csv" / "ogbn_t", e, x, y, split)
    for root, out in ((b, "b.h5"), (c, "c.h5")):
        run_module("data_tools.prepare", "ogb", root, "--split", "time", "--out", tmp_path / out, "--quiet")
    same_graph(tmp_path / "b.h5", tmp_path / "c.h5")
    assert load_graph(tmp_path / "b.h5").attrs["source"] == "ogb:ogbn_t,split=time"


def test_binary_errors(tmp_path, out_dir):
    e, x, y, split = arrays()
    bad_e = e.copy()
    bad_e[1, 5] = 40
    root = make_binary(tmp_path / "a", bad_e, x, y, split, compressed=True)
    data = root / "raw" / "data.npz"
    fails(out_dir, "ogb", root, path=data, words=["edge_index column 5: target node ID 40 out of range [0, 40)"])
    bad_x = x.copy()
    bad_x[9, 2] = np.nan
    root = make_binary(tmp_path / "b", e, bad_x, y, split, compressed=False)
    fails(out_dir, "ogb", root, path=root / "raw" / "data.npz", words=["node_feat row 9", "column 2: nan"])
    bad_y = y.copy()
    bad_y[4] = 1.5
    root = make_binary(tmp_path / "c", e, x, bad_y, split, compressed=False)
    fails(out_dir, "ogb", root, path=root / "raw" / "node-label.npz",
          words=["node_label entry 4: label 1.5 is not an integer"])
    root = make_binary(tmp_path / "d", e, x, y, split, compressed=False, label_shape=(-1, 2))
    fails(out_dir, "ogb", root, path=root / "raw" / "node-label.npz", words=["2 label columns", "multi-label"])
    root = make_binary(tmp_path / "f", e, x, y, split, compressed=False)
    data = root / "raw" / "data.npz"
    data.write_bytes(data.read_bytes()[:-500])            # the archive cut inside node_feat
    fails(out_dir, "ogb", root, path=data, words=["truncated or corrupt"])
    root = make_binary(tmp_path / "g", e, x, y, split, compressed=True)
    np.savez(root / "raw" / "data.npz", edge_index=e, node_feat=x, num_nodes_list=np.array([40, 2]))
    fails(out_dir, "ogb", root, path=root / "raw" / "data.npz", words=["one graph's node count"])


def flip_in_member(archive, member: str, at: int) -> None:
    """Flip one bit of byte ``at`` of the data of stored ``member`` (past its .npy header), in place."""
    import zipfile
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo(member + ".npy")
        with zf.open(info) as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            header = f.tell()
    raw = bytearray(archive.read_bytes())
    name_len, extra_len = np.frombuffer(bytes(raw[info.header_offset + 26:info.header_offset + 30]), "<u2")
    raw[info.header_offset + 30 + int(name_len) + int(extra_len) + header + at] ^= 1
    archive.write_bytes(bytes(raw))


@pytest.mark.parametrize("member", ["edge_index", "node_feat", "num_nodes_list"])
def test_binary_flipped_byte_refused(tmp_path, monkeypatch, member):
    """One flipped bit in any array of a stored archive (read in blocks, in two ranges for edge_index) is a
    FormatError naming the archive and the member (zipfile checks a member it reads to its end: a small one
    within its first 4 KiB read-ahead, a deflated one at its last block)."""
    from data_tools.importers import ogb_binary
    from data_tools.importers.common import PrepareOptions, write_raw_graph
    from data_tools.importers.ogb import load_ogb
    from g3mpi.format import FormatError
    monkeypatch.setattr(ogb_binary, "EDGE_CHUNK", 7)
    e, x, y, split = arrays(n=2000, m=3000)
    root = make_binary(tmp_path / "s", e, x, y, split, compressed=False)
    flip_in_member(root / "raw" / "data.npz", member, at=0)   # v ^ 1: still a valid ID
    with pytest.raises(FormatError, match=rf"data\.npz: array '{member}'.*CRC-32"):
        write_raw_graph(tmp_path / "g.h5", load_ogb(root, quiet=True), PrepareOptions(quiet=True), work=tmp_path)
    assert not (tmp_path / "g.h5").exists()


def test_crc32_combine():
    import zlib
    from data_tools.importers.npzmember import crc32_combine
    a, b = b"abc" * 1000, bytes(range(256)) * 5000
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
