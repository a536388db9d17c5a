"""Exact reductions over the rows of every rank (all nodes of the graph), as autograd ops.

    global_sum(x, graph)  = sum_i x_i        over every node i of the graph      x [n_owned, *] -> [*]
    global_mean(x, graph) = global_sum(x, graph) / count      count: the graph's node count unless given
    global_max(x, graph)  = max_i x_i        (an empty rank contributes -inf)

The result is the same tensor on every rank. Sums are taken in float64 (each rank's rows, then across ranks) and
rounded once to ``x``'s dtype, so they equal a single process's sum up to float64 rounding, whatever the number of
ranks; maxima are exact.

Backward: every rank's loss may use the reduced value, and the job's loss is the sum of the ranks' losses, so the
gradient of a row is the sum over ranks of the upstream gradients (one more allreduce): ``grad x_i = sum_r g_r`` for
the sum, divided by ``count`` for the mean, and for the max shared equally among the entries equal to the maximum on
all ranks (as ``torch.amax``). Every rank must call a reduction at the same point of forward (and so of backward):
they are collectives. Ranks never call MPI from a layer: this op does, on the graph's communication context.
"""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from .graph import DistGraph


def allreduce(graph: DistGraph, buf: np.ndarray, op=MPI.SUM, what: str = "global reduction") -> np.ndarray:
    """In-place ``Allreduce`` of the numpy buffer ``buf`` over the graph's ranks (under the watchdog's deadline when
    the graph's context has one); returns ``buf``."""
    wd = graph.ctx.watchdog
    if wd is not None:
        wd.allreduce(buf, op=op, what=what)
    else:
        graph.ctx.comm.Allreduce(MPI.IN_PLACE, buf, op=op)
    return buf


def _sum64(graph: DistGraph, x: torch.Tensor) -> np.ndarray:
    """float64 sum over dim 0 of every rank's ``x`` (numpy, shape ``x.shape[1:]``)."""
    local = x.detach().to("cpu", torch.float64).sum(dim=0).numpy()
    return allreduce(graph, np.ascontiguousarray(local))


class _GlobalSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, graph, scale):
        ctx.graph, ctx.scale, ctx.shape = graph, scale, x.shape
        return torch.from_numpy(_sum64(graph, x) * scale).to(x.dtype).to(x.device)

    @staticmethod
    def backward(ctx, g):
        gs = torch.from_numpy(_sum64(ctx.graph, g.unsqueeze(0)) * ctx.scale).to(g.dtype).to(g.device)
        return gs.unsqueeze(0).expand(ctx.shape).contiguous(), None, None


class _GlobalMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, graph):
        xd = x.detach()
        local = torch.full(x.shape[1:], float("-inf"), dtype=x.dtype, device=x.device)
        if x.shape[0]:
            local = xd.amax(dim=0)
        m = torch.from_numpy(allreduce(graph, np.ascontiguousarray(local.cpu().numpy()), MPI.MAX)).to(x.device)
        ctx.graph = graph
        ctx.save_for_backward(xd, m)
        return m.clone()

    @staticmethod
    def backward(ctx, g):
        x, m = ctx.saved_tensors
        at = x == m.unsqueeze(0)
        ties = _sum64(ctx.graph, at.to(torch.float64))
        gs = _sum64(ctx.graph, g.unsqueeze(0)) / np.maximum(ties, 1.0)
        return at.to(g.dtype) * torch.from_numpy(gs).to(g.dtype).to(g.device).unsqueeze(0), None


def global_sum(x: torch.Tensor, graph: DistGraph) -> torch.Tensor:
    """Sum over the rows of every rank: [n_owned, *] -> [*] (see the module docstring)."""
    return _GlobalSum.apply(x, graph, 1.0)


def global_mean(x: torch.Tensor, graph: DistGraph, count: float | None = None) -> torch.Tensor:
    """``global_sum(x) / count``; ``count`` defaults to the graph's node count (every rank passes the same)."""
    n = float(graph.part.num_nodes if count is None else count)
    if n <= 0:
        raise ValueError(f"global_mean over {n:g} rows")
    return _GlobalSum.apply(x, graph, 1.0 / n)


def global_max(x: torch.Tensor, graph: DistGraph) -> torch.Tensor:
    """Maximum over the rows of every rank: [n_owned, *] -> [*] (see the module docstring)."""
    return _GlobalMax.apply(x, graph)
