"""APPNP (Gasteiger et al., ICLR 2019): an MLP, then K steps of personalised-PageRank propagation of its output,
numerically PyG's ``APPNP`` after an MLP (its ``citation/appnp.py`` model).

    h^0 = MLP(x)                                          dropout -> Linear, activation between, ``layers`` of them
    h^k = (1 - alpha) A_hat h^(k-1) + alpha h^0            k = 1..K,   A_hat = D^-1/2 (A + I) D^-1/2 (GCN weights)
    out = h^K

x [n_owned, in] -> [n_owned, out]. Parameters ``lins.<i>.weight`` / ``lins.<i>.bias`` (the MLP); the K steps have
none. Each step is a row-wise ``Layer`` (``g3mpi.nn.base``) around one exact distributed GCN aggregation of width
``out``: its input rows are (h^(k-1), h^0), what travels h^(k-1), its own term alpha h^0; ``run_stack`` drives the K
steps layer by layer (``Layer.whole_aggregation``: each row summed as PyG's order, bit for bit), each aggregation
pipelined within itself (every row's local sum while h^(k-1)'s messages travel, neighbour shares as they land).
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.ops import Aggregation, DistGraph, DropoutKey, node_dropout

from .base import Layer, run_stack


class APPNPStep(Layer):
    """One propagation step: ``(1 - alpha) A_hat h + alpha h0``; input rows (h, h0), [r, width] each ->
    [r, width]."""
    #: its backward does not need its output
    output_free = True

    #: each row summed as the layer-by-layer aggregation, bit for bit (``Layer.whole_aggregation``)
    whole_aggregation = True

    def __init__(self, graph: DistGraph, width: int, alpha: float, name: str = "appnp"):
        super().__init__()
        self.alpha = float(alpha)
        self.agg = Aggregation(graph, "gcn", width, name=name)

    @property
    def aggregation(self):
        return self.agg

    def pre(self, x):
        return x[0]

    def root(self, x):
        return self.alpha * x[1]

    def post(self, agg: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        return agg * (1 - self.alpha) + aux


class APPNP(nn.Module):
    """``layers`` Linear layers in -> hidden -> ... -> out (dropout on each one's input, ``act`` between), then
    ``k`` propagation steps with teleport ``alpha`` (``convs``: the steps, one entry each)."""

    def __init__(self, graph: DistGraph, in_dim: int, hidden: int, out_dim: int, layers: int = 2, k: int = 10,
                 alpha: float = 0.1, dropout: float = 0.0, act=torch.relu):
        super().__init__()
        self.graph, self.dropout, self.act = graph, float(dropout), act
        dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.convs = nn.ModuleList(APPNPStep(graph, out_dim, alpha, name=f"appnp{i}") for i in range(k))

    def forward(self, x: torch.Tensor, key: DropoutKey | None = None) -> torch.Tensor:
        ids = self.graph.orig_ids
        for i, lin in enumerate(self.lins):
            x = lin(node_dropout(x, key, i, ids, self.dropout, self.training))
            if i < len(self.lins) - 1:
                x = self.act(x)
        return run_stack(self.graph, self.convs, x, with_rows(x), key)


def with_rows(h0: torch.Tensor):
    """``run_stack``'s ``between`` of a stack whose layers take (h, h0) rows: layer l's input rows ``y`` as they
    are, with the same rows of h0 (a view; h0 itself when they are all rows)."""
    n = h0.shape[0]

    def between(l, y, rows):
        return y, (h0 if rows == slice(0, n) else h0[rows])
    return between


def build(graph: DistGraph, cfg, in_dim: int, out_dim: int) -> APPNP:
    """The registry's builder (``g3mpi.nn.specs``): APPNP of the configuration ``cfg``."""
    from .model import ACTIVATIONS
    return APPNP(graph, in_dim, cfg.hidden, out_dim, layers=cfg.layers, k=cfg.k, alpha=cfg.alpha,
                 dropout=cfg.dropout, act=ACTIVATIONS[cfg.activation])
