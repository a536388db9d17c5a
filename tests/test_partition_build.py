"""data_tools.build, the partition writer: parts from an assignment (blocked, streamed or whole features, any
index type), their statistics, boundary-first rows, durability."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.partition_graphs import expected_edges, graph_from_edges, partition, random_graph, write
from data_tools import build
from data_tools.build import write_partition
from data_tools.partitioners import partition_stats
from data_tools.partitioners.cost import out_edges
from data_tools.partitioners.metis import strip_self_loops
from g3mpi.format import load_graph, part_name, read_meta, read_part
from g3mpi.format.partition import ARRAYS, SCALARS

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_small_features_written_with_each_part", "test_streamed_features_equal_in_memory")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stats_match_written_parts(seed, tmp_path):
    """The cost model's vectorised statistics equal what the builder writes into the part files."""
    g = random_graph(n=200, m=900, seed=seed)
    P = 5
    a = np.random.default_rng(seed).integers(0, P, g.num_nodes)
    a[:P] = np.arange(P)
    meta = write_partition(g, a, P, tmp_path / "x", method="random", seed=seed)
    indptr, indices, _ = strip_self_loops(g.indptr, g.indices.astype(np.int64))
    s = partition_stats(*out_edges(indptr, indices), a, P)
    for k in ("owned", "local_edges", "halo", "send", "cut_edges", "neighbors"):
        assert list(s[k]) == [st[k] for st in meta["parts"]], k


@pytest.mark.parametrize("seed", [0, 1])
def test_blocked_build_equals_unblocked(seed, monkeypatch):
    """Parts built a few edges at a time (rows split into blocks of 1 or 5 edges) equal parts built in one block,
    array by array, on a multigraph with self loops, duplicate edges, isolated nodes and an empty part."""
    g = random_graph(n=120, m=800, seed=20 + seed)
    rng = np.random.default_rng(seed)
    dup = rng.integers(0, g.num_edges, 60)        # duplicate 60 edges
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    g = graph_from_edges(np.concatenate([g.indices, g.indices[dup]]), np.concatenate([dst, dst[dup]]), g.features,
                         g.labels, (g.train_mask, g.val_mask, g.test_mask), source="dup")
    P = 6
    a = rng.choice([0, 1, 2, 4, 5], g.num_nodes)   # part 3 stays empty

    def parts(block):
        monkeypatch.setattr(build, "BLOCK_EDGES", block)
        return [(pd, n2o.copy(), off.copy()) for pd, n2o, off in build.build_parts(g, a, P, "id")]

    whole = parts(10**9)
    assert whole[3][0].num_owned == 0 and whole[0][0].num_edges == len(expected_edges(g)[0])
    for block in (1, 5):
        for (x, n2o_x, off_x), (y, n2o_y, off_y) in zip(whole, parts(block)):
            assert np.array_equal(n2o_x, n2o_y) and np.array_equal(off_x, off_y)
            for k in ARRAYS:
                u, v = getattr(x, k), getattr(y, k)
                assert u.dtype == v.dtype and np.array_equal(u, v), (block, x.part_id, k)
            assert all(getattr(x, k) == getattr(y, k) for k in SCALARS)


def test_threaded_and_symmetric_build_equal_the_plain_one(cora_npz):
    """Parts built by 3 threads, and the boundary-first keys of a symmetric graph taken along its rows, equal
    the one-thread build and the keys of the scattered edges, array by array."""
    import dataclasses
    from data_tools.layout import graph_order_keys
    from tests.partition_graphs import cora_graph
    g = cora_graph(cora_npz)
    P = 5
    a = np.random.default_rng(4).integers(0, P, g.num_nodes)
    blocks = build.row_blocks(np.diff(g.indptr), 2000)
    assert len(blocks) > 3
    assert np.array_equal(graph_order_keys(g.indptr, g.indices, a, P, blocks, symmetric=True),
                          graph_order_keys(g.indptr, g.indices, a, P, blocks))
    plain = list(build.build_parts(dataclasses.replace(g, attrs=dict(g.attrs, symmetric=False)), a, P, "id"))
    for (x, n2o_x, _), (y, n2o_y, _) in zip(plain, build.build_parts(g, a, P, "id", threads=3)):
        assert np.array_equal(n2o_x, n2o_y)
        for k in ARRAYS:
            u, v = getattr(x, k), getattr(y, k)
            assert u.dtype == v.dtype and np.array_equal(u, v), (x.part_id, k)


