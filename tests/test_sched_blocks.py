"""Blocks, chunks and row groups of one rank's aggregation matrix reproduce the whole product, and the layer-by-layer
aggregation and the pipeline's products run as scheduled (serial, no MPI: a stand-in exchange)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from g3mpi.ops.blocks import BlockMatrix
from g3mpi.sched import Schedule

NB = 12     # boundary rows of ``make``'s matrices: owned rows 0 .. NB-1 (the part format's boundary-first order)

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_pipeline_products_use_spmm",)


def make(n=50, halo=(7, 5), seed=0):
    rng = np.random.default_rng(seed)
    cols = n + sum(halo)
    a = sp.random(n, cols, density=0.15, random_state=seed, format="csr", dtype=np.float32)
    a.data[:] = rng.random(len(a.data)).astype(np.float32)
    a.sort_indices()
    recv_offsets = np.concatenate([[0], np.cumsum(halo)])
    diag = rng.random(n).astype(np.float32)
    return a, recv_offsets, NB, diag


class _Plan:
    def __init__(self, ro):
        self.ro = ro
        self.recv_parts = list(range(len(ro) - 1))
        self.send_idx, self.send_ranges = [], []

    def recv_slice(self, i):
        return slice(int(self.ro[i]), int(self.ro[i + 1]))


def standin(bm, ro, F, sched, forward=None, backward=None, events=None):
    """(graph, exchange) stand-ins for ``Aggregation`` over ``bm``: a halo of random rows, NaN-filled gradient
    buffers, no sends of our own rows (``send_idx`` empty), scripted transfers when given."""
    from types import SimpleNamespace
    k = len(ro) - 1
    halo = np.random.default_rng(1).random((int(ro[-1]), F)).astype(np.float32)
    plan = _Plan(ro)
    ex = SimpleNamespace(plan=plan, halo=halo, halo_grad=np.full((int(ro[-1]), F), np.nan, np.float32),
                         grad_bufs=[], halo_slice=lambda i: halo[plan.recv_slice(i)],
                         recv_pieces=[np.array([0, int(ro[i + 1] - ro[i])]) for i in range(k)],
                         recv_msgs=[range(i, i + 1) for i in range(k)], send_pieces=[], send_msgs=[], send_ranges=[],
                         forward=forward or SimpleNamespace(num_recvs=k),
                         backward=backward or SimpleNamespace(num_recvs=0, landed=np.zeros(0, bool)),
                         start_forward=lambda h: events.append("start"), staging=None)
    graph = SimpleNamespace(blocks=lambda kind: bm, exchange=lambda width, name: ex, schedule=sched,
                            num_owned=bm.num_owned)
    return graph, ex


def aggregation(bm, ro, F, sched, **kw):
    from g3mpi.ops import Aggregation
    graph, ex = standin(bm, ro, F, sched, **kw)
    return Aggregation(graph, "gcn", F), ex


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
        part = torch.sparse.mm(nb.mat_t, g)           # (columns = owned rows: nothing gathered)
        assert torch.allclose(part, full_t[n + ro[i]:n + ro[i + 1]], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows_per_chunk", [1, 7, 13, 49, 50, 1000])
def test_forward_chunks_are_row_ranges_written_in_place(monkeypatch, rows_per_chunk):
    """The local block's forward chunks are its contiguous row ranges, in order, sharing its indices and values,
    and the chunked layer-by-layer aggregation writes each range's product into its rows of the output: bit for
    bit the unchunked output, with no ``index_copy_`` (before, every chunk's product was a fresh tensor copied in
    by row index: 6-14 % of a chunked blocking epoch's CPU time on R-MAT scale 16, 2 ranks, 128 wide)."""
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    F = 5
    h = torch.randn(n, F)
    whole = aggregation(bm, ro, F, Schedule("nocomm", chunk_rows=-1))[0](h)

    def refuse(*a, **k):
        raise AssertionError("index_copy_: a chunk's product copied into the output")
    monkeypatch.setattr(torch.Tensor, "index_copy_", refuse)
    out = aggregation(bm, ro, F, Schedule("nocomm", chunk_rows=rows_per_chunk))[0](h)
    assert torch.equal(out, whole)
    chunks = bm.chunks(rows_per_chunk)
    k = min(rows_per_chunk, n)
    assert [(s, e) for s, e, _ in chunks] == [(s, min(s + k, n)) for s in range(0, n, k)]
    base = bm.local.col_indices().untyped_storage().data_ptr()
    assert all(m.col_indices().untyped_storage().data_ptr() == base for _, _, m in chunks)


def test_chunk_rule():
    """One rule for every chunked product: automatic chunks follow the width, only when pipelined with messages
    to poll for; a positive size forces chunks in every mode, a negative one none."""
    auto = Schedule("pipelined")
    assert auto.rows_per_chunk(16, 1) > auto.rows_per_chunk(256, 1) >= 64
    assert auto.rows_per_chunk(16, 0) == 0 and Schedule("blocking").rows_per_chunk(16, 3) == 0
    assert Schedule("blocking", chunk_rows=100).rows_per_chunk(16, 0) == 100
    assert Schedule("pipelined", chunk_rows=-1).rows_per_chunk(16, 3) == 0


def test_row_groups_leave_blocks_unbuilt_and_chunks_share_storage():
    """The inter-layer pipeline's row groups are the row ranges [0, num_boundary) and [num_boundary, n), built
    from the part's arrays: building them does not build the blocks' torch forms (a rank would hold the matrices
    twice); their row chunks are views, not copies. Each group's local block is split by columns (boundary rows',
    interior rows'), so a group's product takes the two row groups' inputs (views of one input) as they are."""
    from g3mpi.ops.blocks import row_groups
    a, ro, nb, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, nb, a.data, diag)
    sizes = bm.sizes()
    B, I = row_groups(bm)
    assert bm._torch is None
    assert (B.start, B.stop, I.start, I.stop) == (0, nb, nb, n)
    h = torch.randn(a.shape[1], 3)
    hb, hi = h[:nb], h[nb:n]
    want = (a @ h.numpy()) + diag[:, None] * h.numpy()[:n]
    for grp in (B, I):
        for rpc in (0, 4, 1000):
            out = torch.cat([torch.sparse.mm(mb, hb) + torch.sparse.mm(mi, hi) for _, _, mb, mi in grp.chunks(rpc)])
            for i, blk in enumerate(grp.nb):
                if blk is not None:
                    out.index_add_(0, blk[0], torch.sparse.mm(blk[1], h[n + ro[i]:n + ro[i + 1]]))
            assert np.allclose(out.numpy(), want[grp.start:grp.stop], rtol=1e-6, atol=1e-6)
        for j in range(2):
            base = grp.local[j].col_indices().untyped_storage().data_ptr()
            assert all(c[2 + j].col_indices().untyped_storage().data_ptr() == base for c in grp.chunks(4))
            base = grp.local_t[j].col_indices().untyped_storage().data_ptr()
            assert all(m.col_indices().untyped_storage().data_ptr() == base for _, _, m in grp.t_chunks(4)[j])
    # the transposes: grad of the owned rows = sum over both groups of local_t[j] @ (the group's output grad)
    g = torch.randn(n, 3)
    loc_t = (a[:, :n] + sp.diags(diag)).T.toarray() @ g.numpy()
    for j, (lo, hi) in enumerate(((0, nb), (nb, n))):
        for rpc in (0, 5):
            tb, ti = B.t_chunks(rpc)[j], I.t_chunks(rpc)[j]
            assert [c[:2] for c in tb] == [c[:2] for c in ti]
            got = torch.cat([torch.sparse.mm(mb, g[:nb]) + torch.sparse.mm(mi, g[nb:])
                             for (_, _, mb), (_, _, mi) in zip(tb, ti)])
            assert np.allclose(got.numpy(), loc_t[lo:hi], rtol=1e-5, atol=1e-5)
    # a neighbour block's transpose has the group's rows as columns: the group's whole gradient, nothing gathered
    full_t = a.T.toarray() @ g.numpy()
    for i in range(len(ro) - 1):
        got = sum(torch.sparse.mm(grp.nb[i][2], g[grp.start:grp.stop]) for grp in (B, I) if grp.nb[i] is not None)
        assert np.allclose(got.numpy(), full_t[n + ro[i]:n + ro[i + 1]], rtol=1e-5, atol=1e-5)
    assert bm.sizes() == sizes
    assert sizes["nnz"] == bm.local._nnz() + sum(nb.mat._nnz() for nb in bm.neighbours)


