"""Normalisation blocks of the recipe stack (``g3mpi.nn.recipe``): LayerNorm (per row, plain torch) and a
BatchNorm exact across ranks.

DistBatchNorm is ``torch.nn.BatchNorm1d`` over ALL nodes of the graph (every rank's rows), not over a rank's own:

    training:  mu = (1/N) sum_i x_i,   var = (1/N) sum_i (x_i - mu)^2          (every node i of every rank)
               y_i = (x_i - mu) / sqrt(var + eps) * weight + bias
               running_mean <- (1 - m) running_mean + m mu
               running_var  <- (1 - m) running_var  + m var N / (N - 1)        (unbiased, as torch)
    eval:      y_i = (x_i - running_mean) / sqrt(running_var + eps) * weight + bias

x [n_owned, C] -> [n_owned, C]. The sums are ``g3mpi.ops.reduce.global_mean`` (float64, an allreduce forward and
one backward), so the batch statistics, the gradients and the running statistics are those of a single-process
``BatchNorm1d`` on the whole graph, whatever the number of ranks. It subclasses ``BatchNorm1d``: the same
parameters and buffers (``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``), so its
state_dict loads into torch's and back. In training every rank must call it (a collective).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.ops import DistGraph
from g3mpi.ops.reduce import global_mean

#: --norm: none, LayerNorm per row, BatchNorm over every node of every rank
NORMS = ("none", "layer", "batch")


class DistBatchNorm(nn.BatchNorm1d):
    def __init__(self, graph: DistGraph, num_features: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__(num_features, eps=eps, momentum=momentum)
        self.graph = graph

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        n = self.graph.part.num_nodes
        mu = global_mean(x, self.graph)
        d = x - mu
        var = global_mean(d * d, self.graph)
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1 - m).add_(mu.detach(), alpha=m)
            self.running_var.mul_(1 - m).add_(var.detach() * (n / max(n - 1, 1)), alpha=m)
            self.num_batches_tracked.add_(1)
        return d * torch.rsqrt(var + self.eps) * self.weight + self.bias


def make_norm(kind: str, graph: DistGraph, width: int) -> nn.Module:
    """The normalisation ``kind`` (one of NORMS) of ``width`` features: Identity, LayerNorm or DistBatchNorm."""
    if kind == "layer":
        return nn.LayerNorm(width)
    if kind == "batch":
        return DistBatchNorm(graph, width)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"norm {kind!r}: expected one of {', '.join(NORMS)}")
