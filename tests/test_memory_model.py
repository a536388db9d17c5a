"""What a training rank and a partition writer hold, against docs/RUNTIME.md's memory model: the forms that cut
their bytes (int32 CSR indices, edge weights not kept, bool dropout masks, compact writer rows) compute exactly
what the wider forms did, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from data_tools.parallel_build import compact
from g3mpi.ops import DropoutKey, keep_mask, node_dropout
from g3mpi.ops.blocks import BlockMatrix, csr_index_dtype, spmm, to_torch_csr, torch_csr
from g3mpi.ops.heads import HeadPattern
from g3mpi.train.memory import head_pattern_split, rank_memory


def _random_csr(n: int, m: int, nnz: int, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    a = sp.csr_matrix((rng.standard_normal(nnz).astype(np.float32), (rng.integers(0, n, nnz),
                                                                     rng.integers(0, m, nnz))), shape=(n, m))
    a.sort_indices()
    return a


def test_int32_csr_product_equals_int64_bit_for_bit():
    a = _random_csr(3000, 2500, 40_000)
    t = to_torch_csr(a)
    assert t.crow_indices().dtype == t.col_indices().dtype == torch.int32
    wide = torch_csr(torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64)),
                     torch.from_numpy(a.data), a.shape)
    for width in (1, 7, 16, 33):
        x = torch.randn(2500, width)
        assert torch.equal(spmm(t, x).view(torch.int32), spmm(wide, x).view(torch.int32))
    assert csr_index_dtype(2 ** 31 - 1, (10, 10)) is np.int32
    assert csr_index_dtype(2 ** 31, (10, 10)) is np.int64 and csr_index_dtype(5, (2 ** 31, 1)) is np.int64


def test_blocks_with_weights_from_a_function_keep_none_and_equal_given_weights():
    n, h = 400, 100
    a = _random_csr(n, n + h, 5000, seed=1)
    a.data[:] = 1.0
    a.sum_duplicates()
    ro = np.array([0, 60, h], dtype=np.int64)
    w = np.random.default_rng(2).random(a.nnz).astype(np.float32)
    diag = np.full(n, 0.5, dtype=np.float32)
    calls = []

    def weights(indptr, indices):
        assert indptr is not None and len(indices) == a.nnz
        calls.append(1)
        return w.copy()
    given = BlockMatrix(a.indptr, a.indices, n, ro, 120, w, diag)
    lazy = BlockMatrix(a.indptr, a.indices, n, ro, 120, weights, diag)
    x = torch.randn(n, 8)
    assert torch.equal(spmm(lazy.local, x), spmm(given.local, x))
    assert torch.equal(spmm(lazy.local_t, x), spmm(given.local_t, x))
    for nb, nb0 in zip(lazy.neighbours, given.neighbours):
        assert torch.equal(nb.mat.values(), nb0.mat.values()) and torch.equal(nb.mat_t.values(), nb0.mat_t.values())
    assert calls and lazy._values is weights      # the function kept, never an array of the weights


def test_node_dropout_keeps_a_bool_mask_and_equals_the_float_product():
    key = DropoutKey(seed=5, epoch=3)
    n, f, p = 70_000, 12, 0.4                       # more rows than one block of the mask (MASK_ROWS)
    ids = torch.arange(10 ** 9, 10 ** 9 + n)
    base = torch.randn(n, f, requires_grad=True)
    x = base * 1.0
    saved = []

    def pack(t):
        saved.append((t.dtype, tuple(t.shape)))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = node_dropout(x, key, 1, ids, p, training=True)
    assert (torch.bool, (n, f)) in saved and (torch.float32, (n, f)) not in saved, saved
    ref_x = base.detach().clone().requires_grad_(True)
    ref = ref_x * keep_mask(key, 1, 0, ids, f, p)
    assert torch.equal(y.detach().view(torch.int32), ref.detach().view(torch.int32))
    g = torch.randn(n, f)
    y.backward(g)
    ref.backward(g)
    assert torch.equal(base.grad.view(torch.int32), ref_x.grad.view(torch.int32))
    raw = torch.randn(n, f)                         # an input without gradient: nothing saved at all
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = node_dropout(raw, key, 0, ids, p, training=True)
    assert not saved and torch.equal(out, raw * keep_mask(key, 0, 0, ids, f, p))


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_model_matrices_term_counts_int32_indices_and_the_row_pointers(model, symmetric):
    """The ``matrices`` term against the bytes of the blocks a rank builds (local block with self loops, its
    transpose, the neighbour blocks and theirs, each storage once): the model counts the row pointers as 2n + h,
    GCN's weights in each block and transpose, GAT's pattern's shared ones as one per entry (an upper bound), and
    nothing for the transpose of a symmetric local block."""
    n, h, e = 3000, 800, 30_000
    a = _random_csr(n, n + h, e, seed=3)
    if symmetric:   # the local columns mirrored: a symmetric local block, the halo columns as they were
        loc = a[:, :n]
        loc = ((loc + loc.T) > 0).astype(np.float32).tocsr()
        a = sp.hstack([loc, a[:, n:]]).tocsr()
        a.sort_indices()
    ro = np.array([0, 300, h], dtype=np.int64)
    e = a.nnz
    cut = int(np.count_nonzero(a.indices >= n))
    if model == "gcn":
        w = np.random.default_rng(4).random(e).astype(np.float32)
        if symmetric:   # symmetric weights: a function of both ends that does not depend on their order
            r = np.repeat(np.arange(n), np.diff(a.indptr))
            w = (1.0 / (1.0 + r + a.indices)).astype(np.float32)
        bm = BlockMatrix(a.indptr, a.indices, n, ro, 500, w, np.full(n, 0.5, dtype=np.float32))
    else:
        bm = BlockMatrix(a.indptr, a.indices, n, ro, 500, None, np.ones(n, dtype=np.float32))
    assert (bm.local_t is bm.local) is symmetric
    storages = {}
    for t in (bm.local, bm.local_t, *(m for nb in bm.neighbours for m in (nb.mat, nb.mat_t))):
        assert t.col_indices().dtype == torch.int32
        for x in (t.crow_indices(), t.col_indices(), t.values()):
            storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes()
    held = sum(storages.values())
    model_b = rank_memory(model, owned=n, halo=h, send=0, edges=e, cut_edges=cut, symmetric=symmetric,
                          feature_dim=4, hidden=4, num_classes=2, heads=1)["matrices"]
    if model == "gat":  # the shared ones as long as the largest block: the model's one per entry bounds them
        # (the head-expanded patterns are counted apart: test_model_head_patterns_term)
        model_b -= sum(head_pattern_split(owned=n, halo=h, edges=e, heads=1).values())
        values = bm.local.values()
        assert values.untyped_storage().data_ptr() == bm.neighbours[0].mat_t.values().untyped_storage().data_ptr()
        assert held <= model_b <= 1.10 * held, (model_b, held)
    else:
        assert 0.97 * held <= model_b <= 1.03 * held, (model_b, held)


@pytest.mark.parametrize("heads", [1, 8])
def test_model_head_patterns_term(heads):
    """GAT's head-expanded patterns (``HeadPattern`` of the local block and of each neighbour block, as
    ``DistGraph.head_patterns`` builds them) against the model's term: every entry's columns and permutations at
    int32, the row pointers of the local pattern, its transpose and the neighbours' transposes; the neighbours'
    own row pointers (receiving rows) are left out of the model, so it may fall short by at most their size."""
    n, h, e = 3000, 800, 30_000
    a = _random_csr(n, n + h, e, seed=5)
    ro = np.array([0, 300, h], dtype=np.int64)
    bm = BlockMatrix(a.indptr, a.indices, n, ro, 500, None, np.ones(n, dtype=np.float32))
    pats = [HeadPattern(bm.local.crow_indices(), bm.local.col_indices(), n, heads)]
    pats += [HeadPattern(nb.mat.crow_indices(), nb.mat.col_indices(), nb.mat.shape[1], heads) for nb in bm.neighbours]
    held, left_out = 0, 0
    for i, p in enumerate(pats):
        for name in ("crow", "col", "perm", "crow_t", "col_t", "perm_t"):
            t = getattr(p, name)
            if t is not None:
                assert t.dtype == torch.int32
                held += t.numel() * t.element_size()
        if i:
            left_out += p.crow.numel() * 4
    entries = sum(p.nnz for p in pats)
    model_b = sum(head_pattern_split(owned=n, halo=h, edges=entries - n, heads=heads).values())
    assert held - left_out - 4 * len(pats) * 2 <= model_b <= held, (model_b, held, left_out)


def test_writer_rows_are_compact_where_they_fit():
    assert compact(2 ** 31 - 1) is np.int32 and compact(2 ** 31) is np.int64
