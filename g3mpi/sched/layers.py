"""What the inter-layer pipeline (``g3mpi.ops.pipeline``) reads of a layer, and nothing else: the row-wise split
of the layer contract ``g3mpi.nn.base.Layer``, so that the pipeline drives any row-wise layer without knowing the
model (GCN, SAGE and user layers; APPNP's and GCNII's steps implement it but run layer by layer,
``whole_aggregation``; GAT's attention is not row-wise).

A layer is ``pre`` (row-wise, before the exchange) -> aggregation -> ``post`` (row-wise), plus ``root``, its
row-wise term that needs no message; the pipeline computes them on the boundary rows first, so the next layer's
exchange leaves while the interior rows are computed, and computes ``root`` while messages travel.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

#: ``between(l, y_rows, rows)``: layer l's input rows from layer l-1's output rows ``y_rows`` (for l = 0, from the
#: model's input), ``rows`` the slice of owned rows they are (the model's activation and dropout)
Between = Callable[[int, Any, slice], Any]


@runtime_checkable
class RowwiseLayer(Protocol):
    """The one aggregation and its halves:

    ``aggregation``: the layer's ``g3mpi.ops.Aggregation`` (its ``blocks``, ``schedule``); ``exchange``: its
    ``HaloExchange``; ``groups``: (boundary, interior) ``RowGroup`` of its blocks, whose rows the pipeline
    aggregates by the groups' own blocks, boundary rows first. ``whole_aggregation``: the layer's rows must be
    summed as layer by layer, bit for bit (no local sum split by row group): ``run_stack`` then does not pipeline
    across its layers.
    ``pre(x_rows) -> payload_rows``: what is aggregated (only that, so that the exchange starts early);
    ``root(x_rows) -> aux_rows``: the rows' own term, which needs no message (None if the layer has none);
    ``scale_out(agg_rows, rows) -> agg_rows``: the aggregation's row scaling of owned rows ``rows`` (SAGE's mean);
    ``post(agg_rows, aux_rows) -> y_rows``: the layer's output rows.
    ``x_rows`` is what the stack's ``between`` returns: a tensor, or what the layer's ``pre`` and ``root`` take
    (APPNP's and GCNII's steps: the rows of their input and of the stack's initial term, a pair).

    A first layer whose product of a constant input the stack caches (``Layer.input_product_free``) also has
    ``input_product_rows(agg_rows, x_rows) -> c_rows`` (that product of some rows, from their aggregate) and
    ``from_input_product(c_rows) -> y_rows`` (its output from it)."""

    aggregation: Any
    exchange: Any
    groups: Any
    whole_aggregation: bool

    def pre(self, x): ...

    def root(self, x): ...

    def scale_out(self, agg, rows): ...

    def post(self, agg, aux): ...

    def input_product_rows(self, agg, x): ...

    def from_input_product(self, c): ...