class _Received:
    """A ``HaloRound`` stand-in for the pipeline's local product: records the gradient it gets to add to."""

    def __init__(self):
        self.grads = []

    def add_received(self, g):
        self.grads.append(g)
        return g


def test_pipeline_local_product_forward_and_backward():
    """The pipeline's local product (g3mpi.ops.pipeline: boundary rows first, interior rows later by chunks,
    one backward for both) equals the dense product and its gradients, for any chunk size, with the
    progress callback run between chunks and the received halo gradients added to the boundary rows'."""
    from g3mpi.ops.blocks import row_groups
    from g3mpi.ops.pipeline import _LocalB, _LocalI, _LocalProduct
    a, ro, nb, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, nb, a.data, diag)
    B, I = row_groups(bm)
    dense = torch.from_numpy((a[:, :n] + sp.diags(diag)).toarray())
    x = torch.randn(n, 5, dtype=torch.float32)
    gy = torch.randn(n, 5)
    want = dense @ x
    want_g = dense.T @ gy
    for rpc in (0, 1, 3, 1000):
        calls = []
        xb = x[:nb].clone().requires_grad_()
        xi = x[nb:].clone().requires_grad_()
        rnd = _Received()
        op = _LocalProduct(B, I, rpc, lambda: calls.append(1), rnd)
        ob, token = _LocalB.apply(xb, xi, op)
        oi = _LocalI.apply(token, op)
        assert torch.allclose(ob, want[:nb], rtol=1e-5, atol=1e-6), rpc
        assert torch.allclose(oi, want[nb:], rtol=1e-5, atol=1e-6), rpc
        forward_calls = len(calls)
        assert forward_calls == len(I.chunks(rpc))
        ((ob * gy[:nb]).sum() + (oi * gy[nb:]).sum()).backward()
        assert torch.allclose(xb.grad, want_g[:nb], rtol=1e-5, atol=1e-5), rpc
        assert torch.allclose(xi.grad, want_g[nb:], rtol=1e-5, atol=1e-5), rpc
        assert len(calls) - forward_calls == sum(len(c) for c in B.t_chunks(rpc))
        assert len(rnd.grads) == 1 and rnd.grads[0].shape == (nb, 5)


