"""A GCN written from the public primitives: per layer ``Propagate(graph, "gcn")`` and a ``Linear``.

    mpiexec -n 2 g3-train --parts PARTS --out RUN --model-file docs/examples/user_gcn.py:build --layers 2 --hidden 16

Layer i:  x_{i+1} = act( D^-1/2 (A + I) D^-1/2 dropout(x_i) W_i + b_i ),  no activation after the last layer:
the built-in GCN's maths, parameter names (``convs.<i>.lin.weight``, ``convs.<i>.bias``) and initialisation, so
with the same seed and no dropout it trains the built-in ``--model gcn``'s model. The layer is row-wise around its
one propagation (``pre`` -> propagate -> ``post``), so ``gnn.run_stack`` pipelines the stack across layers as the
built-in stacks are; with ``remat`` (``--remat cheap``) what lies between two propagations is recomputed in
backward instead of kept (``between`` keeps no state, as that asks).
"""
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn


class GCNConv(gnn.Layer):
    """x [n, in] -> [n, out]: A_hat x W + b. A_hat is linear, so (A_hat x) W = A_hat (x W): multiply first
    (``pre``) when that narrows the rows that travel (in > out), else after propagating (``post``)."""

    def __init__(self, graph, in_dim, out_dim):
        super().__init__()
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.lin.weight)
        self.first = in_dim > out_dim
        self.width = out_dim if self.first else in_dim          # what travels
        self.prop = gnn.Propagate(graph, "gcn")                 # its own halo exchange: one per layer

    @property
    def aggregation(self):
        return self.prop.aggregation(self.width)

    def pre(self, x):
        return self.lin(x) if self.first else x

    def post(self, agg, aux):
        return agg + self.bias if self.first else F.linear(agg, self.lin.weight, self.bias)


class GCN(nn.Module):
    def __init__(self, graph, in_dim, hidden, out_dim, layers=2, dropout=0.5, remat=False):
        super().__init__()
        self.graph, self.remat = graph, remat
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.convs = nn.ModuleList([GCNConv(graph, a, b) for a, b in zip(dims, dims[1:])])
        self.drops = nn.ModuleList([gnn.Dropout(graph, dropout) for _ in range(layers)])

    def forward(self, x, key=None):
        def between(l, y, rows):     # layer l's input rows from layer l-1's output rows
            # (ReLU in place both ways: post's output is not needed by its backward, and no fresh tensor is made)
            return self.drops[l](y if l == 0 else gnn.relu_(y), key, rows)
        return gnn.run_stack(self.graph, self.convs, x, between, key, remat=self.remat)


def build(graph, in_dim, out_dim, cfg):
    """g3-train's entry point: the graph handle, input and output widths, the run's configuration."""
    return GCN(graph, in_dim, cfg.hidden, out_dim, layers=cfg.layers, dropout=cfg.dropout,
               remat=cfg.remat == "cheap")
