"""Multi-head edge-weighted aggregation as sparse products: the attention-weighted sum of GAT.

For one block of a rank's aggregation (CSR ``crow`` [r+1], ``col`` [e]: edge k goes from source ``col[k]`` to
destination row ``dst_k``) and H heads,

    out[i, h, :] = sum_{k: dst_k = i} w[k, h] x[col[k], h, :]          w [e, H], x [c, H, C] -> out [r, H, C]

Message passing (PyG's ``GATConv``) gathers ``x[col]`` per edge, scales and scatters it back: a [e, H, C]
tensor written, read and saved for backward, and the same again in backward. Here the block's pattern is
expanded once into a [r*H, c*H] CSR pattern whose row ``i*H + h`` holds the edges of row i with columns
``col[k]*H + h``. With x viewed as [c*H, C]:

    forward          out  = A_w @ x                      (CSR SpMM, values w in pattern order)
    grad of x        gx   = A_w^T @ g                    (SpMM with the transposed pattern)
    grad of w        gw[k, h] = <g[dst_k, h], x[col[k], h]>   (SDDMM: ``torch.sparse.sampled_addmm``)

The two SpMMs are the runtime's one sparse product, ``g3mpi.ops.blocks.spmm`` (written in place, no
zero-filled result).

Nothing of size e*H*C is made. Per call only the e*H values are gathered into pattern order. The pattern
costs about 16 bytes per edge and head (int32 columns and value permutations when they fit), built once.
"""
from __future__ import annotations

import numpy as np
import torch

from g3mpi.ops.blocks import spmm, torch_csr


def _expand(crow: np.ndarray, col: np.ndarray, order: np.ndarray, n_rows: int, H: int, idx_dtype):
    """Head-expanded CSR of the pattern whose row i lists the edges ``order[crow[i]:crow[i+1]]`` with columns
    ``col``: (crow [n_rows*H + 1], col [e*H], perm [e*H] into a row-major [e, H] value array, or None for H = 1)."""
    deg = np.diff(crow)
    if H == 1:
        return (torch.from_numpy(crow.astype(idx_dtype)), torch.from_numpy(col[order].astype(idx_dtype)),
                None if np.array_equal(order, np.arange(len(order))) else torch.from_numpy(order.astype(idx_dtype)))
    h = np.arange(H, dtype=np.int64)
    # row i*H + h starts at crow[i]*H + h*deg[i]; the k-th entry of row i (edge order[crow[i] + k]) is at +k
    starts = (crow[:-1, None] * H + h[None, :] * deg[:, None]).reshape(-1)
    crow_x = np.empty(n_rows * H + 1, dtype=np.int64)
    crow_x[:-1] = starts
    crow_x[-1] = len(order) * H
    row = np.repeat(np.arange(n_rows, dtype=np.int64), deg)            # row of each position of ``order``
    pos0 = crow[:-1][row] * (H - 1) + np.arange(len(order), dtype=np.int64)   # position of head 0's entry
    step = deg[row]
    del row
    src_flat = order * H
    col_flat = col[order] * H
    perm = np.empty(len(order) * H, dtype=idx_dtype)
    col_x = np.empty(len(order) * H, dtype=idx_dtype)
    for k in range(H):   # head by head: temporaries of e entries, not e x H
        perm[pos0] = src_flat + k
        col_x[pos0] = col_flat + k
        pos0 += step
    return torch.from_numpy(crow_x.astype(idx_dtype)), torch.from_numpy(col_x), torch.from_numpy(perm)


