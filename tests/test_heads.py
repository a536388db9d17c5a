"""The multi-head weighted aggregation of GAT (``g3mpi.ops.heads``) against message passing: gather x[src] per
edge, scale, scatter-add, on random blocks (rectangular, empty rows and columns, 1-4 heads); whole tensors."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from g3mpi.ops.heads import HeadPattern, head_spmm


def _block(r, c, density, seed):
    m = sp.random(r, c, density=density, format="csr", random_state=seed)
    m.sort_indices()
    return m.indptr.astype(np.int64), m.indices.astype(np.int64)


def _reference(crow, col, w, x):
    dst = torch.from_numpy(np.repeat(np.arange(len(crow) - 1), np.diff(crow)))
    src = torch.from_numpy(col)
    out = torch.zeros(len(crow) - 1, x.shape[1], x.shape[2], dtype=x.dtype)
    return out.index_add(0, dst, w.unsqueeze(-1) * x.index_select(0, src))


@pytest.mark.parametrize("r,c,density,H,C", [(50, 70, 0.1, 3, 5), (40, 40, 0.02, 1, 8), (30, 90, 0.05, 4, 3),
                                             (1, 5, 1.0, 2, 4)])
def test_head_spmm_equals_message_passing(r, c, density, H, C):
    crow, col = _block(r, c, density, seed=r + H)
    _matches_message_passing(HeadPattern(torch.from_numpy(crow), torch.from_numpy(col), c, H), crow, col, c, H, C,
                             seed=1)


def _matches_message_passing(pat, crow, col, c, H, C, seed):
    """head_spmm on ``pat`` equals the per-edge reference, forward and both gradients."""
    g = torch.Generator().manual_seed(seed)
    w = torch.rand(len(col), H, generator=g, requires_grad=True)
    x = torch.randn(c, H, C, generator=g, requires_grad=True)
    w_ref = w.detach().clone().requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, ref = head_spmm(pat, w, x), _reference(crow, col, w_ref, x_ref)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


def test_head_spmm_gradcheck_and_strided_input():
    crow, col = _block(12, 9, 0.3, seed=3)
    pat = HeadPattern(crow, col, 9, 2)
    g = torch.Generator().manual_seed(2)
    w = torch.rand(len(col), 2, dtype=torch.float64, generator=g, requires_grad=True)
    x = torch.randn(9, 2, 3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w, x: head_spmm(pat, w, x), (w, x))
    # a strided view, as a received halo slice [rows, H*C + H] gives it
    payload = torch.randn(9, 2 * 3 + 2, generator=g)
    xs = payload[:, :6].reshape(9, 2, 3)
    assert not xs.is_contiguous()
    w32 = w.detach().float()
    torch.testing.assert_close(head_spmm(pat, w32, xs), _reference(crow, col, w32, xs.contiguous()))


def test_head_spmm_with_a_product_computed_before():
    """``scaled=(num, scale)``: the product of ``w / scale[dst]`` computed earlier, scaled per row, is returned as
    the product of ``w``, with head_spmm's gradients (GAT's numerators, made before the denominators are known)."""
    crow, col = _block(20, 15, 0.2, seed=5)
    pat = HeadPattern(crow, col, 15, 3)
    g = torch.Generator().manual_seed(5)
    w0 = torch.rand(len(col), 3, generator=g)
    scale = torch.rand(20, 3, generator=g) + 0.5
    x = torch.randn(15, 3, 4, generator=g)
    dst = torch.from_numpy(np.repeat(np.arange(20), np.diff(crow)))
    num = head_spmm(pat, w0, x)
    w, xs = (w0 * scale[dst]).requires_grad_(True), x.clone().requires_grad_(True)
    w_ref, x_ref = w.detach().clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, ref = head_spmm(pat, w, xs, scaled=(num, scale)), head_spmm(pat, w_ref, x_ref)
    assert torch.equal(out, num * scale.unsqueeze(-1))
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    grad = torch.randn(out.shape, generator=g)
    out.backward(grad)
    ref.backward(grad)
    assert torch.equal(w.grad, w_ref.grad) and torch.equal(xs.grad, x_ref.grad)


def test_head_spmm_rejects_mismatched_shapes():
    crow, col = _block(5, 6, 0.5, seed=4)
    pat = HeadPattern(crow, col, 6, 2)
    with pytest.raises(ValueError, match="do not match the pattern"):
        head_spmm(pat, torch.rand(len(col), 3), torch.rand(6, 2, 4))
    with pytest.raises(ValueError, match="do not match the pattern"):
        head_spmm(pat, torch.rand(len(col), 2), torch.rand(7, 2, 4))


@pytest.mark.parametrize("H", [1, 2])
def test_head_spmm_duplicate_edges_filling_a_small_block(H):
    """A block with more edges than cells (a repeated edge between one boundary row and one halo row, as a
    multigraph's partition can give): torch's sampled_addmm refuses such a pattern, so the weights' gradient
    is computed otherwise, and equals message passing."""
    for crow, col, c in [(np.array([0, 2]), np.array([0, 0]), 1), (np.array([0, 3, 5]), np.array([0, 0, 1, 1, 1]), 2)]:
        _matches_message_passing(HeadPattern(crow, col, c, H), crow, col, c, H, 3, seed=4)
