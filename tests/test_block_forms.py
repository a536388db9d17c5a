"""The forms ``DistGraph.blocks`` stores: a mean as a pattern of shared ones and a row scaling
(``BlockMatrix.row_scale``), the other weights as they are; the weights they make equal the definitions, computed
here from the graph's own edge list; only a mean over a node's repeated self loops keeps weights. A symmetric local
block is its own transpose."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.graphs import csr_from_edges, partition, random_graph


def _with_one_loop_on_some(g):
    """``g`` with one self loop on every third node."""
    n = g.num_nodes
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    loops = np.arange(0, n, 3)
    indptr, indices = csr_from_edges(np.concatenate([g.indices, loops]), np.concatenate([dst, loops]), n)
    return dataclasses.replace(g, indptr=indptr, indices=indices)


@pytest.fixture(scope="module", params=["simple", "one-loop-on-some", "loops-and-duplicates"])
def one_rank(request, tmp_path_factory):
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    from g3mpi.format import read_meta, read_part
    from g3mpi.ops import DistGraph
    g = random_graph(n=120, multi=request.param == "loops-and-duplicates", seed=4)
    if request.param == "one-loop-on-some":
        g = _with_one_loop_on_some(g)
    out = tmp_path_factory.mktemp("scal") / "parts"
    partition(g, 1, out)
    part = read_part(out, 0, read_meta(out))
    ctx = CommContext(MPI.COMM_SELF)
    yield g, part, DistGraph(part, ctx)
    ctx.free()


def _reference(g, kind: str) -> np.ndarray:
    """Dense [n, n] weights in original node order, float64, from the edge list (j -> i at [i, j])."""
    n = g.num_nodes
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    src = np.asarray(g.indices, np.int64)
    loop = src == dst
    deg = np.bincount(dst[~loop], minlength=n).astype(np.float64)    # in-degree without self loops
    loops = np.bincount(dst[loop], minlength=n).astype(np.float64)
    a = np.zeros((n, n))
    if kind == "mean":      # over the file's edges, loops and duplicates included
        np.add.at(a, (dst, src), 1.0)
        return a / np.maximum(deg + loops, 1)[:, None]
    np.add.at(a, (dst[~loop], src[~loop]), 1.0)
    if kind.endswith("+loops") or kind in ("gcn", "gat"):
        a += np.eye(n)
        deg = deg + 1
    if kind.startswith("gcn"):
        dinv = np.where(deg > 0, 1 / np.sqrt(np.maximum(deg, 1)), 0.0)
        return dinv[:, None] * a * dinv[None, :]
    if kind.startswith("avg"):
        return a / np.maximum(deg, 1)[:, None]
    return a    # sum, gat: the pattern


@pytest.mark.parametrize("kind", ["gcn", "mean", "gat", "sum", "sum+loops", "avg", "avg+loops", "gcn-noloops"])
def test_pattern_and_scalings_make_the_weights(one_rank, kind):
    g, part, graph = one_rank
    bm = graph.blocks(kind)
    n = graph.num_owned
    eye = torch.eye(n)
    dense = bm.scale_out(bm.local.to_dense() @ eye).double().numpy()
    ids = np.asarray(part.orig_ids)
    ref = _reference(g, kind)[np.ix_(ids, ids)]
    np.testing.assert_allclose(dense, ref, rtol=1e-6, atol=1e-7)
    # the transpose the backward multiplies is the same pattern
    assert torch.equal(bm.local_t.to_dense(), bm.local.to_dense().t())
    keeps_weights = kind in ("gcn", "gcn-noloops") or kind == "mean" and int(np.asarray(part.self_loops).max()) > 1
    assert bm.unit is not keeps_weights
    if bm.unit:     # one array of ones behind every torch form
        v = bm.local.values()
        assert bool((v == 1).all())
        assert v.untyped_storage().data_ptr() == bm.local_t.values().untyped_storage().data_ptr()


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("weights", ["unit", "symmetric-weights"])
def test_a_symmetric_local_block_is_its_own_transpose(symmetric, weights):
    """The local block and the row groups' sub-blocks share their transposes exactly where the local block equals
    its transpose; every transpose equals the dense one either way."""
    import scipy.sparse as sp

    from g3mpi.ops.blocks import BlockMatrix, row_groups
    rng = np.random.default_rng(7)
    n, h, nb = 200, 40, 70
    s, d = rng.integers(0, n, 900), rng.integers(0, n, 900)
    keep = s != d
    s, d = s[keep], d[keep]
    if symmetric:
        s, d = np.concatenate([s, d]), np.concatenate([d, s])
    hs, hd = n + rng.integers(0, h, 150), rng.integers(0, n, 150)     # halo sources: never part of the local block
    m = sp.csr_matrix((np.ones(len(s) + 150), (np.concatenate([d, hd]), np.concatenate([s, hs]))), shape=(n, n + h))
    m.sum_duplicates()
    m.sort_indices()
    deg = np.asarray(m.sum(axis=1)).ravel() + 1
    rows = np.repeat(np.arange(n), np.diff(m.indptr))
    dinv = np.concatenate([deg, np.full(h, 3.0)]) ** -0.5
    vals = None if weights == "unit" else (dinv[rows] * dinv[m.indices]).astype(np.float32)
    diag = np.ones(n, np.float32) if weights == "unit" else (dinv[:n] ** 2).astype(np.float32)
    bm = BlockMatrix(m.indptr, m.indices.astype(np.int32), n, np.array([0, 25, h]), nb, vals, diag)
    assert (bm.local_t is bm.local) is symmetric
    np.testing.assert_array_equal(bm.local_t.to_dense().numpy(), bm.local.to_dense().numpy().T)
    B, I = row_groups(bm)
    for grp in (B, I):
        for k in range(2):
            np.testing.assert_array_equal(grp.local_t[k].to_dense().numpy(), grp.local[k].to_dense().numpy().T)
    assert (B.local_t[1] is I.local[0]) is symmetric and (I.local_t[1] is I.local[1]) is symmetric


def test_held_bytes_count_the_forms_as_built(one_rank):
    """``held_bytes`` (g3-bench's theoretical matrices) against the distinct storages of the built torch forms."""
    _, _, graph = one_rank
    for kind in ("gcn", "mean"):
        bm = graph.blocks(kind)
        storages = {}
        for t in (bm.local, bm.local_t, *(m for nb in bm.neighbours for m in (nb.mat, nb.mat_t))):
            for x in (t.crow_indices(), t.col_indices(), t.values()):
                storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
        held = sum(storages.values()) + (0 if bm.row_scale is None else bm.row_scale.numel() * 4)
        assert held <= bm.held_bytes() <= 1.05 * held, (kind, held, bm.held_bytes())


@pytest.mark.parametrize("unit", [False, True])
def test_pieces_compute_each_row_whole_once_its_last_piece_landed(unit):
    """A neighbour block split by message pieces computes each row, whole, when the last piece it reads has
    landed (rows of the pieces after it are never read: NaN there changes nothing), every row exactly once, and
    the result is the whole block's product bit for bit, whatever the pieces; its transposes are row ranges of the
    block's transpose. A pattern's groups share its ones."""
    import scipy.sparse as sp

    from g3mpi.ops.blocks import _transpose, _torch, block_pieces, spmm
    rng = np.random.default_rng(11)
    r, c, e = 500, 300, 1200
    m = sp.csr_matrix((rng.random(e).astype(np.float32), (rng.integers(0, r, e), rng.integers(0, c, e))),
                      shape=(r, c))
    m.sort_indices()
    ones = torch.ones(m.nnz)
    as_unit = (lambda k: ones[:k]) if unit else None
    if unit:
        m.data[:] = 1
    mat, mat_t = _torch(m, as_unit), _transpose(m, as_unit)
    rows = torch.from_numpy(rng.permutation(2 * r)[:r])     # the block's output rows
    h = torch.randn(c, 5)
    whole = torch.zeros(2 * r, 5).index_add_(0, rows, spmm(mat, h))
    block_row = np.zeros(2 * r, np.int64)
    block_row[rows.numpy()] = np.arange(r)
    for bounds in (np.array([0, 7, 8, 120, 120, 300]), np.array([0, 300])):   # a one-column piece, an empty one
        fwd, bwd = block_pieces(mat, mat_t, bounds, rows, as_unit)
        assert len(bwd) == len(bounds) - 1 and sorted(fwd.rows.tolist()) == sorted(rows.tolist())
        acc, done = None, 0
        for k in range(len(bounds) - 1):
            landed = h.clone()
            landed[bounds[k + 1]:] = float("nan")
            acc = fwd.product(acc, k, landed)
            g = fwd.groups[k]
            if g is not None:
                a, b, pm = g
                assert a == done and pm.shape[0] == b - a
                sub = m[block_row[fwd.rows[a:b].numpy()]]
                assert sub.nnz == 0 or sub.indices.max() < bounds[k + 1]     # rows complete at piece k
                np.testing.assert_array_equal(pm.to_dense().numpy(), sub.toarray())
                if unit and pm._nnz():
                    assert pm.values().untyped_storage().data_ptr() == ones.untyped_storage().data_ptr()
                done = b
            np.testing.assert_array_equal(bwd[k].to_dense().numpy(), m[:, bounds[k]:bounds[k + 1]].T.toarray())
        assert done == r
        got = torch.zeros(2 * r, 5).index_add_(0, fwd.rows, acc)
        assert torch.equal(got, whole)