class HeadPattern:
    """The head-expanded pattern of one CSR block and its transpose, built once (see the module docstring).

    ``crow``/``col``: the block's CSR (torch or numpy, sorted columns per row), ``num_cols``: its width,
    ``heads``: H."""

    def __init__(self, crow, col, num_cols: int, heads: int):
        crow = np.asarray(crow, dtype=np.int64)
        col = np.asarray(col, dtype=np.int64)
        self.rows, self.cols, self.H, self.nnz = len(crow) - 1, int(num_cols), int(heads), len(col)
        H = self.H
        fits = max(self.rows, self.cols) * H < 2 ** 31 and self.nnz * H < 2 ** 31
        idx = np.int32 if fits else np.int64
        self.crow, self.col, self.perm = _expand(crow, col, np.arange(self.nnz, dtype=np.int64), self.rows, H, idx)
        # transpose: row j lists the edges with source j (stable: in destination order)
        dst = np.repeat(np.arange(self.rows, dtype=np.int64), np.diff(crow))
        by_src = np.argsort(col, kind="stable")
        crow_t = np.zeros(self.cols + 1, dtype=np.int64)
        np.cumsum(np.bincount(col, minlength=self.cols), out=crow_t[1:])
        # columns of the transposed pattern are destinations: dst[order] for the entries in ``order``
        self.crow_t, self.col_t, self.perm_t = _expand(crow_t, dst, by_src, self.cols, H, idx)

    @property
    def shape(self) -> tuple:
        return (self.rows * self.H, self.cols * self.H)

    def edge_range(self, a: int, b: int) -> tuple[int, int]:
        """The edges of rows [a, b): a range, as the block's CSR orders them."""
        H = self.H
        return int(self.crow[a * H]) // H, int(self.crow[b * H]) // H

    def row_slice(self, a: int, b: int) -> "HeadPattern":
        """The pattern of rows [a, b) alone (views of this one's arrays; no transpose): ``matrix`` and ``sddmm``
        take the weights of those rows' edges (:meth:`edge_range`)."""
        H = self.H
        lo, hi = int(self.crow[a * H]), int(self.crow[b * H])
        sub = object.__new__(HeadPattern)
        sub.rows, sub.cols, sub.H, sub.nnz = b - a, self.cols, H, (hi - lo) // H
        sub.crow = self.crow[a * H:b * H + 1] - lo
        sub.col = self.col[lo:hi]
        sub.perm = None if self.perm is None else self.perm[lo:hi] - lo
        sub.crow_t = sub.col_t = sub.perm_t = None
        return sub

    def _values(self, w: torch.Tensor, perm) -> torch.Tensor:
        flat = w.reshape(-1)
        return flat if perm is None else flat.index_select(0, perm)

    def matrix(self, w: torch.Tensor) -> torch.Tensor:
        """A_w [r*H, c*H]: the pattern with the weights w [e, H]."""
        return torch_csr(self.crow, self.col, self._values(w, self.perm), self.shape)

    def matrix_t(self, w: torch.Tensor) -> torch.Tensor:
        """A_w^T [c*H, r*H]."""
        return torch_csr(self.crow_t, self.col_t, self._values(w, self.perm_t), self.shape[::-1])

    def sddmm(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """[e, H]: <g[dst_k, h], x[col[k], h]> for every edge k and head h (g [r*H, C], x [c*H, C]), float32
        (torch's SDDMM has no bfloat16: bfloat16 rows are widened first)."""
        g, x = g.float(), x.float()
        if self.nnz * self.H > self.shape[0] * self.shape[1]:
            # more entries than the block has cells (duplicate edges in a small block, e.g. one boundary row
            # and one halo row joined by a repeated edge): torch's sampled_addmm fails on such a pattern
            # ("torch.copy_: only sparse compressed tensors with the same number of specified elements"), and
            # the dense product is the smaller one anyway
            rows = torch.repeat_interleave(torch.arange(self.shape[0]), torch.diff(self.crow.long()))
            vals = (g @ x.t())[rows, self.col.long()]
        else:
            zero = torch_csr(self.crow, self.col, torch.zeros(self.nnz * self.H, dtype=g.dtype), self.shape)
            vals = torch.sparse.sampled_addmm(zero, g, x.t(), beta=0.0).values()
        if self.perm is None:
            return vals.view(self.nnz, self.H)
        return torch.empty_like(vals).index_copy_(0, self.perm.long(), vals).view(self.nnz, self.H)


class _HeadSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, x, pat: HeadPattern, scaled):
        C = x.shape[-1]
        x2 = x.detach().reshape(pat.cols * pat.H, C).contiguous()
        w = w.detach().contiguous()
        ctx.pat = pat
        ctx.save_for_backward(w, x2)
        if scaled is not None:
            num, scale = scaled
            if num.dtype != scale.dtype:    # (bf16-mixed: a bfloat16 result, no float32 copy of it)
                return torch.mul(num, scale.unsqueeze(-1), out=torch.empty_like(num))
            return num * scale.unsqueeze(-1)
        return spmm(pat.matrix(w.to(x2.dtype)), x2).view(pat.rows, pat.H, C)

    @staticmethod
    def backward(ctx, g):
        w, x2 = ctx.saved_tensors
        pat = ctx.pat
        C = x2.shape[1]
        g2 = g.reshape(pat.rows * pat.H, C).contiguous()
        gw = pat.sddmm(g2, x2) if ctx.needs_input_grad[0] else None
        gx = spmm(pat.matrix_t(w.to(g2.dtype)), g2).view(pat.cols, pat.H, C) if ctx.needs_input_grad[1] else None
        return gw, gx, None, None


def head_spmm(pat: HeadPattern, w: torch.Tensor, x: torch.Tensor, scaled=None) -> torch.Tensor:
    """out [r, H, C] with out[i, h] = sum over the edges k into row i of w[k, h] x[col[k], h] (differentiable in
    w [e, H], float32, and x [c, H, C], float32 or bfloat16: the result has x's type).

    ``scaled = (num [r, H, C], scale [r, H])``: the product was computed before, as ``num`` with the weights
    ``w[k, h] / scale[dst_k, h]`` (GAT's numerators, made while messages travel, before the softmax's
    denominators are known): the result is ``num * scale`` (no sparse product runs), and autograd sees the
    product of ``w`` and ``x``."""
    if w.shape != (pat.nnz, pat.H) or x.dim() != 3 or x.shape[:2] != (pat.cols, pat.H):
        raise ValueError(f"head_spmm: w {tuple(w.shape)} and x {tuple(x.shape)} do not match the pattern "
                         f"({pat.nnz} edges, {pat.H} heads, {pat.cols} source rows)")
    if pat.nnz == 0:
        return x.new_zeros(pat.rows, pat.H, x.shape[2])
    return _HeadSpMM.apply(w, x, pat, scaled)
