"""The primitives of user models (``from g3mpi import nn as gnn``): exact message passing over owned + halo rows,
attention, node dropout keyed by global node ID. Shapes: n = the rank's owned rows, * = any feature shape.

    Propagate(graph, reduce, self_loops)(x)       x [n, *] -> [n, *]
        sum:  out_i = sum_{j -> i} x_j                     (+ x_i with self_loops)
        mean: out_i = (sum_{j -> i} x_j (+ x_i)) / max(deg_i (+ 1), 1)
        gcn:  out_i = sum_{j -> i} x_j / sqrt(d_i d_j) (+ x_i / d_i),   d = deg (+ 1), 1/sqrt(0) taken as 0
    deg_i: the global in-degree of i, over the graph's edges without self loops (the file's self loops are left out,
    ``self_loops`` adds one per node: PyG's ``gcn_norm`` with ``add_remaining_self_loops``, and ``aggr`` over
    ``add_self_loops(remove_self_loops(edge_index))``).

    Propagate(graph, reduce, relations=True)(x)   x [n, R, *] -> [n, *]     (a graph with R edge types)
        sum:  out_i = sum_r sum_{j in N_r(i)} x_{j,r}
        mean: out_i = sum_r sum_{j in N_r(i)} x_{j,r} / c_{i,r},   c_{i,r} = |N_r(i)|  (R-GCN's normalisation)
    N_r(i): the sources of i's in-edges of relation r (self loops left out); x_{j,r}: row j's message for
    relation r (R-GCN: x_j Theta_r). PyG ``RGCNConv``'s sum over relations of its per-relation ``aggr``, in one
    exchange of the [n, R, *] rows and one sparse product over one typed block.

    Attention(graph, heads, channels, dropout, remat)(x, a_src, a_dst, key)
                                                   x [n, H, C], a_src/a_dst [n, H] -> [n, H, C]
        alpha_ij = softmax over j -> i and the self loop of LeakyReLU_0.2(a_src[j] + a_dst[i]),
        out_i = sum_j dropout(alpha_ij) x_j                (PyG ``GATConv``'s attention, before bias and heads)
        remat: keep no per-edge term for backward, compute them again there (less memory, more time)

    Dropout(graph, p)(x, key[, rows])              x [n, *] -> [n, *]: node features dropped with masks keyed by
        (seed, epoch, site, original node ID): the same for every number of ranks

Each module owns its halo exchange (as a PyG layer owns its ``propagate``): make one per place it is used, in
``__init__``, in the same order on every rank. Every call is an autograd op: backward returns the halo's
gradients to their owners, so logits and gradients equal one process's on the whole graph. The pipelined schedule
runs each call as the built-in layers' aggregation: the local block in row chunks while the messages travel, each
neighbour's block piece by piece as its message lands.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from g3mpi.ops import Aggregation, DistGraph, DropoutKey, GATAggregation, node_dropout
from g3mpi.ops.graph import REDUCES, propagate_kind, typed_kind

#: dropout sites of user modules are keyed from here on (the built-in stacks key theirs by layer index, below it)
SITE_BASE = 1 << 20


def _new_site(graph: DistGraph) -> int:
    """The key of the next dropout site of ``graph`` (``DistGraph.new_site``), above the built-ins' layer indices."""
    return SITE_BASE + graph.new_site()


