"""Distributed sparse aggregation ``out = A_rank @ [h_own; h_halo]`` of one layer (GCN, SAGE), layer by layer.

The halo exchange runs through ``g3mpi.ops.exchange`` (the path every layer uses). Forward: the exchange of ``h``
starts, the local block is computed by row chunks written in place into the output (``Schedule.rows_per_chunk``),
each neighbour's block is computed piece by piece as the pieces of its message land (the block's columns of that
piece; polled between chunks, then waited for; ``blocking``: all messages first, each block whole), and the
neighbour blocks are added in a fixed order. Backward mirrors it: each neighbour's halo
gradient is computed (its precomputed transpose) into the exchange's buffer and sent at once, then the local
transpose runs by chunks, polling, while the gradients for our rows arrive; they are added in place. Edge
weights are constants (GCN normalisation; SAGE's mean, a row scaling of the pattern: ``BlockMatrix.scale_out``).
"""
from __future__ import annotations

import torch

from .blocks import spmm
from .exchange import HaloRound
from .graph import DistGraph


class _Local(torch.autograd.Function):
    """``local @ h`` by row chunks, ``between()`` after each; backward ``local^T @ g`` by chunks, polling, plus the
    gradients other ranks send for our rows."""

    @staticmethod
    def forward(ctx, h, agg, rnd, between):
        ctx.agg, ctx.rnd = agg, rnd
        blocks = agg.blocks
        out = h.new_empty(blocks.num_owned, h.shape[1] // blocks.fold)
        for a, b, mat in blocks.chunks(agg.schedule.rows_per_chunk(h.shape[1], rnd.ex.forward.num_recvs)):
            spmm(mat, h, out[a:b])
            between()
        return out

    @staticmethod
    def backward(ctx, g):
        agg, rnd = ctx.agg, ctx.rnd
        sched, tr = agg.schedule, rnd.ex.backward
        g = g.contiguous()
        f = agg.blocks.fold     # (a typed block's transpose has R rows per owned row: [n R, F] is [n, R F])
        grad = agg.new_rows((agg.blocks.num_owned, g.shape[1] * f), g).view(agg.blocks.num_owned * f, g.shape[1])
        for a, b, mat in agg.blocks.transpose_chunks(sched.rows_per_chunk(g.shape[1], tr.num_recvs)):
            spmm(mat, g, grad[a:b])
            sched.poll(tr)
        return rnd.add_received(grad.view(agg.blocks.num_owned, g.shape[1] * f)), None, None, None


class Aggregation:
    """One layer's distributed aggregation: blocks of an edge weighting, its own exchange (width, tags).

    ``__call__(h)`` with ``h`` [n_owned, width] float32 (or bfloat16: bf16-mixed) returns [n_owned, width] of its
    dtype:
    ``out_i = sum_{j -> i} w_ij h_j (+ w_ii h_i with self loops)``, j ranging over owned and halo rows; for a
    typed kind (R relations, ``width`` = R F) [n_owned, F]: ``out_i = sum_r sum_{j -r-> i} w_ir h_{j,r}``, h's
    row j read as [R, F] (one exchange of the whole rows, one product over one typed block).
    """

    def __init__(self, graph: DistGraph, kind: str, width: int, name: str = ""):
        self.graph = graph
        self.kind = kind
        self.blocks = graph.blocks(kind)
        self.ex = graph.exchange(width, name=name or kind)
        self.width = int(width)
        if self.width % self.blocks.fold:
            raise ValueError(f"a typed aggregation over {self.blocks.fold} relations needs rows of R * F values, "
                             f"got {self.width}")

    def new_rows(self, shape, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised tensor of ``like``'s dtype for rows of the aggregation's input (their gradients):
        a typed kind's are R times wider, and come from the graph's reused storage (``ScratchPool``)."""
        if self.blocks.fold > 1:
            return self.graph.scratch.empty(shape, like.dtype)
        return like.new_empty(shape)

    @property
    def out_width(self) -> int:
        """Width of the result: ``width``, or F = width / R for a typed kind."""
        return self.width // self.blocks.fold

    @property
    def schedule(self):
        return self.graph.schedule

    @property
    def groups(self):
        """(boundary, interior) row groups of this aggregation's blocks (the inter-layer pipeline's)."""
        return self.graph.row_groups(self.kind)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape != (self.graph.num_owned, self.width) or h.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"aggregation expects float32 or bfloat16 [{self.graph.num_owned}, {self.width}], got "
                             f"{h.dtype} {tuple(h.shape)}")
        h = h.contiguous()
        rnd = HaloRound(self.ex, self.schedule)
        return self.finish(h, rnd, rnd.start(h))

    def finish(self, h: torch.Tensor, rnd: HaloRound, token: torch.Tensor) -> torch.Tensor:
        """The aggregation of ``h`` (contiguous [n_owned, width]) whose exchange ``rnd`` has started already
        (``token = rnd.start(payload)``, the payload's send rows those of ``h``: the inter-layer pipeline starts it
        from the boundary rows before the interior rows exist)."""
        sched, nbs, bounds = self.schedule, self.blocks.neighbours, self.ex.recv_pieces
        parts, rows = [None] * len(nbs), [nb.rows for nb in nbs]

        def compute(landed):
            for i, k in landed:     # piece k of neighbour i: the block's rows it completes
                fwd = nbs[i].pieces(bounds[i])[0]
                parts[i], rows[i] = fwd.product(parts[i], k, rnd.landed_halo(i, k)), fwd.rows

        if sched.waits_first:       # the baseline: every message, then each block whole
            for i in rnd.rest():
                parts[i] = spmm(nbs[i].mat, rnd.halo(i))
        out = _Local.apply(h, self, rnd, lambda: compute(rnd.landed_pieces()))
        while got := rnd.next_pieces():     # each piece as it lands: only the rows it completes follow the wire
            compute(got)
        for i, nb in enumerate(nbs):      # fixed order: the result does not depend on arrival order
            out = rnd.add(out, token, i, parts[i], rows[i], nb.pieces(bounds[i])[1])
        return self.blocks.scale_out(rnd.join(out, token))
