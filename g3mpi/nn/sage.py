"""Distributed GraphSAGE layer with mean aggregation and root weight, numerically PyG ``SAGEConv``.

    out_i = W_l mean_{j -> i} x_j + b_l + W_r x_i      (mean = 0 for a node without in-edges)

x [n_owned, in] -> [n_owned, out]. Parameters ``lin_l.weight`` [out, in], ``lin_l.bias`` [out],
``lin_r.weight`` [out, in], named as in PyG. The mean is linear, so W_l is applied before the exchange when
in > out (fewer bytes travel) and after it otherwise. The root term W_r x_i + b_l needs no message: the pipeline
computes it while the layer's messages travel (``root``), and every schedule adds it the same way.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.ops import Aggregation, DistGraph

from .rowwise import RowwiseAggLayer


class SAGELayer(RowwiseAggLayer):
    def __init__(self, graph: DistGraph, in_dim: int, out_dim: int, name: str = "sage"):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = in_dim > out_dim
        self.agg = Aggregation(graph, "mean", out_dim if self.transform_first else in_dim, name=name)

    # row-wise parts of forward, for the inter-layer pipeline (g3mpi.sched.layers.RowwiseLayer)
    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.lin_l.weight.t() if self.transform_first else x

    def root(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.lin_r.weight, self.lin_l.bias)

    def post(self, agg: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        if self.transform_first:
            return agg + aux
        return torch.addmm(aux, agg, self.lin_l.weight.t())

    def forward(self, x: torch.Tensor, key=None, layer: int = 0) -> torch.Tensor:
        return self.post(self.agg(self.pre(x)), self.root(x))

    def input_product_rows(self, agg_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """``input_product`` ([mean_{j -> i} x_j, x_i], [n, 2 * in]) of some rows, from their aggregate and their
        own input rows."""
        return torch.cat([agg_rows, x_rows], dim=1)

    def from_input_product(self, z: torch.Tensor) -> torch.Tensor:
        return self.post(z[:, :self.in_dim], self.root(z[:, self.in_dim:]))
