"""The model stack: dropout -> layer -> activation, repeated; the last layer has no activation.

Every layer sees dropout on its input (as in PyG's GCN and GAT examples), with masks keyed by original node ID
(``g3mpi.ops.dropout``), so the model and its training do not depend on the partition.

Input cache: when the first layer aggregates its raw input (GCN or SAGE with in <= out), that aggregation does
not depend on any parameter, so for a constant input (no input dropout in this pass: evaluation, or dropout 0,
and an input that needs no gradient) it is the same in every epoch. With ``input_cache`` (default) the model
computes it once per input tensor (identity and version) and reuses it: the first layer's halo exchange and
sparse product run once instead of every pass. Results are unchanged (the same tensor is computed).

Input halo: the trainer may also hand the model the halo rows of its input, fetched once in the dtype the part
file stores (``keep_input_halo``: float16 features travel as float16). With input dropout, the first layer's
aggregation then runs on this rank alone in every pass: the halo rows are widened neighbour by neighbour and
dropped with the masks their owners would draw (keyed by original node ID), so the first layer sends nothing
and the result is the one its exchange gave.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.format.features import widen
from g3mpi.ops import DistGraph, DropoutKey, node_dropout
from g3mpi.ops.activation import relu_
from g3mpi.ops.pipeline import input_product_groups, input_product_local

from . import specs
from .base import pipelines, run_stack

ACTIVATIONS = {"relu": F.relu, "elu": F.elu, "gelu": F.gelu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh}


class GNN(nn.Module):
    """``layers`` graph layers: in_dim -> hidden -> ... -> out_dim (state_dict keys ``convs.<i>.<param>``).

    GAT: hidden layers have ``heads`` heads of ``hidden`` channels, concatenated; the last has ``out_heads``
    heads, averaged.
    """

    def __init__(self, graph: DistGraph, model: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation: str = "relu", input_cache: bool = True, remat: bool = False, **settings):
        super().__init__()
        stacks = [m for m, sp in specs.MODELS.items() if sp.layer]
        if model not in stacks:
            raise ValueError(f"model {model!r}: expected one of {', '.join(stacks)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
        if layers < 1:
            raise ValueError("a model needs at least one layer")
        self.graph = graph
        self.model, self.dropout, self.act = model, float(dropout), ACTIVATIONS[activation]
        make_layer = specs.spec(model).load_layer()    # (its ``Layer``: g3mpi.nn.base)
        convs = []
        d = in_dim
        for i in range(layers):
            conv, d = make_layer.build(graph, d, hidden, out_dim, i == layers - 1, f"{model}{i}", heads=heads,
                                       out_heads=out_heads, attn_dropout=attn_dropout, **settings)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.rowwise = all(c.rowwise for c in convs)
        # the only first layer whose aggregation of the input needs no parameter: GCN or SAGE with in <= out
        self.input_cache_applies = convs[0].input_product_free
        self.input_cache = bool(input_cache) and self.input_cache_applies
        #: recompute what lies between two aggregations in backward (``run_stack``'s ``remat``; row-wise layers)
        self.remat = bool(remat) and self.rowwise
        for c in convs:     # attention layers recompute their per-edge terms instead
            if c.attention:
                c.remat = bool(remat)
        self._cached = None     # (input tensor, its version, row groups, layer 0's input product)
        self._halo = None       # (input tensor, its version, its halo rows as stored, their dtype's name)

    def keep_input_halo(self, x: torch.Tensor, halo: np.ndarray, dtype: str = "float32") -> None:
        """Keep ``halo`` [n_halo, in], the halo rows of the input ``x`` (``DistGraph.halo_rows``) in the stored
        feature dtype ``dtype`` (``g3mpi.format.features``), for passes over this very ``x`` (module docstring)."""
        if not self.input_cache_applies:
            raise ValueError("keep_input_halo: the first layer does not aggregate its raw input")
        if tuple(halo.shape) != (self.graph.num_halo, x.shape[1]):
            raise ValueError(f"keep_input_halo: expected [{self.graph.num_halo}, {x.shape[1]}] halo rows, got "
                             f"{tuple(halo.shape)}")
        self._halo = (x, x._version, halo, dtype)

    @property
    def kept_input_halo(self) -> np.ndarray | None:
        """The halo rows kept by :meth:`keep_input_halo` (as stored), or None (g3-bench counts them)."""
        return None if self._halo is None else self._halo[2]

    def _halo_of(self, x: torch.Tensor, key: DropoutKey | None, cols: slice = slice(None)):
        """``halo(i)``: receive neighbour i's kept halo rows of ``x`` (its columns ``cols``), of x's type, dropped as
        layer 0's input in this pass; None where no halo of this ``x`` is kept."""
        h = self._halo
        if h is None or h[0] is not x or h[1] != x._version:
            return None
        plan, ids, stored, dtype = self.graph.plan, self.graph.halo_ids, h[2], h[3]
        first = cols.start or 0

        def halo(i):
            rows = plan.recv_slice(i)
            block = torch.from_numpy(widen(stored[rows, cols], dtype)).to(x.dtype)   # (bf16-mixed: bf16)
            return node_dropout(block, key, 0, ids[rows], self.dropout, self.training, first)
        return halo

    def _input_product(self, x: torch.Tensor, key: DropoutKey | None, groups=None):
        """Layer 0's parameter-free product of ``x`` when it can be reused or computed on this rank alone, else
        None. With ``groups`` (the pipeline's boundary and interior row groups) a tuple of its rows per group."""
        if not self.input_cache or x.requires_grad:
            return None
        halo = self._halo_of(x, key)
        if self.training and self.dropout > 0:      # dropped anew in every pass: only with the kept halo
            if self.remat:      # memory first: evaluation's product is not kept through the training steps
                self._cached = None
            if halo is None:
                return None
            with torch.no_grad():
                if self.convs[0].input_product_is_aggregate:
                    return self._dropped_product(x, key, groups)
                return self._product(node_dropout(x, key, 0, self.graph.orig_ids, self.dropout, True), halo, groups)
        c = self._cached
        if c is None or c[0] is not x or c[1] != x._version or c[2] is not groups:
            self._cached = None     # the old product is freed before the new one is computed
            with torch.no_grad():
                val = self._product(x, halo, groups)
            c = self._cached = (x, x._version, groups, val)
        return c[3]

    #: feature columns of the dropped input made at a time (a multiple of 4, the dropout masks' column groups)
    DROP_COLUMNS = 8

    def _dropped_product(self, x: torch.Tensor, key: DropoutKey, groups):
        """Layer 0's input product of ``x`` under this pass's dropout (its input product being its aggregate), made
        DROP_COLUMNS feature columns at a time, so that no dropped copy of the whole input exists: the same values
        (each output column is its own sums)."""
        n, F = x.shape
        sizes = (n,) if groups is None else (groups[0].size, groups[1].size)
        outs = [x.new_empty(r, F) for r in sizes]
        for f0 in range(0, F, self.DROP_COLUMNS):
            cols = slice(f0, min(F, f0 + self.DROP_COLUMNS))
            xd = node_dropout(x[:, cols], key, 0, self.graph.orig_ids, self.dropout, True, f0)
            got = self._product(xd, self._halo_of(x, key, cols), groups)
            del xd
            for out, o in zip(outs, (got,) if groups is None else got):
                out[:, cols] = o
            del got
        return outs[0] if groups is None else tuple(outs)

    def _product(self, x: torch.Tensor, halo, groups):
        """Layer 0's input product of ``x``, its halo rows from ``halo(i)`` (None: through its exchange), whole or
        per row group."""
        conv = self.convs[0]
        if groups is not None:
            return input_product_groups(conv, x, self.graph.schedule, halo)
        return conv.input_product(x) if halo is None else input_product_local(conv, x, halo)

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        g, ids = self.graph, self.graph.orig_ids

        def between(l, y, rows):
            y = y if l == 0 else self.activation(y)
            return node_dropout(y, key, l, ids[rows], self.dropout, self.training)
        c0 = self._input_product(x, key, self.convs[0].groups if pipelines(g, self.convs) else None)
        return run_stack(g, self.convs, x, between, key, c0, remat=self.remat)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden activation; ReLU in place on outputs their layer's backward does not need (GCN, SAGE),
        which saves one fresh [n, hidden] tensor per layer, and its backward masks the incoming gradient in place
        (``g3mpi.ops.activation``), which saves another during backward."""
        if self.act is F.relu and self.convs[0].output_free:
            return relu_(x)
        return self.act(x)
