"""GCNII (Chen et al., ICML 2020): deep GCN with initial residual and identity mapping, numerically PyG's
``GCN2Conv`` (shared weights, GCN normalisation with self loops) in the model of its ``gcn2_cora.py`` example.

One layer l = 1..L, with x^0 the output of the input linear layer and beta_l = log(theta / l + 1):

    s = (1 - alpha) A_hat x + alpha x^0                       A_hat = D^-1/2 (A + I) D^-1/2
    out = (1 - beta_l) s + beta_l s W                         W [C, C] (``weight1``, as PyG; no bias)

The model: x^0 = act(Linear(dropout(x))) [n, C]; L layers x <- act(GCN2(dropout(x), x^0)); out =
Linear(dropout(x)) [n, out]. Parameters ``lins.0``, ``lins.1`` (Linear) and ``convs.<i>.weight1``. Each layer is a
row-wise ``Layer`` (``g3mpi.nn.base``) around one exact distributed GCN aggregation of width C: its input rows are
(dropout(x), x^0), what travels the first, its own term alpha x^0; ``run_stack`` drives the L layers layer by
layer (``Layer.whole_aggregation``), each aggregation pipelined within itself, the activation and dropout between
them.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey, node_dropout

from .appnp import APPNPStep
from .base import run_stack


class GCN2Layer(APPNPStep):
    """Input rows (x, x^0), [r, C] each -> [r, C]; ``layer`` is l (from 1), which sets beta_l. s is APPNP's step
    (its base: the same aggregation, own term and sums), then the identity mapping."""

    def __init__(self, graph: DistGraph, channels: int, alpha: float, theta: float, layer: int, name: str = "gcn2"):
        super().__init__(graph, channels, alpha, name=name)
        self.beta = math.log(theta / layer + 1)
        self.weight1 = nn.Parameter(torch.empty(channels, channels))
        nn.init.xavier_uniform_(self.weight1)

    def post(self, agg: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        s = super().post(agg, aux)
        return torch.addmm(s, s, self.weight1, beta=1.0 - self.beta, alpha=self.beta)


class GCN2(nn.Module):
    """Input linear -> ``layers`` GCNII layers of ``hidden`` channels -> output linear (see the module docstring);
    ``convs``: the GCNII layers."""

    def __init__(self, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 alpha: float = 0.1, theta: float = 0.5, dropout: float = 0.0, act=torch.relu):
        super().__init__()
        self.graph, self.dropout, self.act = graph, float(dropout), act
        self.lins = nn.ModuleList([nn.Linear(in_dim, hidden), nn.Linear(hidden, out_dim)])
        self.convs = nn.ModuleList(GCN2Layer(graph, hidden, alpha, theta, l + 1, name=f"gcn2{l}")
                                   for l in range(layers))

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        ids = self.graph.orig_ids
        L, n = len(self.convs), self.graph.num_owned

        def drop(h, site, rows=slice(None)):
            return node_dropout(h, key, site, ids[rows], self.dropout, self.training)
        x0 = self.act(self.lins[0](drop(x, L)))

        def between(l, y, rows):    # layer l's input rows: dropout(act(previous output)), and x^0's
            h = drop(y if l == 0 else self.act(y), l, rows)
            return h, (x0 if rows == slice(0, n) else x0[rows])
        x = self.act(run_stack(self.graph, self.convs, x0, between, key))
        return self.lins[1](drop(x, L + 1))


def build(graph: DistGraph, cfg, in_dim: int, out_dim: int) -> GCN2:
    """The registry's builder (``g3mpi.nn.specs``): GCNII of the configuration ``cfg``."""
    from .model import ACTIVATIONS
    return GCN2(graph, in_dim, cfg.hidden, out_dim, layers=cfg.layers, alpha=cfg.alpha, theta=cfg.theta,
                dropout=cfg.dropout, act=ACTIVATIONS[cfg.activation])
