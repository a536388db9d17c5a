"""The model stack: dropout -> layer -> activation, repeated; the last layer has no activation.

Every layer sees dropout on its input (as in PyG's GCN and GAT examples), with masks keyed by original node ID
(``g3mpi.ops.dropout``), so the model and its training do not depend on the partition.

Input cache: when the first layer aggregates its raw input (GCN or SAGE with in <= out), that aggregation does
not depend on any parameter, so for a constant input (no input dropout in this pass: evaluation, or dropout 0,
and an input that needs no gradient) it is the same in every epoch. With ``input_cache`` (default) the model
computes it once per input tensor (identity and version) and reuses it: the first layer's halo exchange and
sparse product run once instead of every pass. Results are unchanged (the same tensor is computed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey, node_dropout
from g3mpi.ops.activation import relu_
from g3mpi.ops.pipeline import input_product_groups

from .base import pipelines, run_stack
from .gat import GATLayer
from .gcn import GCNLayer
from .sage import SAGELayer

#: model name -> layer class; each implements the layer contract ``g3mpi.nn.base.Layer`` (``build``,
#: ``forward(x, key, layer)``, and for GCN and SAGE the row-wise split that the inter-layer pipeline drives)
LAYERS = {"gcn": GCNLayer, "sage": SAGELayer, "gat": GATLayer}
MODELS = tuple(LAYERS)
ACTIVATIONS = {"relu": F.relu, "elu": F.elu, "gelu": F.gelu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh}


class GNN(nn.Module):
    """``layers`` graph layers: in_dim -> hidden -> ... -> out_dim (state_dict keys ``convs.<i>.<param>``).

    GAT: hidden layers have ``heads`` heads of ``hidden`` channels, concatenated; the last has ``out_heads``
    heads, averaged.
    """

    def __init__(self, graph: DistGraph, model: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation: str = "relu", input_cache: bool = True):
        super().__init__()
        if model not in LAYERS:
            raise ValueError(f"model {model!r}: expected one of {', '.join(MODELS)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r}: expected one of {', '.join(ACTIVATIONS)}")
        if layers < 1:
            raise ValueError("a model needs at least one layer")
        self.graph = graph
        self.model, self.dropout, self.act = model, float(dropout), ACTIVATIONS[activation]
        convs = []
        d = in_dim
        for i in range(layers):
            conv, d = LAYERS[model].build(graph, d, hidden, out_dim, i == layers - 1, f"{model}{i}", heads=heads,
                                          out_heads=out_heads, attn_dropout=attn_dropout)
            convs.append(conv)
        self.convs = nn.ModuleList(convs)
        self.rowwise = all(c.rowwise for c in convs)
        # the only first layer whose aggregation of the input needs no parameter: GCN or SAGE with in <= out
        self.input_cache_applies = convs[0].input_product_free
        self.input_cache = bool(input_cache) and self.input_cache_applies
        self._cached = None     # (input tensor, its version, row groups, layer 0's input product)

    def _input_product(self, x: torch.Tensor, groups=None):
        """Layer 0's parameter-free product of ``x`` when it can be reused, else None. With ``groups`` (the
        pipeline's boundary and interior row groups) a tuple of its rows per group: only that is kept."""
        if not self.input_cache or x.requires_grad or (self.training and self.dropout > 0):
            return None
        c = self._cached
        if c is None or c[0] is not x or c[1] != x._version or c[2] is not groups:
            self._cached = None     # the old product is freed before the new one is computed
            with torch.no_grad():
                conv = self.convs[0]
                val = conv.input_product(x) if groups is None else \
                    input_product_groups(conv, x, self.graph.schedule)
            c = self._cached = (x, x._version, groups, val)
        return c[3]

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        g, ids = self.graph, self.graph.orig_ids

        def between(l, y, rows):
            y = y if l == 0 else self.activation(y)
            return node_dropout(y, key, l, ids[rows], self.dropout, self.training)
        c0 = self._input_product(x, self.convs[0].groups if pipelines(g, self.convs) else None)
        return run_stack(g, self.convs, x, between, key, c0)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden activation; ReLU in place on outputs their layer's backward does not need (GCN, SAGE),
        which saves one fresh [n, hidden] tensor per layer, and its backward masks the incoming gradient in place
        (``g3mpi.ops.activation``), which saves another during backward."""
        if self.act is F.relu and self.convs[0].output_free:
            return relu_(x)
        return self.act(x)