def test_streamed_features_equal_in_memory(monkeypatch, tmp_path):
    """g3-partition leaves the features in the graph file and copies them into the parts block by block, a
    group of parts per pass: every dataset, checksum and chunk layout equals the parts written from a graph held
    whole (blocks of 7 rows, groups of 2 parts here; 5 parts, one of them empty)."""
    g = random_graph(n=150, m=600, seed=4, feature_dim=6)
    write(g, tmp_path / "g.h5")
    a = np.random.default_rng(1).choice([0, 1, 3, 4], g.num_nodes)
    whole = write_partition(g, a, 5, tmp_path / "whole", method="random", seed=0)
    monkeypatch.setattr(build, "FEATURE_BLOCK_BYTES", 7 * 4 * 6)
    monkeypatch.setattr(build, "FEATURE_GROUP", 2)
    lean = load_graph(tmp_path / "g.h5", features=False)
    assert lean.features is None
    streamed = write_partition(lean, a, 5, tmp_path / "streamed", method="random", seed=0, graph_path=tmp_path / "g.h5")
    assert whole["offsets"] == streamed["offsets"] and list(whole["files"]) == list(streamed["files"])
    for p in range(5):
        with h5py.File(tmp_path / "whole" / part_name(p)) as fa, h5py.File(tmp_path / "streamed" / part_name(p)) as fb:
            assert sorted(fa) == sorted(fb)
            for k in fa:
                assert fa[k].dtype == fb[k].dtype and fa[k].chunks == fb[k].chunks, (p, k)
                assert np.array_equal(fa[k][()], fb[k][()]) and fa[k].attrs["sha256"] == fb[k].attrs["sha256"], (p, k)
    for p in range(5):   # the runtime's own checks (file checksums from meta.json included) accept them
        read_part(tmp_path / "streamed", p, read_meta(tmp_path / "streamed"))
    with pytest.raises(ValueError, match="graph_path"):
        write_partition(lean, a, 5, tmp_path / "nofeatures", method="random", seed=0)


@pytest.mark.parametrize("block_rows", [7, None])
def test_features_too_large_for_float32_warned_once(monkeypatch, tmp_path, caplog, block_rows):
    """g3-partition said nothing of finite features beyond 2^64 (too large for float32 training; only g3-train's
    reader of the parts named them): now one warning names the graph, the count and the first node, also when the
    features are streamed in blocks of 7 rows, 2 parts per pass (checked on the first pass only), or read whole."""
    g = random_graph(n=150, m=600, seed=4, feature_dim=6)
    g.features[[20, 99, 140], [1, 5, 0]] = [-1e20, 2e30, 5e24]
    write(g, tmp_path / "g.h5")
    if block_rows:
        monkeypatch.setattr(build, "FEATURE_BLOCK_BYTES", block_rows * 4 * 6)
        monkeypatch.setattr(build, "FEATURE_GROUP", 2)
    caplog.clear()   # (the graph's writer warned too)
    with caplog.at_level("WARNING", logger="g3mpi.format"):
        partition(tmp_path / "g.h5", tmp_path / "p", 5, "random", inproc=True)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"{tmp_path / 'g.h5'}: the features of 3 node(s) reach 2e+30 in magnitude (the first: node 20), "
                    "beyond 2^64 = 1.8e19, whose square float32 cannot hold: float32 training on them is likely to "
                    "overflow (g3-train stops if the summed gradients pass 2^64); scale them, or replace such values "
                    "(a fill value for missing data?)"]


