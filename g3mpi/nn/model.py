"""The model stack: dropout -> layer -> activation, repeated; the last layer has no activation.

Every layer sees dropout on its input (as in PyG's GCN and GAT examples), with masks keyed by original node ID
(``g3mpi.ops.dropout``), so the model and its training do not depend on the partition.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey, node_dropout
from g3mpi.ops.pipeline import forward_pipelined

from .gat import GATLayer
from .gcn import GCNLayer
from .sage import SAGELayer

MODELS = ("gcn", "sage", "gat")
ACTIVATIONS = {"relu": F.relu, "elu": F.elu, "gelu": F.gelu, "leaky_relu": F.leaky_relu, "tanh": torch.tanh}


class GNN(nn.Module):
    """``layers`` graph layers: in_dim -> hidden -> ... -> out_dim (state_dict keys ``convs.<i>.<param>``).

    GAT: hidden layers have ``heads`` heads of ``hidden`` channels, concatenated; the last has ``out_heads``
    heads, averaged.
    """

    def __init__(self, graph: DistGraph, model: str, in_dim: int, hidden: int, out_dim: int, layers: int = 2,
                 heads: int = 8, out_heads: int = 1, dropout: float = 0.0, attn_dropout: float = 0.0,
                 activation: str = "relu"):
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

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        g = self.graph
        if (self.model != "gat" and g.schedule.mode == "pipelined" and g.schedule.interlayer
                and (g.plan.send_parts or g.plan.recv_parts)):
            return forward_pipelined(self, x, key)
        ids = self.graph.orig_ids
        for i, conv in enumerate(self.convs):
            x = node_dropout(x, key, i, ids, self.dropout, self.training)
            x = conv(x, key, i) if self.model == "gat" else conv(x)
            if i < len(self.convs) - 1:
                x = self.act(x)
        return x
