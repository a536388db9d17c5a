"""Host staging of the halo exchange (g3mpi.ops.staging), the CPU standing in for the device: the staged path
(rows copied to host buffers, sends queued behind the copies, halos and gradients copied back) gives bit for bit
what the unstaged one gives, for GCN, SAGE and GAT (whose gradients to rounding), every schedule, whole messages
and pieces."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi4py import MPI

from g3mpi.comm import CommContext, HaloPlan
from g3mpi.ops.staging import DONE, HostCopies, Stager, pinned_zeros
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph

SLOW_TESTS = ("test_staged_exchange_is_exact",)
MODELS = ("gcn", "sage", "gat")
VARIANTS = ("pipelined:0:0", "blocking:-1:0.002", "pipelined:5:0.004:piece64", "pipelined:-1:0:nocache")


@pytest.mark.parametrize("P", [2, 3])
def test_staged_exchange_is_exact(P, tmp_path):
    g = random_graph(n=160, seed=P + 20)
    partition(g, P, tmp_path / "parts", seed=P)
    staged = tuple(f"{v}:staged" for v in VARIANTS)
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join(VARIANTS + staged), "--repeat", "2", timeout=600)
    res = np.load(tmp_path / "out.npz")
    for v, s in zip(VARIANTS, staged):
        for model in MODELS:
            keys = [k[len(f"{v}/{model}/"):] for k in res.files if k.startswith(f"{v}/{model}/")]
            assert "logits" in keys and any(k.startswith("grad/") for k in keys)
            for k in keys:
                assert np.array_equal(res[f"{s}/{model}/{k}"], res[f"{v}/{model}/{k}"]), (s, model, k)


class SlowCopies(HostCopies):
    """Copies done at once whose events complete only when the test says so."""

    def __init__(self):
        self.events = []

    def copy(self, pairs):
        super().copy(pairs)
        self.events.append(Pending())
        return self.events[-1]


class Pending:
    def __init__(self):
        self.done, self.waited = False, False

    def query(self):
        return self.done

    def synchronize(self):
        self.done = self.waited = True


def test_staged_rows_travel_once_their_copy_completes():
    """One rank talking to itself (its rows 0, 2, 4 are its halo): the payload's send rows are gathered into the
    host buffer, sent once the copy's event completes, and copied back as the device halo; the halo gradient
    goes back piece by piece behind its own copies and is added into the rows it came from."""
    plan = HaloPlan(num_owned=5, num_halo=3, recv_parts=[0], recv_offsets=np.array([0, 3]), send_parts=[0],
                    send_idx=[np.array([0, 2, 4])])
    ctx = CommContext(MPI.COMM_SELF)
    copies = SlowCopies()
    try:
        ex = ctx.exchange(plan, 2, piece_rows=2)   # pieces: halo row 0, halo rows 1 and 2
        st = Stager(copies).stage(ex)
        assert ex.staging is st and ex.send_ranges == [None]
        payload = torch.arange(10, dtype=torch.float32).reshape(5, 2)
        st.start_forward(payload)
        assert ex.forward.test() == [] and ctx.stats.messages_sent == 0, "sent before its copy completed"
        copies.events[0].done = True
        landed = ex.forward.test() + ex.forward.wait_all()
        assert sorted(landed) == [0, 1] and ctx.stats.messages_sent == 2 and not copies.events[0].waited
        halo = st.halo_rows(0)
        assert torch.equal(halo, payload[[0, 2, 4]]) and halo.data_ptr() != torch.from_numpy(ex.halo).data_ptr()
        assert torch.equal(st.halo_rows(0, 1), payload[[2, 4]]) and list(ex.recv_pieces[0]) == [0, 1, 3]
        # backward: the gradient of halo pieces 0 and 1, each sent behind its copy
        ex.backward.begin()
        st.halo_grad[:] = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
        st.send_grad(0, 0, 0)
        st.send_grad(0, 1, 1)
        assert sorted(ex.backward.wait_all()) == [0, 1] and all(e.waited for e in copies.events[1:])
        grad = torch.zeros(5, 2)
        for k in range(2):
            a, b = (int(v) for v in ex.send_pieces[0][k:k + 2])
            grad.index_add_(0, st.send_index(0)[a:b], st.grad_rows(0, a, b))
        assert torch.equal(grad[:, 0], torch.tensor([1.0, 0.0, 2.0, 0.0, 3.0]))
    finally:
        ctx.free()


def test_a_contiguous_send_list_is_sliced_and_host_copies_are_complete():
    plan = HaloPlan(num_owned=4, num_halo=2, recv_parts=[0], recv_offsets=np.array([0, 2]), send_parts=[0],
                    send_idx=[np.array([1, 2])])
    ctx = CommContext(MPI.COMM_SELF)
    try:
        ex = ctx.exchange(plan, 3)
        st = Stager.for_device("cpu").stage(ex)
        assert st.sources == [(1, 3)] and Stager.for_device("cpu").alloc is None
        payload = torch.randn(4, 3)
        st.start_forward(payload)
        ex.forward.wait_all()
        assert torch.equal(st.halo_rows(0), payload[1:3])
        assert DONE.query() and DONE.synchronize() is None
    finally:
        ctx.free()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_staging_round_trip():
    """On a GPU: pinned host buffers, the side stream's copies and their events (g3mpi.ops.staging.CudaCopies)."""
    buf = pinned_zeros((3, 2), np.float32)
    assert torch.from_numpy(buf).is_pinned()
    plan = HaloPlan(num_owned=5, num_halo=3, recv_parts=[0], recv_offsets=np.array([0, 3]), send_parts=[0],
                    send_idx=[np.array([0, 2, 4])])
    ctx = CommContext(MPI.COMM_SELF)
    try:
        stager = Stager.for_device("cuda")
        ex = ctx.exchange(plan, 2, piece_rows=1, alloc=stager.alloc)
        st = stager.stage(ex)
        payload = torch.arange(10, dtype=torch.float32, device="cuda").reshape(5, 2) * 3
        st.start_forward(payload)
        ex.forward.wait_all()
        halo = st.halo_rows(0)
        assert halo.device.type == "cuda" and torch.equal(halo, payload[[0, 2, 4]])
        ex.backward.begin()
        st.halo_grad.copy_(payload[:3])
        for k in range(3):
            st.send_grad(0, k, k)
        ex.backward.wait_all()
        assert np.array_equal(ex.grad_bufs[0], payload[:3].cpu().numpy())
        assert st.grad_rows(0, 0, 3).device.type == "cuda"
    finally:
        ctx.free()
