"""``Layer``: the one contract of a graph layer, which the built-in GCN, SAGE and GAT layers and APPNP's and GCNII's
steps implement and user layers write against (as PyG's ``MessagePassing``).

    forward(x, key=None, layer=0) -> y          x [n_owned, in] -> y [n_owned, out]

``key`` is the pass's ``DropoutKey`` (None in evaluation), ``layer`` the layer's index in its stack (what keys
the built-ins' dropout). A layer that is row-wise around ONE aggregation A,

    y = post(A @ pre(x), root(x))               pre, root, post: row-wise (each row from that row alone)

says so by returning that aggregation from ``aggregation`` (a ``Propagate(...).aggregation(width)`` or the
built-ins' ``g3mpi.ops.Aggregation``) and defining ``pre`` (what travels), ``root`` (the row's own term, which
needs no message; None if none) and ``post``; ``forward`` then follows from them, and ``run_stack`` (as the
built-in stacks) drives a stack of such layers with the inter-layer pipeline (``g3mpi.ops.pipeline``: boundary rows
first, the next layer's messages leaving while the interior rows are computed; what the pipeline reads of a layer
is ``g3mpi.sched.layers.RowwiseLayer``). ``x`` may be a tuple of row tensors where ``pre`` and ``root`` take one
(APPNP's and GCNII's steps: their input and the stack's initial term h0, which ``between`` hands with each row
range). Any other layer (attention, several propagations) overrides ``forward`` and runs layer by layer, each
primitive pipelined within itself.

Two properties let a stack save memory and work, both off by default (always safe): ``output_free`` (its backward
does not need its output: the stack may apply ReLU in place) and ``input_product_free`` (its aggregation of the
input needs no parameter: a stack may cache it for a constant input, ``input_product`` / ``from_input_product``).
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey
from g3mpi.ops.pipeline import forward_pipelined, layer_inputs


class Layer(nn.Module):
    #: attention heads and attention dropout apply to it (``--heads``, ``--out-heads``, ``--attn-dropout``)
    attention = False
    #: its backward does not need its output (the stack may apply its activation in place)
    output_free = False
    #: its aggregation of the input needs no parameter (the stack may cache it for a constant input)
    input_product_free = False
    #: that cached product is the aggregate alone (GCN), so the model may make it a few feature columns at a time
    input_product_is_aggregate = False
    #: each row is summed as by the layer-by-layer aggregation, bit for bit (APPNP's, GCNII's steps): a stack with
    #: such a layer runs layer by layer, each aggregation pipelined within itself (every row's local sum while its
    #: messages travel, the boundary rows' neighbour shares as they land), never split by row group
    whole_aggregation = False

    @classmethod
    def build(cls, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, last: bool, name: str, **_):
        """(layer, its output width) for layer ``name`` of a built-in stack (``GNN``): ``hidden`` wide, or
        ``out_dim`` when ``last``. Layers with heads take ``heads``, ``out_heads``, ``attn_dropout``."""
        o = out_dim if last else hidden
        return cls(graph, in_dim, o, name=name), o

    # -- the row-wise split (a layer that is not row-wise leaves ``aggregation`` None and overrides forward) --------
    @property
    def aggregation(self):
        """The one aggregation the layer is row-wise around (``exchange``, ``groups``, callable on [n, width]), or
        None."""
        return None

    @property
    def rowwise(self) -> bool:
        """The inter-layer pipeline may drive it (``pre``/``root``/``post`` around ``aggregation``)."""
        return self.aggregation is not None

    @property
    def exchange(self):
        return self.aggregation.ex

    @property
    def groups(self):
        """(boundary, interior) row groups of the aggregation's blocks (the inter-layer pipeline's)."""
        return self.aggregation.groups

    def scale_out(self, y: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """The aggregation's row scaling (SAGE's mean) of its rows ``rows``, ``y`` their unscaled aggregate."""
        return self.aggregation.blocks.scale_out(y, rows)

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of x -> the rows that are aggregated (and travel): [r, width]."""
        return x

    def root(self, x: torch.Tensor):
        """Rows of x -> the rows' own term (needs no message), or None."""
        return None

    def post(self, agg: torch.Tensor, aux) -> torch.Tensor:
        """The rows' aggregate and own term -> their output rows."""
        return agg if aux is None else agg + aux

    def input_product_rows(self, agg_rows: torch.Tensor, x_rows: torch.Tensor) -> torch.Tensor:
        """``input_product_free`` layers: the cached product of some rows, from their aggregate and input rows."""
        raise NotImplementedError(f"{type(self).__name__} keeps no product of its input (input_product_free)")

    def from_input_product(self, c: torch.Tensor) -> torch.Tensor:
        """``input_product_free`` layers: the output rows from the cached product of their input rows."""
        raise NotImplementedError(f"{type(self).__name__} keeps no product of its input (input_product_free)")

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None, layer: int = 0) -> torch.Tensor:
        if self.aggregation is None:
            raise NotImplementedError(f"{type(self).__name__}: define forward, or aggregation with pre/root/post")
        return self.post(self.aggregation(self.pre(x)), self.root(x))