class Propagate(nn.Module):
    """Exact message passing ``x [n_owned, *] -> [n_owned, *]`` (module docstring): ``reduce`` one of sum, mean,
    gcn; ``self_loops`` default True for gcn (PyG ``GCNConv``), False for sum and mean (PyG ``aggr``).
    ``relations``: per relation, ``x [n_owned, R, *] -> [n_owned, *]`` (sum or mean; no self loops)."""

    def __init__(self, graph: DistGraph, reduce: str = "sum", self_loops: bool | None = None, name: str = "",
                 relations: bool = False):
        super().__init__()
        self.graph, self.reduce, self.relations = graph, reduce, bool(relations)
        if self.relations:
            if self_loops:
                raise ValueError("propagate per relation adds no self loops (a root weight is the self connection)")
            if graph.num_relations < 1:
                raise ValueError("propagate per relation needs a graph with edge types (num_relations 0)")
            self.self_loops, self.kind = False, typed_kind(reduce)
        else:
            if reduce not in REDUCES:
                raise ValueError(f"reduce {reduce!r}: expected one of {', '.join(REDUCES)}")
            self.self_loops = reduce == "gcn" if self_loops is None else bool(self_loops)
            self.kind = propagate_kind(reduce, self.self_loops)
        self.name = name or f"prop-{self.kind}"
        self._aggs: dict[int, Aggregation] = {}   # by row width: an exchange of that width, made on first use

    def aggregation(self, width: int) -> Aggregation:
        """The ``Aggregation`` (blocks and halo exchange) this module uses for rows ``width`` floats wide."""
        if width not in self._aggs:
            self._aggs[width] = Aggregation(self.graph, self.kind, width, name=f"{self.name}/{width}")
        return self._aggs[width]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, R = self.graph.num_owned, self.graph.num_relations
        if self.relations and (x.dim() < 2 or x.shape[:2] != (n, R)):
            raise ValueError(f"propagate per relation: expected [{n}, {R}, ...] rows (this rank's owned nodes, one "
                             f"message per relation), got {tuple(x.shape)}")
        if x.dim() < 1 or x.shape[0] != n:
            raise ValueError(f"propagate: expected [{n}, ...] rows (this rank's owned nodes), got {tuple(x.shape)}")
        width = math.prod(x.shape[1:])
        out = self.aggregation(width)(x.reshape(n, width).float())
        return out.view((n, *x.shape[2:]) if self.relations else x.shape)

    def extra_repr(self) -> str:
        return f"reduce={self.reduce}, self_loops={self.self_loops}" + (", relations" if self.relations else "")


class Attention(nn.Module):
    """GAT-style multi-head attention over a node's in-edges and its self loop (module docstring): ``heads`` H,
    ``channels`` C; ``dropout``: on the attention coefficients in training (keyed by both ends' original IDs);
    ``remat``: the per-edge terms are computed again in backward instead of kept (``g3mpi.ops.gat``)."""

    def __init__(self, graph: DistGraph, heads: int, channels: int, dropout: float = 0.0, name: str = "",
                 remat: bool = False):
        super().__init__()
        self.graph, self.heads, self.channels = graph, int(heads), int(channels)
        self.dropout, self.remat = float(dropout), bool(remat)
        self.site = _new_site(graph)
        self.agg = GATAggregation(graph, self.heads, self.channels, name=name or f"attention{self.site - SITE_BASE}")

    def forward(self, x: torch.Tensor, a_src: torch.Tensor, a_dst: torch.Tensor,
                key: DropoutKey | None = None) -> torch.Tensor:
        n, H, C = self.graph.num_owned, self.heads, self.channels
        if tuple(x.shape) != (n, H, C) or tuple(a_src.shape) != (n, H) or tuple(a_dst.shape) != (n, H):
            raise ValueError(f"attention: expected x [{n}, {H}, {C}], a_src and a_dst [{n}, {H}], got "
                             f"{tuple(x.shape)}, {tuple(a_src.shape)}, {tuple(a_dst.shape)}")
        return self.agg(x, a_src, a_dst, attn_dropout=self.dropout, key=key, layer=self.site,
                        training=self.training, remat=self.remat)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, channels={self.channels}, dropout={self.dropout}, remat={self.remat}"


class Dropout(nn.Module):
    """Dropout of node features ``x [n_owned, *]`` in training, its mask keyed by (the pass's ``key``: seed and
    epoch; this module's site, numbered in construction order; the original node ID), so a seeded model draws the
    same masks for every number of ranks. No key (evaluation, or a caller without one): the identity."""

    def __init__(self, graph: DistGraph, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p must be in [0, 1) (got {p})")
        self.graph, self.p = graph, float(p)
        self.site = _new_site(graph)

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None, rows: slice | None = None) -> torch.Tensor:
        """``rows``: the owned rows ``x`` holds (a slice, as ``run_stack``'s ``between`` gets; default all)."""
        if not self.training or self.p <= 0 or key is None:
            return x
        n = x.shape[0]
        ids = self.graph.orig_ids if rows is None else self.graph.orig_ids[rows]
        out = node_dropout(x.reshape(n, -1), key, self.site, ids, self.p, True)
        return out.view(x.shape)

    def extra_repr(self) -> str:
        return f"p={self.p}"
