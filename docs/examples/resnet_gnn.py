"""A residual GNN as in Platonov et al., "A critical look at the evaluation of GNNs under heterophily" (ICLR 2023):

    h_0 = GELU(dropout(W_in x))                                  input linear           [n, in] -> [n, d]
    h_l = h_{l-1} + FF_l([u ; mean_{j -> i} u_j]),  u = LayerNorm_l(h_{l-1})     L residual blocks (SAGE-style)
    FF(z) = dropout(W_2 dropout(GELU(W_1 z)))                    feed-forward           [n, 2d] -> [n, d]
    out = W_out LayerNorm(h_L)                                   output linear          [n, d] -> [n, out]

d = ``--hidden``, L = ``--layers``, the dropout ``--dropout``:

    mpiexec -n 2 g3-train --parts PARTS --out RUN --model-file docs/examples/resnet_gnn.py:build \\
        --layers 2 --hidden 256 --dropout 0.2 --lr 3e-5 --weight-decay 0 --epochs 1000

LayerNorm and the linear layers act on each node's row alone; only ``Propagate`` exchanges halo rows.
"""
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn

#: the feed-forward block's width, times d (the paper's hidden_dim_multiplier)
FF_MULT = 1


class ResidualBlock(nn.Module):
    def __init__(self, graph, dim, dropout):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mean = gnn.Propagate(graph, "mean")
        self.ff1 = nn.Linear(2 * dim, FF_MULT * dim)
        self.ff2 = nn.Linear(FF_MULT * dim, dim)
        self.drop1, self.drop2 = gnn.Dropout(graph, dropout), gnn.Dropout(graph, dropout)

    def forward(self, h, key=None):
        u = self.norm(h)
        z = torch.cat([u, self.mean(u)], dim=1)
        return h + self.drop2(self.ff2(self.drop1(F.gelu(self.ff1(z)), key)), key)


class ResNetGNN(nn.Module):
    def __init__(self, graph, in_dim, hidden, out_dim, layers=2, dropout=0.2):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.drop = gnn.Dropout(graph, dropout)
        self.blocks = nn.ModuleList([ResidualBlock(graph, hidden, dropout) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, out_dim)

    def forward(self, x, key=None):
        h = F.gelu(self.drop(self.inp(x), key))
        for block in self.blocks:
            h = block(h, key)
        return self.out(self.norm(h))


def build(graph, in_dim, out_dim, cfg):
    return ResNetGNN(graph, in_dim, cfg.hidden, out_dim, layers=cfg.layers, dropout=cfg.dropout)
