"""Blocks and chunks of one rank's aggregation matrix reproduce the whole product (serial, no MPI)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from g3mpi.sched import BlockMatrix, chunk_rows_for

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_pipeline_products_use_spmm",)


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
        for s, e, mat in bm.chunks(rows_per_chunk):
            out[s:e] = torch.sparse.mm(mat, h[:n])
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


@pytest.mark.parametrize("rows_per_chunk", [1, 7, 13, 49, 50, 1000])
def test_forward_chunks_are_row_ranges_written_in_place(monkeypatch, rows_per_chunk):
    """The local block's forward chunks are its contiguous row ranges, in order, sharing its indices and values
    (before: the boundary rows, then the interior rows, each chunk a CSR copy of its rows), and the chunked
    layer-by-layer forward writes each range's product into its rows of the output: bit for bit the unchunked
    output, with no ``index_copy_`` (before, every chunk's product was a fresh tensor copied in by row index:
    6-14 % of a chunked blocking epoch's CPU time on R-MAT scale 16, 2 ranks, 128 wide)."""
    from types import SimpleNamespace

    from g3mpi.sched import Schedule
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    F = 5
    h = torch.randn(n, F)
    halo = np.random.default_rng(2).random((int(ro[-1]), F)).astype(np.float32)
    plan = SimpleNamespace(recv_slice=lambda i: slice(int(ro[i]), int(ro[i + 1])), send_idx=[])
    ex = SimpleNamespace(forward=SimpleNamespace(num_recvs=len(ro) - 1), halo=halo, plan=plan)
    whole = Schedule("nocomm", chunk_rows=-1).spmm_forward(bm, ex, h)

    def refuse(*a, **k):
        raise AssertionError("index_copy_: a chunk's product copied into the output")
    monkeypatch.setattr(torch.Tensor, "index_copy_", refuse)
    out = Schedule("nocomm", chunk_rows=rows_per_chunk).spmm_forward(bm, ex, h)
    assert torch.equal(out, whole)
    chunks = bm.chunks(rows_per_chunk)
    k = min(rows_per_chunk, n)
    assert [(s, e) for s, e, _ in chunks] == [(s, min(s + k, n)) for s in range(0, n, k)]
    base = bm.local.col_indices().untyped_storage().data_ptr()
    assert all(m.col_indices().untyped_storage().data_ptr() == base for _, _, m in chunks)


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


def _csr(m: sp.csr_matrix, dtype, index_dtype) -> torch.Tensor:
    from g3mpi.sched.blocks import torch_csr
    return torch_csr(torch.from_numpy(m.indptr.astype(np.int64)).to(index_dtype),
                     torch.from_numpy(m.indices.astype(np.int64)).to(index_dtype),
                     torch.from_numpy(m.data).to(dtype), m.shape)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_spmm_equals_sparse_mm_bit_for_bit_and_ignores_out(dtype, index_dtype):
    """``spmm`` (the runtime's one sparse product, ``out.addmm_(mat, x, beta=0)``) gives torch.sparse.mm's
    values bit for bit, for the matrices blocks.py makes (a block, its precomputed transpose, row ranges of
    it) and for empty shapes (no rows, no columns, no entries, rows without entries, zero features); the
    contents of ``out`` are ignored (NaN does not propagate) and only its rows are written."""
    from g3mpi.sched.blocks import _split_rows, spmm
    a = sp.random(60, 45, density=0.05, random_state=3, format="csr", dtype=np.float64)
    assert (np.diff(a.indptr) == 0).any()                          # rows without entries
    mats = [_csr(a, dtype, index_dtype), _csr(a.T.tocsr(), dtype, index_dtype)]       # a block, its transpose
    mats += [m for mat in mats[:2] for _, _, m in _split_rows(mat, 16)]               # their row ranges
    for shape in [(0, 45), (60, 0), (0, 0)]:
        mats.append(_csr(sp.csr_matrix(shape, dtype=np.float64), dtype, index_dtype))
    mats.append(_csr(sp.csr_matrix((7, 5), dtype=np.float64), dtype, index_dtype))    # no entries
    for mat in mats:
        r, c = mat.shape
        for F in (0, 1, 3, 40):
            x = torch.randn(c, F, dtype=torch.float64).to(dtype)
            want = torch.sparse.mm(mat, x)
            got = spmm(mat, x)
            assert got.dtype == dtype and got.shape == (r, F)
            assert torch.equal(got, want), (tuple(mat.shape), F)
            big = torch.full((r + 5, F), float("nan"), dtype=dtype)
            view = big[2:2 + r]
            assert spmm(mat, x, view) is view
            assert torch.equal(big[2:2 + r], want), (tuple(mat.shape), F)
            assert big[:2].isnan().all() and big[2 + r:].isnan().all()
    x = torch.randn(45, 3, dtype=dtype)
    xt = torch.randn(3, 45, dtype=dtype).t()                        # a non-contiguous input
    assert torch.equal(spmm(mats[0], xt), torch.sparse.mm(mats[0], xt))
    assert torch.equal(spmm(mats[0], x), torch.sparse.mm(mats[0], x))


class _NoSparseMM:
    """Replaces torch.sparse.mm while a test runs: every sparse product of the runtime goes through ``spmm``."""

    def __init__(self, monkeypatch):
        def refuse(*a, **k):
            raise AssertionError("torch.sparse.mm called: the runtime's products go through blocks.spmm")
        monkeypatch.setattr(torch.sparse, "mm", refuse)


@pytest.mark.parametrize("chunk_rows", [-1, 7])
def test_schedule_products_use_spmm_and_overwrite_buffers(monkeypatch, chunk_rows):
    """The layer-by-layer schedule (``Schedule.spmm_forward`` / ``spmm_backward``, here ``nocomm`` on a serial
    stand-in exchange: no MPI) computes local @ h + sum_i N_i @ halo_i and, backward, local^T @ g and the halo
    gradients N_i^T @ g[rows] written into the (NaN-filled) halo-gradient buffer, with every product through
    ``spmm``, unchunked and chunked."""
    from types import SimpleNamespace

    from g3mpi.sched import Schedule
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    bm.local, bm.neighbours       # noqa: B018  (built before torch.sparse.mm is replaced: not a product)
    _NoSparseMM(monkeypatch)
    F = 4
    h = torch.randn(n, F)
    halo = np.random.default_rng(1).random((int(ro[-1]), F)).astype(np.float32)
    k = len(ro) - 1
    plan = SimpleNamespace(recv_slice=lambda i: slice(int(ro[i]), int(ro[i + 1])), send_idx=[])
    ex = SimpleNamespace(forward=SimpleNamespace(num_recvs=k), backward=SimpleNamespace(num_recvs=k),
                         halo=halo, halo_grad=np.full((int(ro[-1]), F), np.nan, np.float32), plan=plan)
    sched = Schedule("nocomm", chunk_rows=chunk_rows)
    dense = np.concatenate([(a[:, :n] + sp.diags(diag)).toarray(), a[:, n:].toarray()], axis=1)
    out = sched.spmm_forward(bm, ex, h)
    want = dense @ np.concatenate([h.numpy(), halo])
    assert np.allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    g = torch.randn(n, F)
    grad = sched.spmm_backward(bm, ex, g)
    want_t = dense.T @ g.numpy()
    assert np.allclose(grad.numpy(), want_t[:n], rtol=1e-5, atol=1e-6)
    assert np.allclose(ex.halo_grad, want_t[n:], rtol=1e-5, atol=1e-6)


def test_pipeline_products_use_spmm(monkeypatch):
    """The pipeline's neighbour-block product (``SpMM``, forward and backward) and its local product go through
    ``spmm`` (torch.sparse.mm replaced by a failure)."""
    from g3mpi.ops.pipeline import SpMM, _LocalB, _LocalI, _LocalProduct
    from g3mpi.sched import row_groups
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    B, I = row_groups(bm, [boundary])
    _NoSparseMM(monkeypatch)
    for i, nb in enumerate(B.nb):
        if nb is None:
            continue
        blk = a[boundary][:, n + ro[i]:n + ro[i + 1]].toarray()[nb[0].numpy()]
        hx = torch.randn(blk.shape[1], 3, requires_grad=True)
        y = SpMM.apply(hx, nb[1], nb[2])
        assert np.allclose(y.detach().numpy(), blk @ hx.detach().numpy(), rtol=1e-5, atol=1e-6)
        gy = torch.randn_like(y)
        y.backward(gy)
        assert np.allclose(hx.grad.numpy(), blk.T @ gy.numpy(), rtol=1e-5, atol=1e-6)
    xb = torch.randn(len(B.rows), 3, requires_grad=True)
    xi = torch.randn(len(I.rows), 3, requires_grad=True)
    op = _LocalProduct(B, I, 4, lambda: None)
    ob, token = _LocalB.apply(xb, xi, op)
    oi = _LocalI.apply(token, op)
    (ob.sum() + oi.sum()).backward()
    assert xb.grad is not None and xi.grad is not None


class _ScriptedTransfer:
    """A stand-in for one direction of a halo exchange (no MPI): ``test`` (a poll) returns the receives that
    ``arrivals`` lets land at that poll; ``wait_some`` returns every receive not yet returned; ``send(i)`` records
    a copy of what buffer ``sent_from`` holds in rows ``slices[i]`` at that moment."""

    def __init__(self, num_recvs, arrivals, events, sent_from=None, slices=None):
        self.num_recvs, self.arrivals, self.events = num_recvs, list(arrivals), events
        self.sent_from, self.slices, self.sent, self.returned = sent_from, slices, {}, set()

    def _new(self, idx):
        got = [i for i in idx if i not in self.returned]
        self.returned.update(got)
        return got

    def test(self):
        self.events.append("poll")
        return self._new(self.arrivals.pop(0) if self.arrivals else [])

    def wait_some(self):
        self.events.append("wait")
        return self._new(range(self.num_recvs))

    def post_recvs(self):
        pass

    def send(self, i):
        self.events.append(f"send{i}")
        self.sent[i] = self.sent_from[self.slices[i]].copy()


def test_pipelined_schedule_computes_landed_blocks_between_chunks_and_sends_finished_gradients(monkeypatch):
    """The pipelined layer-by-layer schedule polls between the local block's chunks and computes each neighbour's
    block as soon as a poll finds its message landed (here neighbour 0 at the second poll, 1 at the third), not
    all at the end; backward sends each halo gradient once it is computed, its whole value. Results equal the
    unchunked blocking product. A mutation run found both untested: a pipelined schedule that never polled
    (no overlap at all) and a backward that sent each buffer before computing it passed every test."""
    from types import SimpleNamespace

    import g3mpi.sched.schedule as schedule_mod
    from g3mpi.sched import Schedule
    a, ro, boundary, diag = make()
    n, k, F = a.shape[0], len(ro) - 1, 3
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    events = []
    names = {id(nb.mat): f"nb{i}" for i, nb in enumerate(bm.neighbours)}
    names.update({id(nb.mat_t): f"nb{i}_t" for i, nb in enumerate(bm.neighbours)})
    real = schedule_mod.spmm

    def spmm(mat, x, out=None):
        events.append(names.get(id(mat), "local"))
        return real(mat, x, out)
    monkeypatch.setattr(schedule_mod, "spmm", spmm)
    slices = [slice(int(ro[i]), int(ro[i + 1])) for i in range(k)]
    plan = SimpleNamespace(recv_slice=lambda i: slices[i], send_idx=[])
    halo = np.random.default_rng(3).random((int(ro[-1]), F)).astype(np.float32)
    halo_grad = np.full((int(ro[-1]), F), np.nan, np.float32)
    ex = SimpleNamespace(halo=halo, halo_grad=halo_grad, plan=plan, start_forward=lambda h: events.append("start"),
                         forward=_ScriptedTransfer(k, [[], [0], [1]], events),
                         backward=_ScriptedTransfer(k, [], events, halo_grad, slices))
    h = torch.randn(n, F)
    out = Schedule("pipelined", chunk_rows=7).spmm_forward(bm, ex, h)
    dense = np.concatenate([(a[:, :n] + sp.diags(diag)).toarray(), a[:, n:].toarray()], axis=1)
    assert np.allclose(out.numpy(), dense @ np.concatenate([h.numpy(), halo]), rtol=1e-5, atol=1e-6)
    chunks = -(-n // 7)
    assert events[:8] == ["start", "local", "poll", "local", "poll", "nb0", "local", "poll"]
    assert events[8:9] == ["nb1"] and events.count("local") == chunks and events[-1] == "wait"
    events.clear()
    g = torch.randn(n, F)
    grad = Schedule("pipelined", chunk_rows=7).spmm_backward(bm, ex, g)
    want_t = dense.T @ g.numpy()
    assert np.allclose(grad.numpy(), want_t[:n], rtol=1e-5, atol=1e-6)
    assert events[:4] == ["nb0_t", "send0", "nb1_t", "send1"]
    for i in range(k):
        assert np.allclose(ex.backward.sent[i], want_t[n:][slices[i]], rtol=1e-5, atol=1e-6), i
