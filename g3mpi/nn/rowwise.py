"""What the row-wise aggregation layers (GCN, SAGE) share of the layer interface of ``g3mpi.nn.model``.

A subclass sets ``transform_first`` (multiply by its weights before the exchange when in > out) and ``agg`` (its
``g3mpi.ops.Aggregation``) in ``__init__``, and defines ``pre``/``post`` (the row-wise halves of forward that the
inter-layer pipeline drives through ``g3mpi.sched.layers.RowwiseLayer``) and ``input_product_rows``.
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.ops import DistGraph


class RowwiseAggLayer(nn.Module):
    #: row-wise (the inter-layer pipeline may drive it), and its backward does not need its output (in-place
    #: activation); see ``GATLayer`` for a layer that is neither. No attention heads (``heads``, ``attn_dropout``)
    attention = False
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

    # aggregate-first layers split into the parameter-free product of their input and the rest, so a model can
    # compute the first product once for a constant input (``GNN``, ``input_cache``)
    def input_product(self, x: torch.Tensor) -> torch.Tensor:
        """The aggregate-first layer's parameter-free product of ``x`` [n_owned, in] (see the subclass)."""
        return self.input_product_rows(self.agg(x), x)
