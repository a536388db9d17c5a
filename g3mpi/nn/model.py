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
from g3mpi.ops.pipeline import forward_pipelined, input_product_groups

from .gat import GATLayer
from .gcn import GCNLayer
from .sage import SAGELayer

MODELS = ("gcn", "sage", "gat")
ACTIVATIONS = {"relu": F.relu, "elu": F.elu, "gelu": F.gelu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh}


def _same(a, b) -> bool:
    """The same row groups: both None, or the same index tensors (identity)."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class GNN(nn.Module):
    """``layers`` graph layers: in_dim -> hidden -> ... -> out_dim (state_dict keys ``convs.<i>.<param>``).

    GAT: hidden layers have ``heads`` heads of ``hidden`` channels, concatenated; the last has ``out_heads``
    heads, averaged.
    """

    def __init__(self, graph: DistGraph, model: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation: str = "relu", input_cache: bool = True):
        super().__init__()
        if model not in MODELS:
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
            last = i == layers - 1
            name = f"{model}{i}"
            if model == "gat":
                heads_i = out_heads if last else heads
                ch = out_dim if last else hidden
                convs.append(GATLayer(graph, d, ch, heads_i, concat=not last, attn_dropout=attn_dropout, name=name))
                d = ch if last else heads_i * ch
            else:
                o = out_dim if last else hidden
                convs.append((GCNLayer if model == "gcn" else SAGELayer)(graph, d, o, name=name))
                d = o
        self.convs = nn.ModuleList(convs)
        # the only first layer whose aggregation of the input needs no parameter: GCN or SAGE with in <= out
        self.input_cache_applies = model != "gat" and not convs[0].transform_first
        self.input_cache = bool(input_cache) and self.input_cache_applies
        self._cached = None     # (input tensor, its version, row groups, layer 0's input product)

    def _input_product(self, x: torch.Tensor, groups=None):
        """Layer 0's parameter-free product of ``x`` when it can be reused, else None. With ``groups`` (row index
        tensors, the pipeline's boundary and interior rows) a tuple of its rows per group: only that is kept."""
        if not self.input_cache or x.requires_grad or (self.training and self.dropout > 0):
            return None
        c = self._cached
        if c is None or c[0] is not x or c[1] != x._version or not _same(c[2], groups):
            self._cached = None     # the old product is freed before the new one is computed
            with torch.no_grad():
                val = self.convs[0].input_product(x) if groups is None else input_product_groups(self, x)
            c = self._cached = (x, x._version, groups, val)
        return c[3]

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        g = self.graph
        if (self.model != "gat" and g.schedule.mode == "pipelined" and g.schedule.interlayer
                and (g.plan.send_parts or g.plan.recv_parts)):
            B, I = g.row_groups(self.convs[0].agg.kind)
            return forward_pipelined(self, x, key, self._input_product(x, (B.rows, I.rows)))
        c0 = self._input_product(x)
        ids = self.graph.orig_ids
        last = len(self.convs) - 1
        for i, conv in enumerate(self.convs):
            if i == 0 and c0 is not None:
                x = conv.from_input_product(c0)
            else:
                x = node_dropout(x, key, i, ids, self.dropout, self.training)
                x = conv(x, key, i) if self.model == "gat" else conv(x)
            if i < last:
                x = self.activation(x)
        return x

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        """The hidden activation; ReLU in place on GCN/SAGE layer outputs (their backward does not need them),
        which saves one fresh [n, hidden] tensor per layer, and its backward masks the incoming gradient in place
        (``g3mpi.ops.activation``), which saves another during backward."""
        if self.act is F.relu and self.model != "gat":
            return relu_(x)
        return self.act(x)
