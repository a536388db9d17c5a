"""A GCN written from the public primitives: ``Linear`` then ``Propagate(graph, "gcn")`` per layer.

    mpiexec -n 2 g3-train --parts PARTS --out RUN --model-file docs/examples/user_gcn.py:build --layers 2 --hidden 16

Layer i:  x_{i+1} = act( D^-1/2 (A + I) D^-1/2 dropout(x_i) W_i + b_i ),  no activation after the last layer:
the built-in GCN's maths, parameter names (``convs.<i>.lin.weight``, ``convs.<i>.bias``) and initialisation, so
with the same seed and no dropout it gives the built-in ``--model gcn``'s logits and gradients.
"""
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn


class GCNConv(nn.Module):
    """x [n, in] -> [n, out]: multiply by W, propagate with GCN weights (self loops added), add the bias."""

    def __init__(self, graph, in_dim, out_dim):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        self.prop = gnn.Propagate(graph, "gcn")      # its own halo exchange: one per layer

    def forward(self, x):
        return self.prop(self.lin(x)) + self.bias


class GCN(nn.Module):
    def __init__(self, graph, in_dim, hidden, out_dim, layers=2, dropout=0.5):
        super().__init__()
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList([GCNConv(graph, a, b) for a, b in zip(dims, dims[1:])])
        self.drops = nn.ModuleList([gnn.Dropout(graph, dropout) for _ in range(layers)])

    def forward(self, x, key=None):
        for i, (drop, conv) in enumerate(zip(self.drops, self.convs)):
            x = conv(drop(x, key))
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def build(graph, in_dim, out_dim, cfg):
    """g3-train's entry point: the graph handle, input and output widths, the run's configuration."""
    return GCN(graph, in_dim, cfg.hidden, out_dim, layers=cfg.layers, dropout=cfg.dropout)