def pipelines(graph: DistGraph, layers) -> bool:
    """``run_stack`` drives ``layers`` with the inter-layer pipeline: every layer is row-wise and may have its
    local sums split by row group (not ``whole_aggregation``), the schedule pipelines, and the rank has neighbours
    to exchange with."""
    return all(getattr(c, "rowwise", False) and not getattr(c, "whole_aggregation", False) for c in layers) and \
        graph.schedule.pipelines and bool(graph.plan.send_parts or graph.plan.recv_parts)


def run_stack(graph: DistGraph, layers, x: torch.Tensor, between, key: DropoutKey | None = None,
              c0=None, remat: bool = False) -> torch.Tensor:
    """``layers`` one after the other: ``y = layers[l](between(l, y, rows), key, l)``, starting from ``x``;
    ``between(l, y, rows)`` makes layer l's input from the rows ``rows`` (a slice of the owned rows) of the
    previous layer's output (for l = 0, of ``x``): the stack's activation and dropout, row-wise. When
    :func:`pipelines`, the stack runs with the inter-layer pipeline (the same result up to rounding: the local row
    sums are split in two); else layer by layer. ``c0``: the first layer's cached input product
    (``Layer.input_product_free``), as (boundary rows, interior rows) when :func:`pipelines`, else whole.

    ``remat`` (row-wise layers only; ``--remat cheap``): what lies between two aggregations (``post``,
    ``between``, the next ``pre`` and ``root``) keeps only its inputs for backward and is computed again there, by
    row chunks (``g3mpi.ops.remat``): less memory, the same values, parameter gradients equal up to summation
    order. ``between`` must then keep no state between calls (it runs again in backward)."""
    remat = bool(remat) and all(getattr(c, "rowwise", False) for c in layers)
    if pipelines(graph, layers):
        return forward_pipelined(list(layers), between, x, graph.schedule, graph.ctx.progress, c0, remat=remat)
    rows = slice(0, graph.num_owned)
    if remat:
        return _stack_remat(list(layers), x, between, c0, rows)
    for i, layer in enumerate(layers):
        x = layer.from_input_product(c0) if i == 0 and c0 is not None else layer(between(i, x, rows), key, i)
    return x


def _stack_remat(layers, x, between, c0, rows: slice) -> torch.Tensor:
    """:func:`run_stack` layer by layer with ``remat``: each layer as ``post(aggregation(pre(x)), root(x))``,
    what lies between two aggregations by :func:`g3mpi.ops.pipeline.layer_inputs`."""
    last = len(layers) - 1
    if c0 is not None:
        if last == 0:
            return layers[0].from_input_product(c0)
        first, make_x, inp = 1, (lambda r, c: between(1, layers[0].from_input_product(c), r)), c0
    else:
        first, make_x, inp = 0, (lambda r, xr: between(0, xr, r)), x
    p, root = layer_inputs(layers[first], rows, make_x, inp, remat=True)
    for l in range(first, last + 1):
        o = layers[l].aggregation(p)
        p, a = None, root()
        if l == last:
            return layers[l].post(o, a)
        p, root = layer_inputs(layers[l + 1], rows, _transition(layers, between, l), o, a, remat=True)


def _transition(layers, between, l: int):
    """Layer l+1's input rows from layer l's aggregate and own term rows."""
    return lambda r, o, a: between(l + 1, layers[l].post(o, a), r)