def test_small_features_written_with_each_part(monkeypatch, tmp_path):
    """Features that fit in one block of FEATURE_BLOCK_BYTES are read whole and written with each part, never
    streamed into the written parts afterwards (a second open and close of every part file); the parts equal, array by
    array and checksums included, those of the streamed write and of a graph held whole."""
    g = random_graph(n=150, m=600, seed=4, feature_dim=6)
    write(g, tmp_path / "g.h5")
    a = np.random.default_rng(1).choice([0, 1, 3, 4], g.num_nodes)
    lean = load_graph(tmp_path / "g.h5", features=False)
    with monkeypatch.context() as m:
        m.setattr(build, "FEATURE_BLOCK_BYTES", 7 * 4 * 6)
        streamed = write_partition(lean, a, 5, tmp_path / "streamed", method="random", seed=0,
                                   graph_path=tmp_path / "g.h5")

    def never(*args, **kw):
        raise AssertionError("features streamed")
    monkeypatch.setattr(build, "stream_features", never)
    monkeypatch.setattr(build, "FEATURE_BLOCK_BYTES", g.num_nodes * 4 * 6)   # exactly one block
    small = write_partition(lean, a, 5, tmp_path / "small", method="random", seed=0, graph_path=tmp_path / "g.h5")
    whole = write_partition(g, a, 5, tmp_path / "whole", method="random", seed=0)
    assert small["offsets"] == streamed["offsets"] == whole["offsets"]
    for p in range(5):
        x, y, z = (read_part(tmp_path / d, p, read_meta(tmp_path / d)) for d in ("small", "streamed", "whole"))
        for k in ARRAYS:
            assert all(getattr(x, k).dtype == getattr(o, k).dtype and np.array_equal(getattr(x, k), getattr(o, k))
                       for o in (y, z)), (p, k)
        with h5py.File(tmp_path / "small" / part_name(p)) as fa, h5py.File(tmp_path / "streamed" / part_name(p)) as fb:
            for k in fa:
                assert fa[k].chunks == fb[k].chunks and fa[k].attrs["sha256"] == fb[k].attrs["sha256"], (p, k)


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.uint32, np.uint64])
def test_build_with_narrow_or_unsigned_indices(dtype):
    """load_graph takes any integer dtype for the indices (it checks their range only): the parts are those of
    int32 indices. Before, uint8 sources with more than 256 rows counted row 256 + v's edges from v as self loops
    (the row IDs wrapped) and uint64 raised in np.bincount."""
    from g3mpi.format import Graph
    rng = np.random.default_rng(3)
    n = 300
    dst = np.sort(rng.integers(0, n, 1200))
    src = rng.integers(0, 120, 1200)
    src[:40] = dst[:40]                # real self loops
    src[-40:] = dst[-40:] - 256        # rows >= 256 whose wrapped uint8 ID is their source's
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    ref = random_graph(n=n, m=10, seed=1)

    def parts(indices):
        g = Graph(indptr, indices, ref.features, ref.labels, ref.train_mask, ref.val_mask, ref.test_mask, ref.attrs)
        return list(build.build_parts(g, np.arange(n) % 3, 3, "id"))
    for (x, _, _), (y, _, _) in zip(parts(src.astype(np.int32)), parts(src.astype(dtype))):
        for k in ARRAYS:
            u, v = getattr(x, k), getattr(y, k)
            assert u.dtype == v.dtype and np.array_equal(u, v), (dtype, x.part_id, k)


