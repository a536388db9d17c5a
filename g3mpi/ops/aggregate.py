"""Distributed sparse aggregation ``out = A_rank @ [h_own; h_halo]`` as one autograd Function.

Forward runs the halo exchange of ``h`` and the block products under the rank's schedule; backward runs the
transposed blocks (precomputed, see ``g3mpi.sched.blocks``), sends each halo gradient back to its owner and sums
the gradients other ranks send for our rows. Edge weights are constants (GCN normalisation, SAGE mean).
"""
from __future__ import annotations

import torch

from .graph import DistGraph


class _DistSpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, agg):
        ctx.agg = agg
        return agg.schedule.spmm_forward(agg.blocks, agg.ex, h.detach().contiguous())

    @staticmethod
    def backward(ctx, g):
        agg = ctx.agg
        return agg.schedule.spmm_backward(agg.blocks, agg.ex, g.contiguous()), None


class Aggregation:
    """One layer's distributed aggregation: blocks of an edge weighting, its own exchange (width, tags).

    ``__call__(h)`` with ``h`` [n_owned, width] float32 returns [n_owned, width]:
    ``out_i = sum_{j -> i} w_ij h_j (+ w_ii h_i with self loops)``, j ranging over owned and halo rows.
    """

    def __init__(self, graph: DistGraph, kind: str, width: int, name: str = ""):
        self.graph = graph
        self.kind = kind
        self.blocks = graph.blocks(kind)
        self.ex = graph.exchange(width, name=name or kind)
        self.width = int(width)

    @property
    def schedule(self):
        return self.graph.schedule

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if h.shape != (self.graph.num_owned, self.width) or h.dtype != torch.float32:
            raise ValueError(f"aggregation expects float32 [{self.graph.num_owned}, {self.width}], got "
                             f"{h.dtype} {tuple(h.shape)}")
        return _DistSpMM.apply(h, self)
