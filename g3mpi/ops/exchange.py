"""The halo exchange as autograd Functions, for layers whose aggregation is itself differentiable (GAT).

``dummy = halo_start(payload, ex, schedule)`` posts the receives and sends ``payload``'s boundary rows;
``halo_recv(dummy, ex, schedule, i)`` returns neighbour i's halo slice (call it once it has landed);
``halo_join(out, dummy)`` ties the exchange into the result so its backward always runs.

Backward: each ``halo_recv`` sends the gradient of its slice back to the owner as soon as autograd reaches it;
``halo_start``'s backward (which autograd runs after every ``halo_recv`` backward) sums the gradients other ranks
send for our rows.
"""
from __future__ import annotations

import torch


class _HaloStart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, payload, ex, schedule, send_idx):
        ctx.ex, ctx.schedule, ctx.send_idx = ex, schedule, send_idx
        ctx.shape = payload.shape
        if schedule.communicates:
            ex.start_forward(payload.detach().contiguous().numpy(), send_idx)
        return payload.new_zeros(0)

    @staticmethod
    def backward(ctx, _):
        ex, sched = ctx.ex, ctx.schedule
        tr = ex.backward
        if sched.communicates:
            tr.begin()
        sched.rest(tr)
        tr.end()
        grad = torch.zeros(ctx.shape, dtype=torch.float32)
        idxs = ex.plan.send_idx if ctx.send_idx is None else ctx.send_idx
        for i, idx in enumerate(idxs):
            grad.index_add_(0, torch.from_numpy(idx), torch.from_numpy(ex.grad_bufs[i]))
        return grad, None, None, None


class _HaloRecv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, dummy, ex, schedule, i):
        ctx.ex, ctx.schedule, ctx.i = ex, schedule, i
        return torch.from_numpy(ex.halo_slice(i))

    @staticmethod
    def backward(ctx, g):
        ex, sched, i = ctx.ex, ctx.schedule, ctx.i
        torch.from_numpy(ex.halo_grad[ex.plan.recv_slice(i)]).copy_(g)
        if sched.communicates:
            tr = ex.backward
            tr.begin()
            tr.send(i)
            if sched.mode == "blocking" and tr.all_sent:
                sched.rest(tr)
        return g.new_zeros(0), None, None, None


class _HaloJoin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, dummy):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        return g, g.new_zeros(0)


def halo_start(payload, ex, schedule, send_idx=None):
    """``send_idx``: per send neighbour, positions of its rows in ``payload`` (default: payload = all owned rows)."""
    return _HaloStart.apply(payload, ex, schedule, send_idx)


def halo_recv(dummy, ex, schedule, i: int):
    return _HaloRecv.apply(dummy, ex, schedule, i)


def halo_join(out, dummy):
    return _HaloJoin.apply(out, dummy)
