"""Blocks and chunks of one rank's aggregation matrix reproduce the whole product (serial, no MPI)."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from g3mpi.sched import BlockMatrix, chunk_rows_for


def make(n=50, halo=(7, 5), seed=0):
    rng = np.random.default_rng(seed)
    cols = n + sum(halo)
    a = sp.random(n, cols, density=0.15, random_state=seed, format="csr", dtype=np.float32)
    a.data[:] = rng.random(len(a.data)).astype(np.float32)
    a.sort_indices()
    recv_offsets = np.concatenate([[0], np.cumsum(halo)])
    boundary = np.sort(rng.choice(n, 12, replace=False))
    diag = rng.random(n).astype(np.float32)
    return a, recv_offsets, boundary, diag


def test_blocks_and_chunks_equal_whole_product():
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    h = torch.randn(a.shape[1], 4)
    want = torch.from_numpy((a @ h.numpy()) + diag[:, None] * h.numpy()[:n])
    for rows_per_chunk in (0, 1, 7, 13, 1000):
        out = torch.zeros(n, 4)
        chunks = bm.chunks(rows_per_chunk)
        seen = []
        for rows, mat in chunks:
            part = torch.sparse.mm(mat, h[:n])
            if rows is None:
                out += part
                seen.append(torch.arange(n))
            else:
                out.index_add_(0, rows, part)
                seen.append(rows)
        assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(n))
        if rows_per_chunk and rows_per_chunk < n:
            first = torch.cat(seen)[:len(boundary)]       # boundary rows come first
            assert set(first.tolist()) == set(boundary.tolist())
        for i, nb in enumerate(bm.neighbours):
            sl = h[n + ro[i]:n + ro[i + 1]]
            out.index_add_(0, nb.rows, torch.sparse.mm(nb.mat, sl))
        assert torch.allclose(out, want, rtol=1e-6, atol=1e-6), rows_per_chunk
    g = torch.randn(n, 4)
    full_t = torch.from_numpy(a.T @ g.numpy())
    for rows_per_chunk in (0, 9):
        gt = torch.zeros(n, 4)
        for s, e, mat in bm.transpose_chunks(rows_per_chunk):
            gt[s:e] = torch.sparse.mm(mat, g)
        assert torch.allclose(gt, full_t[:n] + torch.from_numpy(diag[:, None]) * g, rtol=1e-6, atol=1e-6)
    for i, nb in enumerate(bm.neighbours):
        part = torch.sparse.mm(nb.mat_t, g[nb.rows])
        assert torch.allclose(part, full_t[n + ro[i]:n + ro[i + 1]], rtol=1e-6, atol=1e-6)


def test_chunk_size_follows_width():
    assert chunk_rows_for(16, 0) > chunk_rows_for(256, 0) >= 64
    assert chunk_rows_for(16, 100) == 100


def test_row_groups_leave_blocks_unbuilt_and_chunks_share_storage():
    """The inter-layer pipeline's row groups come from the part's arrays: building them does not build the
    blocks' torch forms (a rank would hold the matrices twice); their row chunks are views, not copies. Each
    group's local block is split by columns (boundary rows', interior rows'), so a group's product takes the
    two row groups' inputs as they are, never merged."""
    from g3mpi.sched import row_groups
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    sizes = bm.sizes()
    B, I = row_groups(bm, [boundary])
    assert bm._torch is None
    assert torch.equal(B.rows, torch.from_numpy(boundary))
    h = torch.randn(a.shape[1], 3)
    hb, hi = h[:n][B.rows], h[:n][I.rows]
    want = (a @ h.numpy()) + diag[:, None] * h.numpy()[:n]
    for grp in (B, I):
        for rpc in (0, 4, 1000):
            out = torch.cat([torch.sparse.mm(mb, hb) + torch.sparse.mm(mi, hi) for _, _, mb, mi in grp.chunks(rpc)])
            for i, nb in enumerate(grp.nb):
                if nb is not None:
                    out.index_add_(0, nb[0], torch.sparse.mm(nb[1], h[n + ro[i]:n + ro[i + 1]]))
            assert np.allclose(out.numpy(), want[grp.rows.numpy()], rtol=1e-6, atol=1e-6)
        for j in range(2):
            base = grp.local[j].col_indices().untyped_storage().data_ptr()
            assert all(c[2 + j].col_indices().untyped_storage().data_ptr() == base for c in grp.chunks(4))
            base = grp.local_t[j].col_indices().untyped_storage().data_ptr()
            assert all(m.col_indices().untyped_storage().data_ptr() == base for _, _, m in grp.t_chunks(4)[j])
    # the transposes: grad of the owned rows = sum over both groups of local_t[j] @ (the group's output grad)
    g = torch.randn(n, 3)
    loc_t = (a[:, :n] + sp.diags(diag)).T.toarray() @ g.numpy()
    for j, grp_rows in enumerate((B.rows, I.rows)):
        for rpc in (0, 5):
            tb, ti = B.t_chunks(rpc)[j], I.t_chunks(rpc)[j]
            assert [c[:2] for c in tb] == [c[:2] for c in ti]
            got = torch.cat([torch.sparse.mm(mb, g[B.rows]) + torch.sparse.mm(mi, g[I.rows])
                             for (_, _, mb), (_, _, mi) in zip(tb, ti)])
            assert np.allclose(got.numpy(), loc_t[grp_rows.numpy()], rtol=1e-5, atol=1e-5)
    assert bm.sizes() == sizes
    assert sizes["nnz"] == bm.local._nnz() + sum(nb.mat._nnz() for nb in bm.neighbours)


def test_pipeline_local_product_forward_and_backward():
    """The pipeline's local product (g3mpi.ops.pipeline: boundary rows first, interior rows later by chunks,
    one backward for both) equals the dense product and its gradients, for any chunk size, with the
    progress callback run between chunks."""
    from g3mpi.ops.pipeline import _LocalB, _LocalI, _LocalProduct
    from g3mpi.sched import row_groups
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    B, I = row_groups(bm, [boundary])
    dense = torch.from_numpy((a[:, :n] + sp.diags(diag)).toarray())
    x = torch.randn(n, 5, dtype=torch.float32)
    gy = torch.randn(n, 5)
    want = dense @ x
    want_g = dense.T @ gy
    for rpc in (0, 1, 3, 1000):
        calls = []
        xb = x[B.rows].clone().requires_grad_()
        xi = x[I.rows].clone().requires_grad_()
        op = _LocalProduct(B, I, rpc, lambda: calls.append(1))
        ob, token = _LocalB.apply(xb, xi, op)
        oi = _LocalI.apply(token, op)
        assert torch.allclose(ob, want[B.rows], rtol=1e-5, atol=1e-6), rpc
        assert torch.allclose(oi, want[I.rows], rtol=1e-5, atol=1e-6), rpc
        forward_calls = len(calls)
        assert forward_calls == len(I.chunks(rpc))
        ((ob * gy[B.rows]).sum() + (oi * gy[I.rows]).sum()).backward()
        assert torch.allclose(xb.grad, want_g[B.rows], rtol=1e-5, atol=1e-5), rpc
        assert torch.allclose(xi.grad, want_g[I.rows], rtol=1e-5, atol=1e-5), rpc
        assert len(calls) - forward_calls == sum(len(c) for c in B.t_chunks(rpc))
