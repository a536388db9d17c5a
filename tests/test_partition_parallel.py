"""g3-partition --method stream under mpiexec: every rank reads a slice, the ranks write the parts in parallel.

The partition must be one that g3-inspect accepts, reassemble into the exact input graph, and hold the same part
files as the serial writer given the same assignment; bad input in one rank's slice stops every rank, naming the
file and the row, with nothing written.
"""
from __future__ import annotations

import json
import shutil
import time

import h5py
import numpy as np
import pytest

from tests.conftest import run_module, run_mpi
from tests.job_report import one_error
from tests.partition_graphs import assert_as_serial_writer, assignment_of, expected_edges, reassemble
from data_tools.build import write_partition
from data_tools.slices import SliceFeatures, read_slice
from g3mpi.mpi.collectives import rank_bounds
from g3mpi.format import FormatError, array_sha256, load_graph, read_meta, read_node_map, read_part
from g3mpi.format.partition import ARRAYS, SCALARS

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_blocked_passes_match_the_direct_construction", "test_deterministic_for_seed_and_ranks",
              "test_nan_feature_row_in_one_ranks_rows", "test_node_imbalance_and_order_options",
              "test_out_of_range_index_in_one_ranks_rows", "test_output_refused_on_every_rank",
              "test_parallel_partition_valid_exact_and_as_serial",
              "test_without_mpiexec_and_too_many_parts")


def stream(R, graph, out, P, *extra, check=True):
    return run_mpi(R, "data_tools.partition", graph, "--parts", P, "--method", "stream", "--out", out,
                   "--no-progress", *extra, check=check, timeout=120)


@pytest.mark.parametrize("R,P", [(1, 4), (2, 4), (3, 4), (4, 4), (3, 8)])
def test_parallel_partition_valid_exact_and_as_serial(R, P, rand_h5, tmp_path):
    g, path = rand_h5
    out = tmp_path / "parts"
    p = stream(R, path, out, P)
    assert "peak RSS per rank (MiB): partition stage" in p.stderr
    rss = p.stderr.split("partition stage ")[1].split(";")[0].split()
    assert len(rss) == R and all(float(x) > 0 for x in rss)
    run_module("data_tools.inspection", out)        # g3-inspect accepts it (exit 0)
    src, dst, feats, labels, masks = reassemble(out)
    want_src, want_dst = expected_edges(g)
    assert np.array_equal(src, want_src) and np.array_equal(dst, want_dst)
    assert np.array_equal(feats, g.features) and np.array_equal(labels, g.labels)
    for k, m in masks.items():
        assert np.array_equal(m, getattr(g, k)), k
    meta = read_meta(out)
    assert meta["method"] == "stream" and meta["ranks"] == R and meta["num_parts"] == P
    assert meta["quality"]["node_imbalance"] <= 1.10 + 1e-9
    assert len(meta["peak_rss_mib_partition"]) == R
    # the serial writer, given the same assignment, writes the same parts
    assert_as_serial_writer(path, out, tmp_path / "serial")


def test_deterministic_for_seed_and_ranks(rand_h5, tmp_path):
    _, path = rand_h5
    stream(3, path, tmp_path / "a", 5, "--seed", "7")
    stream(3, path, tmp_path / "b", 5, "--seed", "7")
    assert np.array_equal(assignment_of(tmp_path / "a"), assignment_of(tmp_path / "b"))


@pytest.mark.parametrize("order", ["natural", "random"])
def test_node_imbalance_and_order_options(order, rand_h5, tmp_path):
    _, path = rand_h5
    stream(2, path, tmp_path / "p", 4, "--node-imbalance", "1.02", "--stream-order", order)
    meta = read_meta(tmp_path / "p")
    assert meta["quality"]["node_imbalance"] <= 1.02 + 1e-9 and meta["stream_order"] == order
    run_module("data_tools.inspection", tmp_path / "p")


@pytest.fixture(scope="module")
def rmat_h5(tmp_path_factory):
    """A skewed directed graph (R-MAT 12, edge factor 16): node-balanced parts differ several-fold in edges."""
    path = tmp_path_factory.mktemp("rmat") / "rmat.h5"
    run_module("data_tools.prepare", "rmat", "--scale", "12", "--edge-factor", "16", "--feature-dim", "4",
               "--out", path)
    return path


@pytest.mark.parametrize("R,P,limit", [(1, 4, 1.10), (4, 2, 1.10), (3, 8, 1.05), (4, 8, 1.10)])
def test_edges_and_nodes_balanced_on_a_skewed_graph(R, P, limit, rmat_h5, tmp_path):
    """Each part's local edges (the in-edges of its nodes: training's memory and aggregation work) and its nodes
    stay within the caps; node-balanced METIS's parts of the same graph are far apart in edges."""
    out = tmp_path / "p"
    stream(R, rmat_h5, out, P, "--node-imbalance", limit, "--edge-imbalance", limit)
    meta = read_meta(out)
    edges = np.array([p["local_edges"] for p in meta["parts"]])
    owned = np.array([p["owned"] for p in meta["parts"]])
    assert edges.max() <= max(np.ceil(edges.sum() / P), np.floor(limit * edges.sum() / P))
    assert owned.max() <= max(np.ceil(owned.sum() / P), np.floor(limit * owned.sum() / P))
    assert meta["quality"]["compute_imbalance"] <= limit + 1e-9 and meta["stream_edge_cap"] <= limit * edges.mean()
    run_module("data_tools.inspection", out)
    run_module("data_tools.partition", rmat_h5, "--parts", P, "--method", "metis", "--out", tmp_path / "metis",
               "--no-progress")
    assert read_meta(tmp_path / "metis")["quality"]["compute_imbalance"] > 1.5


