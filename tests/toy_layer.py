"""A toy built-in layer for tests/test_specs.py's "adding a built-in layer" (docs/MODELS.md): the layer file, the
first of the two edits (the second, its registry entry, is tests/mpi_toy_model.py's).

    y_i = sum_{j -> i} W x_j + (1 + eps) W x_i + b          (GIN's sum with a scaled self term, one linear)

Row-wise around one sum aggregation, so the inter-layer pipeline drives it as it drives GCN.
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.nn import Layer
from g3mpi.ops import Aggregation


class ToyLayer(Layer):
    output_free = True

    def __init__(self, graph, in_dim: int, out_dim: int, eps: float = 0.0, name: str = "toy"):
        super().__init__()
        self.eps = float(eps)
        self.lin = nn.Linear(in_dim, out_dim)
        self.agg = Aggregation(graph, "sum", out_dim, name=name)

    @classmethod
    def build(cls, graph, in_dim, hidden, out_dim, last, name, *, eps: float = 0.0, **_):
        o = out_dim if last else hidden
        return cls(graph, in_dim, o, eps=eps, name=name), o

    @property
    def aggregation(self):
        return self.agg

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.lin.weight.t()

    def root(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.lin.bias, x, self.lin.weight.t(), alpha=1 + self.eps)
