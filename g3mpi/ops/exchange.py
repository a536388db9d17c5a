"""The halo exchange inside autograd: the one path by which every layer (GCN, SAGE, GAT; layer by layer or
pipelined) sends its boundary rows and gets the halo gradients back.

One ``HaloRound`` per layer and pass. Forward: ``start(payload)`` posts the receives and sends the payload's
rows (payload row i = owned row i; boundary-first parts send a contiguous range as a view, no copy) and
returns a token for the autograd graph; then either ``recv(token, i)`` gives neighbour i's halo slice as a
tensor (GAT differentiates through it), or ``add(out, token, i, ...)`` adds neighbour i's block product,
computed without autograd when its message landed, into ``out`` in place; ``join(out, token)`` ties the
exchange into the result so its backward always runs.

Backward: each ``add``/``recv`` writes its share of neighbour i's halo gradient straight into the exchange's
halo-gradient buffer (the neighbour block's precomputed transpose, ``spmm`` in place: no gather, no copy), and
the slice is sent as soon as every share of this round is in. The gradients other ranks send for our rows are
added in place (``add_received``) by whoever holds the payload's gradient: the local product's backward, or
``start``'s backward when ``start(payload, grads=True)`` (GAT).
"""
from __future__ import annotations

import torch

from .blocks import spmm


class HaloRound:
    """One exchange (``ex``, a ``HaloExchange``) of one layer in one forward and backward pass, under
    ``schedule``."""

    def __init__(self, ex, schedule):
        self.ex, self.schedule = ex, schedule
        k = len(ex.plan.recv_parts)
        self.expected = [0] * k     # shares of each halo gradient this round (one per add / recv)
        self.got = [0] * k
        self.sent = [False] * k

    # -- forward ------------------------------------------------------------------------------------------------
    def start(self, payload: torch.Tensor, grads: bool = False) -> torch.Tensor:
        """Post the receives and send ``payload``'s rows; the token returned joins the autograd graph. With
        ``grads`` the received gradients become ``payload``'s gradient; without, ``add_received`` hands them to
        the caller's own backward."""
        return _Start.apply(payload, self, grads)

    def landed(self) -> list:
        """Receives landed since the last call (never blocks; none unless pipelined)."""
        return self.schedule.poll(self.ex.forward)

    def rest(self) -> list:
        """The receives not yet returned (blocking until they have landed)."""
        return self.schedule.rest(self.ex.forward)

    def halo(self, i: int) -> torch.Tensor:
        """Neighbour i's halo slice, outside autograd (for a product computed when it lands)."""
        return torch.from_numpy(self.ex.halo_slice(i))

    def recv(self, token: torch.Tensor, i: int) -> torch.Tensor:
        self.expected[i] += 1
        return _Recv.apply(token, self, i)

    def add(self, out: torch.Tensor, token: torch.Tensor, i: int, partial: torch.Tensor, pos: torch.Tensor,
            mat_t: torch.Tensor) -> torch.Tensor:
        """``out[pos] += partial`` in place, where ``partial`` = a block of neighbour i's halo product; ``mat_t``
        is that block's transpose with columns = rows of ``out``, so that backward's share of the halo gradient
        is ``mat_t @ grad_out``."""
        self.expected[i] += 1
        return _Add.apply(out, token, self, i, partial, pos, mat_t)

    @staticmethod
    def join(out: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return _Join.apply(out, token)

    # -- backward -----------------------------------------------------------------------------------------------
    def _share(self, i: int, write) -> None:
        """One share of neighbour i's halo gradient: ``write(buf, first)`` writes (first share) or adds into the
        slice; the slice is sent once every share is in."""
        sched, tr = self.schedule, self.ex.backward
        if sched.communicates:
            tr.begin()
        write(torch.from_numpy(self.ex.halo_grad[self.ex.plan.recv_slice(i)]), self.got[i] == 0)
        self.got[i] += 1
        if self.got[i] == self.expected[i] and sched.communicates:
            tr.send(i)
            self.sent[i] = True
            if sched.waits_first and tr.all_sent:
                sched.rest(tr)

    def add_received(self, grad: torch.Tensor) -> torch.Tensor:
        """Send what is still unsent, wait for every gradient other ranks send for our rows and add them into
        ``grad`` (rows = owned rows 0 .., at least the boundary ones) in place; returns ``grad``."""
        sched, tr, ex = self.schedule, self.ex.backward, self.ex
        if sched.communicates:
            tr.begin()
            for i, sent in enumerate(self.sent):
                if not sent:    # a share that no gradient reached: what it has (zeros without any) goes now
                    if self.got[i] == 0:
                        ex.halo_grad[ex.plan.recv_slice(i)] = 0
                    tr.send(i)
        sched.rest(tr)
        tr.end()
        for i, (idx, r) in enumerate(zip(ex.plan.send_idx, ex.plan.send_ranges)):
            got = torch.from_numpy(ex.grad_bufs[i])
            if r is not None:
                grad[r[0]:r[1]].add_(got)
            else:
                grad.index_add_(0, torch.from_numpy(idx), got)
        return grad


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, payload, rnd, grads):
        ctx.rnd, ctx.grads = rnd, grads
        ctx.shape = payload.shape
        if rnd.schedule.communicates:
            rnd.ex.start_forward(payload.detach().contiguous().numpy())
        return payload.new_zeros(0)

    @staticmethod
    def backward(ctx, _):
        rnd = ctx.rnd
        if not ctx.grads:
            return None, None, None
        return rnd.add_received(torch.zeros(ctx.shape, dtype=torch.float32)), None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, rnd, i):
        ctx.rnd, ctx.i = rnd, i
        return rnd.halo(i)

    @staticmethod
    def backward(ctx, g):
        ctx.rnd._share(ctx.i, lambda buf, first: buf.copy_(g) if first else buf.add_(g))
        return g.new_zeros(0), None, None


class _Add(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, token, rnd, i, partial, pos, mat_t):
        ctx.rnd, ctx.i, ctx.mat_t = rnd, i, mat_t
        out.index_add_(0, pos, partial)
        ctx.mark_dirty(out)
        return out

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        mat_t = ctx.mat_t
        ctx.rnd._share(ctx.i, lambda buf, first: spmm(mat_t, g, buf) if first else buf.addmm_(mat_t, g))
        return g, g.new_zeros(0), None, None, None, None, None


class _Join(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, token):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        return g, g.new_zeros(0)
