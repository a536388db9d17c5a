"""Distributed R-GCN layer (Schlichtkrull et al.), numerically PyG ``RGCNConv`` (and ``FastRGCNConv``, the same
operator computed edge by edge).

    out_i = x_i Theta_root + sum_{r < R} sum_{j in N_r(i)} x_j Theta_r / c_{i,r} + b

N_r(i): the sources of i's in-edges of relation r (the graph file's self loops left out, as every aggregation
here leaves them out: the root weight is the self connection), c_{i,r} = |N_r(i)| (``aggr="mean"``, PyG's
default; ``"sum"``: 1). x [n_owned, in] -> [n_owned, out]. Parameters named and shaped as in PyG:

    no decomposition          ``weight`` [R, in, out]
    basis (``num_bases`` B)   ``weight`` [B, in, out], ``comp`` [R, B]:  Theta_r = sum_b comp[r, b] weight[b]
    block (``num_blocks`` K)  ``weight`` [R, K, in/K, out/K]: Theta_r = diag(weight[r, 0], ..., weight[r, K-1])
    ``root`` [in, out], ``bias`` [out]

The layer transforms first: every row's R messages x_j Theta_r ([n, R, out], ``pre``) travel in one exchange and
one product over one typed block (``gnn.Propagate(..., relations=True)``, ``g3mpi.ops.blocks``) sums them with
their 1 / c_{i,r}; the root term needs no message (``root``, computed while the messages travel), so the
inter-layer pipeline drives a stack of these as it drives GCN. The rows that travel are R * out wide: the
messages and their gradients are written into storage reused from epoch to epoch (``g3mpi.ops.scratch``).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from g3mpi.ops import Aggregation, DistGraph
from g3mpi.ops.graph import typed_kind

from .rowwise import RowwiseAggLayer


class _Messages(torch.autograd.Function):
    """``x @ w`` ([rows, in] x [in, R out]) written into the graph's reused storage; backward as autograd's
    ``mm`` computes it (row-major operands), so the gradients are the same bits."""

    @staticmethod
    def forward(ctx, x, w, scratch):
        ctx.save_for_backward(x, w)
        return torch.mm(x, w, out=scratch.empty((x.shape[0], w.shape[1]), x.dtype))

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = g.mm(w.t()) if ctx.needs_input_grad[0] else None
        gw = x.t().mm(g) if ctx.needs_input_grad[1] else None
        return gx, gw, None


def _glorot(t: torch.Tensor) -> None:
    """PyG's ``glorot``: uniform in +-sqrt(6 / (fan_in + fan_out)) over the last two dimensions."""
    a = math.sqrt(6.0 / (t.size(-2) + t.size(-1)))
    with torch.no_grad():
        t.uniform_(-a, a)


class RGCNLayer(RowwiseAggLayer):
    transform_first = True      # (the messages are per relation: the aggregate of x would be R times wider)
    wide_pre = True             # its messages are R * out wide: --remat cheap keeps x, not them (layer_inputs)

    def __init__(self, graph: DistGraph, in_dim: int, out_dim: int, num_bases: int = 0, num_blocks: int = 0,
                 aggr: str = "mean", root_weight: bool = True, bias: bool = True, name: str = "rgcn"):
        super().__init__()
        R = graph.num_relations
        if R < 1:
            raise ValueError("R-GCN needs a graph with edge types (this partition has none: num_relations 0)")
        if num_bases and num_blocks:
            raise ValueError("R-GCN: num_bases and num_blocks exclude each other (basis or block decomposition)")
        if num_blocks and (in_dim % num_blocks or out_dim % num_blocks):
            raise ValueError(f"R-GCN: num_blocks {num_blocks} must divide the layer's input and output widths "
                             f"({in_dim}, {out_dim})")
        if num_bases < 0 or num_blocks < 0:
            raise ValueError("R-GCN: num_bases and num_blocks must be >= 0 (0: not used)")
        self.in_dim, self.out_dim, self.num_relations = in_dim, out_dim, R
        self.num_bases, self.num_blocks, self.aggr = int(num_bases), int(num_blocks), aggr
        if num_bases:
            self.weight = nn.Parameter(torch.empty(num_bases, in_dim, out_dim))
            self.comp = nn.Parameter(torch.empty(R, num_bases))
            _glorot(self.comp)
        elif num_blocks:
            self.weight = nn.Parameter(torch.empty(R, num_blocks, in_dim // num_blocks, out_dim // num_blocks))
            self.register_parameter("comp", None)
        else:
            self.weight = nn.Parameter(torch.empty(R, in_dim, out_dim))
            self.register_parameter("comp", None)
        _glorot(self.weight)
        if root_weight:
            self.root_weight = nn.Parameter(torch.empty(in_dim, out_dim))
            _glorot(self.root_weight)
        else:
            self.register_parameter("root_weight", None)
        self.bias = nn.Parameter(torch.zeros(out_dim)) if bias else None
        self.agg = Aggregation(graph, typed_kind({"add": "sum"}.get(aggr, aggr)), R * out_dim, name=name)

    @classmethod
    def build(cls, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, last: bool, name: str,
              num_bases: int = 0, num_blocks: int = 0, **_):
        o = out_dim if last else hidden
        return cls(graph, in_dim, o, num_bases=num_bases, num_blocks=num_blocks, name=name), o

    # PyG names the root weight ``root``; ``Layer.root`` is the row's own term, so the parameter is stored as
    # ``root_weight`` and its state_dict key is PyG's
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.root_weight is not None:
            destination[prefix + "root"] = destination.pop(prefix + "root_weight")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if prefix + "root" in state_dict:
            state_dict[prefix + "root_weight"] = state_dict.pop(prefix + "root")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def relation_weights(self) -> torch.Tensor:
        """Theta as one matrix [in, R * out]: column block r is Theta_r (``pre``'s x @ it is every message)."""
        R, i, o = self.num_relations, self.in_dim, self.out_dim
        w = self.weight
        if self.num_bases:
            w = (self.comp @ w.view(self.num_bases, -1)).view(R, i, o)
        elif self.num_blocks:
            w = torch.stack([torch.block_diag(*w[r]) for r in range(R)])
        return w.permute(1, 0, 2).reshape(i, R * o)

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        if self.num_blocks:     # x_j Theta_r block by block: [rows, K, in/K] x [R, K, in/K, out/K]
            k = self.num_blocks
            y = torch.einsum("nki,rkio->nrko", x.reshape(x.shape[0], k, self.in_dim // k), self.weight)
            return y.reshape(x.shape[0], self.num_relations * self.out_dim)
        w = self.relation_weights()
        if torch.is_autocast_enabled("cpu") or not (x.is_contiguous() and w.is_contiguous()):
            return x @ w    # (bf16-mixed: autocast casts the operands)
        return _Messages.apply(x, w, self.agg.graph.scratch)

    def root(self, x: torch.Tensor):
        if self.root_weight is None:
            return self.bias.expand(x.shape[0], -1) if self.bias is not None else None
        if self.bias is None:
            return x @ self.root_weight
        return torch.addmm(self.bias, x, self.root_weight)

    def post(self, agg: torch.Tensor, aux) -> torch.Tensor:
        return agg if aux is None else agg + aux

    def forward(self, x: torch.Tensor, key=None, layer: int = 0) -> torch.Tensor:
        return self.post(self.agg(self.pre(x)), self.root(x))

    def extra_repr(self) -> str:
        return (f"{self.in_dim}, {self.out_dim}, num_relations={self.num_relations}, num_bases={self.num_bases}, "
                f"num_blocks={self.num_blocks}, aggr={self.aggr}")
