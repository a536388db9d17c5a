"""The halo exchange inside autograd: the one path by which every layer (GCN, SAGE, GAT; layer by layer or
pipelined) sends its boundary rows and gets the halo gradients back.

One ``HaloRound`` per layer and pass. Forward: ``start(payload)`` posts the receives and sends the payload's
rows (payload row i = owned row i; boundary-first parts send a contiguous range as a view, no copy) and
returns a token for the autograd graph. Each neighbour's message travels in pieces (``HaloExchange``):
``landed_pieces``/``rest_pieces`` hand them out per neighbour in piece order, ``landed``/``rest`` whole
neighbours. Then either ``recv(token, i)`` gives neighbour i's halo slice as a tensor (GAT differentiates
through it), or ``add(out, token, i, ...)`` adds neighbour i's block product, computed without autograd as its
pieces landed, into ``out`` in place; ``join(out, token)`` ties the exchange into the result so its backward
always runs.

Backward: each ``add``/``recv`` writes its share of neighbour i's halo gradient straight into the exchange's
halo-gradient buffer (the neighbour block's precomputed transpose, ``spmm`` in place: no gather, no copy), piece
by piece; the last share of this round sends each piece as soon as it is written. The gradients other ranks send
for our rows are added in place as their pieces land (``add_received``) by whoever holds the payload's gradient:
the local product's backward, or ``start``'s backward when ``start(payload, grads=True)`` (GAT).

An exchange with a ``staging`` (a rank whose tensors live on a device, ``g3mpi.ops.staging``) takes the same
steps on device tensors: the payload's send rows are copied to the host buffers and their sends queued behind the
copy, halo pieces are copied to the device as they are handed out, halo gradients are written on the device and
copied back piece by piece, and the returned gradients are copied to the device before they are added.
"""
from __future__ import annotations

from itertools import chain

import torch

from .blocks import spmm, spmm_add
from .staging import DONE


