"""What the row-wise aggregation layers (GCN, SAGE) share beyond the layer contract (``g3mpi.nn.base.Layer``).

A subclass sets ``transform_first`` (multiply by its weights before the exchange when in > out) and ``agg`` (its
``g3mpi.ops.Aggregation``) in ``__init__``, and defines ``pre``/``post`` (the row-wise halves of forward that the
inter-layer pipeline drives: ``Layer``'s row-wise split) and ``input_product_rows``.
"""
from __future__ import annotations

import torch

from .base import Layer


class RowwiseAggLayer(Layer):
    #: its backward does not need its output (in-place activation); see ``GATLayer`` for a layer that is not
    #: row-wise and needs it
    output_free = True

    @property
    def aggregation(self):
        return self.agg

    @property
    def input_product_free(self) -> bool:
        """Its aggregation of the input needs no parameter (aggregate-first): a model may cache it."""
        return not self.transform_first

    # aggregate-first layers split into the parameter-free product of their input and the rest, so a model can
    # compute the first product once for a constant input (``GNN``, ``input_cache``)
    def input_product(self, x: torch.Tensor) -> torch.Tensor:
        """The aggregate-first layer's parameter-free product of ``x`` [n_owned, in] (see the subclass)."""
        return self.input_product_rows(self.agg(x), x)
