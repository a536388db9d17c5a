"""What the inter-layer pipeline (``g3mpi.ops.pipeline``) needs of a layer, so that it drives any row-wise layer
without knowing the model: the row-wise split of the layer contract ``g3mpi.nn.base.Layer`` (GCN, SAGE and user
layers implement it; GAT's attention is not row-wise).

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
    """``exchange``: the layer's ``HaloExchange``; ``groups``: (boundary, interior) ``RowGroup`` of its blocks.
    ``pre(x_rows) -> payload_rows``: what is aggregated (only that, so that the exchange starts early);
    ``root(x_rows) -> aux_rows``: the rows' own term, which needs no message (None if the layer has none);
    ``post(agg_rows, aux_rows) -> y_rows``: the layer's output rows."""

    exchange: Any
    groups: Any

    def pre(self, x): ...

    def root(self, x): ...

    def post(self, agg, aux): ...