class HaloRound:
    """One exchange (``ex``, a ``HaloExchange``) of one layer in one forward and backward pass, under
    ``schedule``."""

    def __init__(self, ex, schedule, deferred=None):
        self.ex, self.schedule = ex, schedule
        k = len(ex.plan.recv_parts)
        self.expected = [0] * k     # shares of each halo gradient this round (one per add / recv)
        self.got = [0] * k
        self.sent = [False] * k
        self._have = set()          # forward receives landed (piece indices)
        self._next = [0] * k        # per neighbour, its pieces handed out so far (in order)
        self._bwd_open = False
        self._landed = {}           # neighbour -> its halo slice as handed out piece by piece (landed_halo)
        self.dtype = torch.float32  # the payload's (bf16-mixed: bfloat16): what the halo is handed out as
        # deferred weight gradients (``g3mpi.ops.deferred.WeightGrads``) computed while waiting for returned ones
        self.fill = deferred.step if deferred is not None else None

    # -- forward ------------------------------------------------------------------------------------------------
    def start(self, payload: torch.Tensor, grads: bool = False) -> torch.Tensor:
        """Post the receives and send ``payload``'s rows; the token returned joins the autograd graph. With
        ``grads`` the received gradients become ``payload``'s gradient; without, ``add_received`` hands them to
        the caller's own backward."""
        self.dtype = payload.dtype
        return _Start.apply(payload, self, grads)

    def _in_order(self, msgs: list) -> list:
        """(neighbour i, piece k) of the pieces that ``msgs`` (newly landed receives) make available, each
        neighbour's in piece order whatever order they landed in (so results do not depend on it)."""
        self._have.update(msgs)
        out = []
        for i, js in enumerate(self.ex.recv_msgs):
            while self._next[i] < len(js) and js[self._next[i]] in self._have:
                out.append((i, self._next[i]))
                self._next[i] += 1
        return out

    def landed_pieces(self) -> list:
        """(i, k) of neighbour i's pieces k landed since the last call, in order (never blocks; none unless
        pipelined)."""
        return self._in_order(self.schedule.poll(self.ex.forward))

    def next_pieces(self) -> list:
        """Block until at least one more piece can be handed out (in order) and return those that can; [] once
        every piece has been (nocomm: all of them at once)."""
        tr = self.ex.forward
        if not self.schedule.communicates:
            return self._in_order(range(tr.num_recvs))
        while True:
            got = self._in_order(tr.wait_some())
            if got or tr.landed.all():
                return got

    @property
    def pieces_left(self) -> bool:
        return any(n < len(js) for n, js in zip(self._next, self.ex.recv_msgs))

    def rest_pieces(self) -> list:
        """The pieces not yet returned (blocking until they have landed)."""
        out = []
        while got := self.next_pieces():
            out += got
        return out

    def _whole(self, pieces: list) -> list:
        return [i for i, k in pieces if k == len(self.ex.recv_msgs[i]) - 1]

    def landed(self) -> list:
        """Neighbours whose whole message has landed since the last call (never blocks; none unless
        pipelined)."""
        return self._whole(self.landed_pieces())

    def rest(self) -> list:
        """The neighbours not yet returned (blocking until their messages have landed)."""
        return self._whole(self.rest_pieces())

    def halo(self, i: int, k: int | None = None) -> torch.Tensor:
        """Neighbour i's halo slice (or its piece k), outside autograd (for a product computed when it lands)."""
        if self.ex.staging is not None:
            return self.ex.staging.halo_rows(i, k).to(self.dtype)
        h = self.ex.halo_slice(i)
        if k is not None:
            b = self.ex.recv_pieces[i]
            h = h[b[k]:b[k + 1]]
        return torch.from_numpy(h).to(self.dtype)

    def landed_halo(self, i: int, k: int) -> torch.Tensor:
        """Neighbour i's whole halo slice, outside autograd, when its pieces 0 .. k have been handed out (called
        once per piece, in order): the rows of the later pieces are not yet valid. Without staging in float32 it
        is the receive buffer itself; else piece k is copied (converted) into one tensor per neighbour here."""
        if self.ex.staging is None and self.dtype == torch.float32:
            return torch.from_numpy(self.ex.halo_slice(i))
        h = self.halo(i, k)
        b = self.ex.recv_pieces[i]
        if k == 0:
            self._landed[i] = h.new_empty(int(b[-1]), h.shape[1])
        buf = self._landed[i]
        buf[int(b[k]):int(b[k + 1])] = h
        if k == len(b) - 2:
            del self._landed[i]     # (the caller holds it while it needs it)
        return buf

    def recv(self, token: torch.Tensor, i: int) -> torch.Tensor:
        self.expected[i] += 1
        return _Recv.apply(token, self, i)

    def add(self, out: torch.Tensor, token: torch.Tensor, i: int, partial: torch.Tensor, pos: torch.Tensor,
            mat_t: list) -> torch.Tensor:
        """``out[pos] += partial`` in place, where ``partial`` = a block of neighbour i's halo product; ``mat_t``
        is that block's transpose with columns = rows of ``out``, as row pieces matching neighbour i's message
        pieces (``g3mpi.ops.blocks.Pieces``), so that backward's share of the halo gradient is ``mat_t @
        grad_out``, piece by piece."""
        self.expected[i] += 1
        return _Add.apply(out, token, self, i, partial, pos, mat_t)

    @staticmethod
    def join(out: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
        return _Join.apply(out, token)

    # -- backward -----------------------------------------------------------------------------------------------
    def _open_backward(self):
        tr = self.ex.backward
        if self.schedule.communicates and not self._bwd_open:
            tr.begin()
            self._bwd_open = True
        return tr

    def _share(self, i: int, write) -> None:
        """One share of neighbour i's halo gradient: ``write(k, buf, first)`` writes (first share) or adds piece
        k into ``buf``, those rows of the slice. The last share sends each piece as soon as it is written, so the
        first pieces travel while the rest is computed."""
        sched, tr = self.schedule, self._open_backward()
        bounds, msgs = self.ex.recv_pieces[i], self.ex.recv_msgs[i]
        st = self.ex.staging
        if st is None:
            grad = torch.from_numpy(self.ex.halo_grad[self.ex.plan.recv_slice(i)])
        else:
            grad = st.halo_grad[self.ex.plan.recv_slice(i)]
        first = self.got[i] == 0
        self.got[i] += 1
        last = self.got[i] == self.expected[i] and sched.communicates
        for k, j in enumerate(msgs):
            write(k, grad[bounds[k]:bounds[k + 1]], first)
            if last:
                if st is None:
                    tr.send(j)
                else:
                    st.send_grad(i, k, j)
        if last:
            self.sent[i] = True
            if sched.waits_first and tr.all_started:
                sched.rest(tr)

    def add_received(self, grad: torch.Tensor) -> torch.Tensor:
        """Send what is still unsent, then add every gradient other ranks send for our rows into ``grad`` (rows
        = owned rows 0 .., at least the boundary ones) in place, piece by piece as they land (in a fixed order:
        by neighbour, then piece); returns ``grad``."""
        sched, ex = self.schedule, self.ex
        tr = self._open_backward()
        if sched.communicates:
            for i, sent in enumerate(self.sent):
                if not sent:    # a share that no gradient reached: what it has (zeros without any) goes now
                    if self.got[i] == 0:
                        ex.halo_grad[ex.plan.recv_slice(i)] = 0
                    for k, j in enumerate(ex.recv_msgs[i]):
                        if ex.staging is None:
                            tr.send(j)
                        elif self.got[i] == 0:   # (behind the sends queued before it)
                            tr.send_after(j, DONE)
                        else:
                            ex.staging.send_grad(i, k, j)
        order = [(q, k, j) for q, js in enumerate(ex.send_msgs) for k, j in enumerate(js)]
        nxt = 0
        for _ in chain([None], self._arrivals(tr)):  # what landed already (a blocking share waited), then as it lands
            while nxt < len(order) and tr.landed[order[nxt][2]]:
                self._add_piece(grad, *order[nxt][:2])
                nxt += 1
        return grad

    def _arrivals(self, tr):
        """``schedule.arrivals``, with ``fill``'s work (one step at a time, False when none is left) done while
        nothing has landed."""
        if self.fill is not None and self.schedule.pipelines:
            while not tr.landed.all():
                got = tr.test()
                if got:
                    yield got
                elif not self.fill():
                    break
        yield from self.schedule.arrivals(tr)

    def _add_piece(self, grad: torch.Tensor, q: int, k: int) -> None:
        ex = self.ex
        a, b = (int(v) for v in ex.send_pieces[q][k:k + 2])
        st = ex.staging
        got = torch.from_numpy(ex.grad_bufs[q][a:b]) if st is None else st.grad_rows(q, a, b)
        r = ex.send_ranges[q]
        if r is not None:
            grad[r[0] + a:r[0] + b].add_(got)
        else:
            idx = torch.from_numpy(ex.plan.send_idx[q][a:b]) if st is None else st.send_index(q)[a:b]
            grad.index_add_(0, idx, got.to(grad.dtype))


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx, payload, rnd, grads):
        ctx.rnd, ctx.grads = rnd, grads
        ctx.shape, ctx.device, ctx.dtype = payload.shape, payload.device, payload.dtype
        if rnd.schedule.communicates:
            if rnd.ex.staging is None:
                p = payload.detach().contiguous()
                rnd.ex.start_forward(p.numpy() if p.dtype == torch.float32 else p)
            else:
                rnd.ex.staging.start_forward(payload.detach())
        return payload.new_zeros(0)

    @staticmethod
    def backward(ctx, _):
        rnd = ctx.rnd
        if not ctx.grads:
            return None, None, None
        return rnd.add_received(torch.zeros(ctx.shape, dtype=ctx.dtype, device=ctx.device)), None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, rnd, i):
        ctx.rnd, ctx.i = rnd, i
        return rnd.halo(i)

    @staticmethod
    def backward(ctx, g):
        b = ctx.rnd.ex.recv_pieces[ctx.i]
        ctx.rnd._share(ctx.i, lambda k, buf, first: buf.copy_(g[b[k]:b[k + 1]]) if first
                       else buf.add_(g[b[k]:b[k + 1]]))
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
        ctx.rnd._share(ctx.i, lambda k, buf, first: spmm(mat_t[k], g, buf) if first else spmm_add(mat_t[k], g, buf))
        return g, g.new_zeros(0), None, None, None, None, None


class _Join(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, token):
        return out.view_as(out)

    @staticmethod
    def backward(ctx, g):
        return g, g.new_zeros(0)