def _csr(m: sp.csr_matrix, dtype, index_dtype) -> torch.Tensor:
    from g3mpi.ops.blocks import torch_csr
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
    from g3mpi.ops.blocks import _split_rows, spmm
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
    """The layer-by-layer aggregation (``Aggregation``, here ``nocomm`` on a serial stand-in exchange: no MPI)
    computes local @ h + sum_i N_i @ halo_i and, backward, local^T @ g and the halo gradients N_i^T @ g written
    into the (NaN-filled) halo-gradient buffer, with every product through ``spmm``, unchunked and chunked."""
    a, ro, boundary, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    bm.local, bm.neighbours       # noqa: B018  (built before torch.sparse.mm is replaced: not a product)
    _NoSparseMM(monkeypatch)
    F = 4
    agg, ex = aggregation(bm, ro, F, Schedule("nocomm", chunk_rows=chunk_rows))
    h = torch.randn(n, F, requires_grad=True)
    dense = np.concatenate([(a[:, :n] + sp.diags(diag)).toarray(), a[:, n:].toarray()], axis=1)
    out = agg(h)
    want = dense @ np.concatenate([h.detach().numpy(), ex.halo])
    assert np.allclose(out.detach().numpy(), want, rtol=1e-5, atol=1e-6)
    g = torch.randn(n, F)
    out.backward(g)
    want_t = dense.T @ g.numpy()
    assert np.allclose(h.grad.numpy(), want_t[:n], rtol=1e-5, atol=1e-6)
    assert np.allclose(ex.halo_grad, want_t[n:], rtol=1e-5, atol=1e-6)