def test_streamed_part_files_are_fsynced_once_filled(monkeypatch, tmp_path):
    """write_part fsyncs a part file before its features are filled in; the filled file is fsynced too, with every
    file of the directory before its rename (before, the features of every part reached the disk whenever the OS
    chose, after the partition was in place)."""
    import os
    g = random_graph(n=60, m=200, seed=3)
    write(g, tmp_path / "g.h5")
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    lean = load_graph(tmp_path / "g.h5", features=False)
    write_partition(lean, np.arange(g.num_nodes) % 3, 3, tmp_path / "p", method="random", seed=0,
                    graph_path=tmp_path / "g.h5")
    assert all(part_name(p) in synced for p in range(3)), synced
    # and the whole directory: meta.json and node_map.h5, the directory itself and, after the rename, its parent
    for name in ("meta.json", "node_map.h5", tmp_path.name):
        assert name in synced, (name, synced)
    assert any(x.startswith(".p.") and x.endswith(".tmp") for x in synced), synced


def test_parts_are_boundary_first_with_contiguous_send_lists():
    """Owned rows 0 .. num_boundary-1 are exactly the send rows; with two neighbours each send list is one range
    of rows (here a ring in 3 segments, every part between two others, plus a few one-way chords), and the
    interior rows keep the original order."""
    n, P = 60, 3
    rng = np.random.default_rng(5)
    ring = np.arange(n)
    chords = rng.integers(0, n, (6, 2))
    src = np.concatenate([ring, (ring + 1) % n, chords[:, 0]])
    dst = np.concatenate([(ring + 1) % n, ring, chords[:, 1]])
    f = rng.random((n, 2)).astype(np.float32)
    y = np.arange(n) % 2
    masks = [np.arange(n) % 3 == k for k in range(3)]
    g = graph_from_edges(src, dst, f, y, masks, "ring")
    assignment = np.array([2, 0, 1])[np.arange(n) // (n // P)]     # ring segments, parts out of ring order
    for part, _, _ in build.build_parts(g, assignment, P, "b" * 32):
        rows = [part.send_list(i) for i in range(len(part.send_parts))]
        union = np.unique(np.concatenate(rows))
        assert np.array_equal(union, np.arange(part.num_boundary)), part.part_id
        assert len(rows) == 2 and all(np.array_equal(r, np.arange(r[0], r[-1] + 1)) for r in rows), part.part_id
        assert np.all(np.diff(part.orig_ids[part.num_boundary:]) > 0)
        assert part.num_boundary < part.num_owned


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sort_within_rows_and_localize_equal_the_plain_forms(seed):
    """The writer's kernels equal their plain NumPy forms: ``lexsort`` within rows, and ``unique`` +
    ``searchsorted`` for the halo, on rows with repeats, empty runs and columns on both sides of the part."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.integers(5, 60, 3000)).astype(np.int32)
    cols = rng.integers(0, 500, 3000).astype(np.int32)
    got = build.sort_within_rows(cols, rows)
    assert got.dtype == cols.dtype and np.array_equal(got, cols[np.lexsort((cols, rows))])
    assert len(build.sort_within_rows(cols[:0], rows[:0])) == 0
    for s, e, block in ((100, 250, None), (0, 40, 7), (480, 700, 1000), (600, 900, 3)):
        local, halo = build.localize(cols, s, e, block)
        want_halo = np.unique(cols[(cols < s) | (cols >= e)])
        inside = (cols >= s) & (cols < e)
        want = np.where(inside, cols - s, (e - s) + np.searchsorted(want_halo, cols))
        assert np.array_equal(halo, want_halo) and np.array_equal(local, want), (s, e)


def test_sorted_unique_and_merge_unique_equal_numpys():
    from g3mpi.sorting import merge_unique, sorted_unique
    rng = np.random.default_rng(3)
    for dtype in (np.int32, np.int64, np.uint8):
        x, y = rng.integers(0, 200, 1000).astype(dtype), rng.integers(100, 300, 500).astype(np.int64)
        assert np.array_equal(sorted_unique(x), np.unique(x)) and sorted_unique(x).dtype == x.dtype
        assert np.array_equal(merge_unique(np.unique(x).astype(np.int64), np.unique(y)), np.union1d(x, y))
    assert len(sorted_unique(np.zeros(0, dtype=np.int64))) == 0
    assert len(merge_unique(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))) == 0
