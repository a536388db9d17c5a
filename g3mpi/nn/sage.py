"""Distributed GraphSAGE layer with mean aggregation and root weight, numerically PyG ``SAGEConv``.

    out_i = W_l mean_{j -> i} x_j + b_l + W_r x_i      (mean = 0 for a node without in-edges)

x [n_owned, in] -> [n_owned, out]. Parameters ``lin_l.weight`` [out, in], ``lin_l.bias`` [out],
``lin_r.weight`` [out, in], named as in PyG. The mean is linear, so W_l is applied before the exchange when
in > out (fewer bytes travel) and after it otherwise.
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

    # row-wise halves of forward, for the inter-layer pipeline (g3mpi.ops.pipeline)
    def pre(self, x: torch.Tensor):
        if self.transform_first:
            hw = x @ torch.cat([self.lin_l.weight, self.lin_r.weight]).t()
            return hw[:, :self.out_dim].contiguous(), hw[:, self.out_dim:]
        return x, None

    def post(self, agg: torch.Tensor, aux, x: torch.Tensor) -> torch.Tensor:
        if self.transform_first:
            return agg + self.lin_l.bias + aux
        return F.linear(torch.cat([agg, x], dim=1), torch.cat([self.lin_l.weight, self.lin_r.weight], dim=1),
                        self.lin_l.bias)

    def forward(self, x: torch.Tensor, key=None, layer: int = 0) -> torch.Tensor:
        # W_l and W_r act on the same rows: one matrix product [.., 2*out] (or [.., 2*in] input) instead of two
        o = self.out_dim
        if self.transform_first:
            hw = x @ torch.cat([self.lin_l.weight, self.lin_r.weight]).t()
            return self.agg(hw[:, :o].contiguous()) + self.lin_l.bias + hw[:, o:]
        return self.from_input_product(self.input_product(x))

    def input_product_rows(self, agg_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """``input_product`` ([mean_{j -> i} x_j, x_i], [n, 2 * in]) of some rows, from their aggregate and their
        own input rows."""
        return torch.cat([agg_rows, x_rows], dim=1)

    def from_input_product(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, torch.cat([self.lin_l.weight, self.lin_r.weight], dim=1), self.lin_l.bias)
