"""METIS and random partitioning (data_tools.partitioners.metis): symmetrize, objectives, empty parts, C output."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_module
from tests.partition_graphs import partition, random_graph
from data_tools.partitioners import metis_partition, partition_stats, random_partition
from data_tools.partitioners.cost import out_edges
from data_tools.partitioners.metis import strip_self_loops

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_metis_warnings_kept_out_of_stdout",)


def test_library_functions_balanced():
    g = random_graph(n=400, m=2000, seed=5)
    indptr, indices, _ = strip_self_loops(g.indptr, g.indices.astype(np.int64))
    a, _ = random_partition(g.num_nodes, 7, seed=1)
    assert np.bincount(a).max() - np.bincount(a).min() <= 1
    m, info = metis_partition(indptr, indices, 4, balance="edges", seed=0)
    assert m.shape == (g.num_nodes,) and m.min() >= 0 and m.max() < 4 and info["balance"] == "edges"


def test_symmetrize_against_dense():
    """symmetrize gives both directions of every edge once, sorted, without self loops, whatever the duplicates
    (an edge repeated 256 times, a self loop repeated) and directions."""
    from data_tools.partitioners import symmetrize
    rng = np.random.default_rng(3)
    n = 60
    src = np.concatenate([rng.integers(0, n, 400), np.full(256, 5), np.full(3, 7)])
    dst = np.concatenate([rng.integers(0, n, 400), np.full(256, 9), np.full(3, 7)])
    order = np.lexsort((src, dst))
    src, dst = src[order], dst[order]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    sptr, sidx = symmetrize(indptr, src)
    dense = np.zeros((n, n), dtype=bool)
    dense[dst, src] = True
    dense |= dense.T
    np.fill_diagonal(dense, False)
    assert sptr.dtype == sidx.dtype == np.int64
    assert np.array_equal(np.diff(sptr), dense.sum(axis=1))
    for v in range(n):
        assert np.array_equal(sidx[sptr[v]:sptr[v + 1]], np.flatnonzero(dense[v]))
    assert 9 in sidx[sptr[5]:sptr[6]] and 5 in sidx[sptr[9]:sptr[10]]


def test_c_stdout_captured(capfd):
    """What C code prints to fd 1 inside the block is captured, not written to standard output; Python's own
    output around it is untouched."""
    import ctypes
    from data_tools.partitioners.metis import c_stdout_captured, summarise_messages
    libc = ctypes.CDLL(None)
    print("before", flush=True)
    with c_stdout_captured() as said:
        libc.printf(b"\t***Too many parts!\n")
        libc.printf(b"\t***Too many parts!\n")
        libc.printf(b"no newline")
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"
    assert summarise_messages(said[0]) == ["Too many parts! (2 times)", "no newline"]
    with c_stdout_captured() as said:
        pass
    assert said == []


def test_metis_warnings_kept_out_of_stdout(tmp_path):
    """METIS prints warnings with printf when P nears N (an R-MAT 9 graph into 256 edge-balanced parts): the
    command's standard output stays its own, the warnings are logged once each on stderr and kept in
    meta.json."""
    g = tmp_path / "r9.h5"
    run_module("data_tools.prepare", "rmat", "--scale", 9, "--out", g, "--quiet")
    p = partition(g, tmp_path / "parts", 256, "metis", "edges")
    assert "***" not in p.stdout and p.stdout.startswith("g3-partition: wrote"), p.stdout
    said = [line for line in p.stderr.splitlines() if "METIS said:" in line]
    assert said and any("too many parts" in line for line in said), p.stderr
    assert len(said) == len(set(said))
    meta = json.loads((tmp_path / "parts" / "meta.json").read_text())
    assert meta["metis_messages"] == [line.split("METIS said: ", 1)[1] for line in said]


@pytest.mark.parametrize("balance", ["nodes", "edges"])
def test_metis_volume_objective(balance):
    """METIS with the volume objective: on a symmetric graph the volume it reports is the total halo rows (= total
    send rows) of its assignment; it is k-way only; deterministic for a seed."""
    from data_tools.partitioners import symmetrize
    for seed in range(3):
        g = random_graph(n=500 + 40 * seed, m=3000, seed=40 + seed)
        indptr, indices, _ = strip_self_loops(g.indptr, g.indices.astype(np.int64))
        indptr, indices = symmetrize(indptr, indices)
        P = 3 + seed
        a, info = metis_partition(indptr, indices, P, balance=balance, seed=seed, objective="volume")
        b, _ = metis_partition(indptr, indices, P, balance=balance, seed=seed, objective="volume")
        assert np.array_equal(a, b) and info["metis_objective"] == "volume"
        s = partition_stats(*out_edges(indptr, indices), a, P)
        assert info["metis_volume"] == s["halo"].sum() == s["send"].sum()
        assert sorted(set(a.tolist())) == list(range(P))
    with pytest.raises(ValueError, match="k-way"):
        metis_partition(indptr, indices, 3, objective="volume", recursive=True)
    with pytest.raises(ValueError, match="objective"):
        metis_partition(indptr, indices, 3, objective="bogus")


def test_fill_empty_parts():
    from data_tools.partitioners.metis import fill_empty_parts
    a, k = fill_empty_parts(np.array([0, 0, 0, 2, 2]), 4, np.array([3, 1, 1, 5, 0]))
    assert k == 2 and a.tolist() == [0, 1, 3, 2, 2]   # part 1 takes node 1 (lowest degree, lowest ID) of part 0
    a, k = fill_empty_parts(np.array([1, 0]), 2, np.zeros(2))
    assert k == 0 and a.tolist() == [1, 0]
    with pytest.raises(ValueError):
        fill_empty_parts(np.array([0, 0]), 3, np.zeros(2))


def test_strip_self_loops_trusts_counted_loops():
    """Counted self loops: none means no pass over the edges (the same arrays back); else they are dropped."""
    ip, ix = np.array([0, 2, 3]), np.array([0, 1, 0])
    assert strip_self_loops(ip, ix, np.zeros(2, np.int64))[1] is ix
    stripped = strip_self_loops(ip, ix, np.array([1, 0]))
    assert stripped[1].tolist() == [1, 0] and stripped[2] == 1