def test_pipeline_products_use_spmm(monkeypatch):
    """The neighbour-block product (``SpMM``, forward and backward) and the pipeline's local product go through
    ``spmm`` (torch.sparse.mm replaced by a failure)."""
    from g3mpi.ops.blocks import SpMM, row_groups
    from g3mpi.ops.pipeline import _LocalB, _LocalI, _LocalProduct
    a, ro, nb, diag = make()
    n = a.shape[0]
    bm = BlockMatrix(a.indptr, a.indices, n, ro, nb, a.data, diag)
    B, I = row_groups(bm)
    _NoSparseMM(monkeypatch)
    from g3mpi.ops.blocks import spmm
    for i, blk_i in enumerate(B.nb):
        if blk_i is None:
            continue
        blk = a[:nb][:, n + ro[i]:n + ro[i + 1]].toarray()
        hx = torch.randn(blk.shape[1], 3, requires_grad=True)
        y = torch.zeros(nb, 3).index_add(0, blk_i[0], SpMM.apply(hx, blk_i[1], None))
        assert np.allclose(y.detach().numpy(), blk @ hx.detach().numpy(), rtol=1e-5, atol=1e-6)
        gy = torch.randn(nb, 3)
        assert np.allclose(spmm(blk_i[2], gy).numpy(), blk.T @ gy.numpy(), rtol=1e-5, atol=1e-6)
    xb = torch.randn(B.size, 3, requires_grad=True)
    xi = torch.randn(I.size, 3, requires_grad=True)
    op = _LocalProduct(B, I, 4, lambda: None, _Received())
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

    def begin(self):
        pass

    @property
    def landed(self):
        return np.array([i in self.returned for i in range(self.num_recvs)], dtype=bool)

    @property
    def all_sent(self):
        return len(self.sent) == len(self.slices or [])

    def send(self, i):
        self.events.append(f"send{i}")
        self.sent[i] = self.sent_from[self.slices[i]].copy()


def test_pipelined_schedule_computes_landed_blocks_between_chunks_and_sends_finished_gradients(monkeypatch):
    """The pipelined layer-by-layer aggregation polls between the local block's chunks and computes each
    neighbour's block as soon as a poll finds its message landed (here neighbour 0 at the second poll, 1 at the
    third), not all at the end; backward sends each halo gradient once it is computed, its whole value, before
    the local transpose runs. Results equal the dense product. A mutation run found both untested: a pipelined
    schedule that never polled (no overlap at all) and a backward that sent each buffer before computing it
    passed every test."""
    import g3mpi.ops.aggregate as aggregate_mod
    import g3mpi.ops.blocks as blocks_mod
    import g3mpi.ops.exchange as exchange_mod
    a, ro, boundary, diag = make()
    n, k, F = a.shape[0], len(ro) - 1, 3
    bm = BlockMatrix(a.indptr, a.indices, n, ro, boundary, a.data, diag)
    events = []
    names = {id(nb.mat): f"nb{i}" for i, nb in enumerate(bm.neighbours)}
    names.update({id(nb.mat_t): f"nb{i}_t" for i, nb in enumerate(bm.neighbours)})
    real = aggregate_mod.spmm

    def spmm(mat, x, out=None):
        events.append(names.get(id(mat), "local"))
        return real(mat, x, out)
    monkeypatch.setattr(aggregate_mod, "spmm", spmm)
    monkeypatch.setattr(exchange_mod, "spmm", spmm)
    monkeypatch.setattr(blocks_mod, "spmm", spmm)      # (the neighbour blocks' products: ``piece_product``)
    slices = [slice(int(ro[i]), int(ro[i + 1])) for i in range(k)]
    halo_grad = np.full((int(ro[-1]), F), np.nan, np.float32)
    agg, ex = aggregation(bm, ro, F, Schedule("pipelined", chunk_rows=7), events=events,
                          forward=_ScriptedTransfer(k, [[], [0], [1]], events),
                          backward=_ScriptedTransfer(0, [], events, halo_grad, slices))
    ex.halo_grad = halo_grad
    h = torch.randn(n, F, requires_grad=True)
    out = agg(h)
    dense = np.concatenate([(a[:, :n] + sp.diags(diag)).toarray(), a[:, n:].toarray()], axis=1)
    assert np.allclose(out.detach().numpy(), dense @ np.concatenate([h.detach().numpy(), ex.halo]),
                       rtol=1e-5, atol=1e-6)
    chunks = -(-n // 7)
    assert events[:8] == ["start", "local", "poll", "local", "poll", "nb0", "local", "poll"]
    assert events[8:9] == ["nb1"] and events.count("local") == chunks and events[-1] == "wait"
    events.clear()
    g = torch.randn(n, F)
    out.backward(g)
    want_t = dense.T @ g.numpy()
    assert np.allclose(h.grad.numpy(), want_t[:n], rtol=1e-5, atol=1e-6)
    sends = [e for e in events if e.startswith("send")]
    assert sorted(sends) == ["send0", "send1"]
    for i in range(k):      # each halo gradient computed, then sent at once, before the local transpose
        at = events.index(f"send{i}")
        assert events[at - 1] == f"nb{i}_t" and at < events.index("local")
        assert np.allclose(ex.backward.sent[i], want_t[n:][slices[i]], rtol=1e-5, atol=1e-6), i
