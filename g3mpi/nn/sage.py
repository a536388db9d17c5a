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


class SAGELayer(nn.Module):
    def __init__(self, graph: DistGraph, in_dim: int, out_dim: int, name: str = "sage"):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin_l = nn.Linear(in_dim, out_dim, bias=True)
        self.lin_r = nn.Linear(in_dim, out_dim, bias=False)
        self.transform_first = in_dim > out_dim
        self.agg = Aggregation(graph, "mean", out_dim if self.transform_first else in_dim, name=name)

    #: the layer interface of ``g3mpi.nn.model`` (see ``GATLayer``): row-wise (the inter-layer pipeline drives it
    #: through ``g3mpi.sched.layers.RowwiseLayer``), and its backward does not need its output (in-place activation)
    rowwise = True
    output_free = True

    @classmethod
    def build(cls, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, last: bool, name: str, **_):
        """(layer, its output width) for a layer of a model stack (``GNN``)."""
        o = out_dim if last else hidden
        return cls(graph, in_dim, o, name=name), o

    @property
    def input_product_free(self) -> bool:
        """Its aggregation of the input needs no parameter (aggregate-first): a model may cache it."""
        return not self.transform_first

    @property
    def exchange(self):
        return self.agg.ex

    @property
    def groups(self):
        return self.agg.groups

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

    # aggregate-first layers split into the parameter-free product of their input and the rest, so a model can
    # compute the first product once for a constant input (``GNN``, ``input_cache``)
    def input_product(self, x: torch.Tensor) -> torch.Tensor:
        """[mean_{j -> i} x_j, x_i] [n_owned, 2 * in] (aggregate-first layers only)."""
        return self.input_product_rows(self.agg(x), x)

    def input_product_rows(self, agg_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """``input_product`` of some rows, from their aggregate and their own input rows."""
        return torch.cat([agg_rows, x_rows], dim=1)

    def from_input_product(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(z, torch.cat([self.lin_l.weight, self.lin_r.weight], dim=1), self.lin_l.bias)
