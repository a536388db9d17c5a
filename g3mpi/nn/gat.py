"""Distributed GAT layer, numerically PyG ``GATConv`` with its defaults (self loops, LeakyReLU 0.2).

    x' = X W (viewed [n, H, C]),  a_src = <x', att_src>,  a_dst = <x', att_dst>          ([n, H])
    alpha_ij = softmax over in-edges j -> i incl. the self loop of LeakyReLU(a_src[j] + a_dst[i])
    out_i = concat_h or mean_h ( sum_j dropout(alpha_ij) x'_j ) + bias

With ``remat`` (``--remat cheap``) no per-edge term is kept for backward: ``g3mpi.ops.gat`` computes them again.

x [n_owned, in] -> [n_owned, H*C] (concat) or [n_owned, C] (mean). Parameters ``lin.weight`` [H*C, in],
``att_src``/``att_dst`` [1, H, C], ``bias`` as in PyG. One message per neighbour carries x' and a_src together.
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.ops import DistGraph, DropoutKey, GATAggregation

from .base import Layer


class GATLayer(Layer):
    def __init__(self, graph: DistGraph, in_dim: int, channels: int, heads: int = 1, concat: bool = True,
                 attn_dropout: float = 0.0, name: str = "gat"):
        super().__init__()
        self.H, self.C, self.concat = heads, channels, concat
        self.attn_dropout = attn_dropout
        self.lin = nn.Linear(in_dim, heads * channels, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, channels))
        self.att_dst = nn.Parameter(torch.empty(1, heads, channels))
        self.bias = nn.Parameter(torch.zeros(heads * channels if concat else channels))
        nn.init.xavier_uniform_(self.lin.weight)
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)
        self.agg = GATAggregation(graph, heads, channels, name=name)

    #: the layer contract (``g3mpi.nn.base.Layer``): heads and attention dropout apply; not row-wise (no
    #: inter-layer pipeline), its backward needs its output, and no product of its input is free of parameters
    attention = True
    #: ``--remat cheap``: the attention keeps no per-edge term for backward and computes them again there
    remat = False

    @classmethod
    def build(cls, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, last: bool, name: str, *,
              heads: int = 8, out_heads: int = 1, attn_dropout: float = 0.0):
        """(layer, its output width): hidden layers ``heads`` heads of ``hidden`` channels concatenated, the last
        ``out_heads`` heads of ``out_dim`` averaged."""
        h, ch = (out_heads, out_dim) if last else (heads, hidden)
        return cls(graph, in_dim, ch, h, concat=not last, attn_dropout=attn_dropout, name=name), \
            ch if last else h * ch

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None, layer: int = 0) -> torch.Tensor:
        h = self.lin(x).view(-1, self.H, self.C)
        if h.dtype == torch.float32:
            a_src = (h * self.att_src).sum(-1)
            a_dst = (h * self.att_dst).sum(-1)
        else:
            a_src, a_dst = _attention_terms(h, self.att_src, self.att_dst)
        out = self.agg(h, a_src, a_dst, attn_dropout=self.attn_dropout, key=key, layer=layer,
                       training=self.training, remat=self.remat)
        out = out.reshape(-1, self.H * self.C) if self.concat else out.mean(dim=1)
        return out + self.bias.to(out.dtype)


def _attention_terms(h: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor):
    """(a_src, a_dst) [n, H] of 16-bit ``h`` [n, H, C] (bf16-mixed) as one product with the block-diagonal
    [H*C, 2H] matrix of ``att_src``/``att_dst``: no float32 [n, H, C] temporary, as ``h * att`` would make."""
    H, C = h.shape[1], h.shape[2]
    att = torch.cat([att_src, att_dst], 0).permute(1, 2, 0)                 # [H, C, 2]
    w = (att.unsqueeze(-1) * torch.eye(H, dtype=att.dtype).view(H, 1, 1, H)).reshape(H * C, 2 * H)
    a = h.reshape(-1, H * C) @ w.to(h.dtype)
    return a[:, :H], a[:, H:]
