"""Distributed GCN layer (Kipf & Welling), numerically PyG ``GCNConv`` with its defaults.

    out = D^-1/2 (A + I) D^-1/2 X W + b,    D = global in-degree + 1

x [n_owned, in] -> [n_owned, out]. Parameters ``lin.weight`` [out, in] and ``bias`` [out], named as in PyG.
Since the aggregation is linear, (A X) W = A (X W): the layer multiplies by W first when that makes the rows that
travel narrower (in > out), and aggregates first otherwise.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.ops import Aggregation, DistGraph
from g3mpi.ops.deferred import linear

from .rowwise import RowwiseAggLayer


class GCNLayer(RowwiseAggLayer):
    input_product_is_aggregate = True

    def __init__(self, graph: DistGraph, in_dim: int, out_dim: int, name: str = "gcn"):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        self.transform_first = in_dim > out_dim
        self.agg = Aggregation(graph, "gcn", out_dim if self.transform_first else in_dim, name=name)

    # row-wise parts of forward, for the inter-layer pipeline (g3mpi.sched.layers.RowwiseLayer)
    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.lin.weight) if self.transform_first else x

    def root(self, x: torch.Tensor) -> None:
        return None     # (the self loop is part of the aggregation)

    def post(self, agg: torch.Tensor, aux) -> torch.Tensor:
        return agg + self.bias if self.transform_first else linear(agg, self.lin.weight, self.bias)

    def input_product_rows(self, agg_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """``input_product`` (A_hat x) of some rows, from their aggregate and their own input rows."""
        return agg_rows

    def from_input_product(self, c: torch.Tensor) -> torch.Tensor:
        return F.linear(c, self.lin.weight, self.bias)

    def forward(self, x: torch.Tensor, key=None, layer: int = 0) -> torch.Tensor:
        if self.transform_first:
            return self.agg(self.lin(x)) + self.bias
        return self.from_input_product(self.input_product(x))