def damaged(src, dst, edit):
    """A copy of the graph ``src`` with ``edit(h5py.File)`` applied and the edited datasets' checksums renewed (so
    that the content checks, not the checksum, must find the damage)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        for name in edit(f):
            f[name].attrs["sha256"] = array_sha256(f[name][()])
    return dst


def rows_of_rank(n, R, r):
    b = rank_bounds(n, R)
    return int(b[r]), int(b[r + 1])


def assert_stopped(p, out, ranks, message):
    """The job failed with one line, rank 0's, naming ``ranks`` and saying ``message``; nothing written."""
    assert p.returncode != 0
    assert message in one_error(p.stderr, "g3-partition", ranks), p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))


def test_out_of_range_index_in_one_ranks_rows(rand_h5, tmp_path):
    g, path = rand_h5
    R = 4
    lo, hi = rows_of_rank(g.num_nodes, R, 2)
    row = next(v for v in range(lo, hi) if g.indptr[v + 1] > g.indptr[v])

    def edit(f):
        ind = f["indices"][()]
        ind[g.indptr[row + 1] - 1] = g.num_nodes + 5    # the row's last source: the row stays sorted
        f["indices"][...] = ind
        return ["indices"]
    bad = damaged(path, tmp_path / "bad.h5", edit)
    out = tmp_path / "parts"
    t = time.time()
    p = stream(R, bad, out, 4, check=False)
    assert time.time() - t < 60
    assert_stopped(p, out, "rank 2", f"{bad}: graph CSR: row {row} has source {g.num_nodes + 5} out of range")


def test_nan_feature_row_in_one_ranks_rows(rand_h5, tmp_path):
    g, path = rand_h5
    R = 3
    lo, hi = rows_of_rank(g.num_nodes, R, 2)
    row = (lo + hi) // 2

    def edit(f):
        x = f["features"][()]
        x[row, 1] = np.nan
        f["features"][...] = x
        return ["features"]
    bad = damaged(path, tmp_path / "nan.h5", edit)
    out = tmp_path / "parts"
    p = stream(R, bad, out, 8, check=False)
    assert_stopped(p, out, "rank 2", f"{bad}: features of node {row} are not finite")


def test_unsorted_row_named_by_its_graph_row(rand_h5, tmp_path):
    g, path = rand_h5
    lo, hi = rows_of_rank(g.num_nodes, 2, 1)
    row = next(v for v in range(lo, hi) if g.indptr[v + 1] - g.indptr[v] >= 2)

    def edit(f):
        ind = f["indices"][()]
        a = g.indptr[row]
        ind[a], ind[a + 1] = ind[a + 1], ind[a]
        f["indices"][...] = ind
        return ["indices"]
    bad = damaged(path, tmp_path / "unsorted.h5", edit)
    with pytest.raises(FormatError, match=f"sources of row {row} are not in ascending order"):
        read_slice(bad, rank_bounds(g.num_nodes, 2), 1, verify=False)


def test_output_refused_on_every_rank(rand_h5, tmp_path):
    _, path = rand_h5
    out = tmp_path / "mine"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    p = stream(2, path, out, 2, check=False)
    assert p.returncode != 0 and (out / "keep.txt").exists()
    assert "mine" in one_error(p.stderr, "g3-partition", "rank 0")
    assert json.dumps(sorted(x.name for x in out.iterdir())) == '["keep.txt"]'


def test_without_mpiexec_and_too_many_parts(rand_h5, tmp_path):
    """Started without mpiexec it is one rank (MPI's singleton start); --parts above N is refused on every rank."""
    g, path = rand_h5
    run_module("data_tools.partition", path, "--parts", 3, "--method", "stream", "--out", tmp_path / "one",
               "--no-progress")
    run_module("data_tools.inspection", tmp_path / "one")
    p = stream(2, path, tmp_path / "many", g.num_nodes + 1, check=False)
    assert p.returncode != 0
    assert f"cannot split {g.num_nodes} nodes" in one_error(p.stderr, "g3-partition", "ranks 0-1")
    assert not (tmp_path / "many").exists()


@pytest.mark.parametrize("R", [1, 3])
def test_blocked_passes_match_the_direct_construction(R, rand_h5, tmp_path):
    _, path = rand_h5
    run_mpi(R, "tests.mpi_stream_blocks", path, tmp_path, timeout=120)


def test_slice_features_read_on_demand_equal_the_slice(rand_h5):
    g, path = rand_h5
    bounds = rank_bounds(g.num_nodes, 3)
    held, lazy = read_slice(path, bounds, 1), read_slice(path, bounds, 1, features=False)
    assert lazy.features is None
    idx = np.random.default_rng(0).permutation(held.num_rows)[: max(1, held.num_rows // 2)]
    for sl in (held, lazy):
        with SliceFeatures(sl) as feats:
            got = feats.rows(idx)
            assert got.dtype == np.float32 and np.array_equal(got, held.features[idx])
            assert feats.rows(idx[:0]).shape == (0, held.features.shape[1])
