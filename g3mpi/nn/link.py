"""Link prediction in user models: scores of arbitrary node pairs through the pair exchange, and the decoders.

    Pairs(graph, src, dst)(h, decoder)       h [n_owned, d] -> scores [m]: decoder(h[src], h[dst]) of each pair
    Pairs(graph, src, dst)(h)                h [n_owned, d] -> (h[src] [m, d], h[dst] [m, d])
    NodeIds(graph).to_new(orig)              original node IDs -> the new global IDs pairs are given in

A pair is scored on the rank that owns its source (``graph.owned_start <= src < graph.owned_end``, new global IDs);
the destination's row comes from its owner (only the distinct rows this rank lacks, each once), and backward returns
its gradient there. Planning is collective and done once per set of pairs: make one ``Pairs`` per set, on every rank,
in the same order, and call each on every rank. With a decoder, the pairs whose destination is owned are scored while
the messages travel, each neighbour's as its rows land (``g3mpi.ops.pairs``).

Decoders map (h_src [m, d], h_dst [m, d]) to logits [m]: ``DotDecoder`` (the inner product) and
``HadamardDecoder`` (an MLP on the elementwise product); ``DistMultDecoder`` takes each pair's relation too
(``Pairs(graph, src, dst, rel=rel)``: decoder(h_src, h_dst, rel)) and scores ``<h_src * w_rel, h_dst>`` (Yang et al.'s
DistMult, a diagonal per relation). ``DECODERS`` by name. All three are symmetric in the pair.
"""
from __future__ import annotations

import torch
from torch import nn

from g3mpi.comm.pairs import IdDirectory
from g3mpi.mpi.collectives import as_watchdog
from g3mpi.ops.pairs import PairExchange as Pairs


class NodeIds:
    """The map original node ID -> new global ID, spread over the ranks (``g3mpi.comm.pairs.IdDirectory``).
    Collective: built on every rank, every ``to_new`` called on every rank. ``replicate``: every rank keeps the
    whole map (8 bytes a node), for lookups of O(nodes) IDs at a time."""

    def __init__(self, graph, replicate: bool = False):
        wd = graph.ctx.watchdog or as_watchdog(graph.ctx.comm)
        self._dir = IdDirectory(wd, graph.num_nodes, int(graph.owned_start), graph.orig_ids.numpy(),
                                replicate=replicate)

    def to_new(self, orig):
        return torch.from_numpy(self._dir.to_new(torch.as_tensor(orig).numpy()))


class DotDecoder(nn.Module):
    """logit = <h_src, h_dst>. ``fused = "dot"``: ``Pairs`` scores it without gathering rows (a subclass that
    changes ``forward`` sets ``fused = None``)."""

    fused = "dot"

    def __init__(self, dim: int = 0, hidden: int = 0, layers: int = 0):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(-1)


class HadamardDecoder(nn.Module):
    """logit = MLP(h_src * h_dst): ``layers`` linear layers ``dim -> hidden -> .. -> 1`` with ReLU between
    (state_dict keys ``lins.<i>.weight/bias``)."""

    def __init__(self, dim: int, hidden: int, layers: int = 2):
        super().__init__()
        if layers < 1:
            raise ValueError("a hadamard decoder needs at least one layer")
        dims = [dim] + [hidden] * (layers - 1) + [1]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        x = a * b
        for i, lin in enumerate(self.lins):
            x = lin(x)
            if i < len(self.lins) - 1:
                x = torch.relu(x)
        return x.squeeze(-1)


class DistMultDecoder(nn.Module):
    """logit = <h_src * w_rel, h_dst>: one learned diagonal ``rel`` [num_relations, dim] (state_dict key ``rel``,
    Xavier-uniform as PyG's ``DistMult``). ``query(h, rel)`` is the vector q with logit = <q, h_other> for either
    side (the filtered ranking scores every entity against it)."""

    def __init__(self, dim: int, hidden: int = 0, layers: int = 0, num_relations: int = 1):
        super().__init__()
        if num_relations < 1:
            raise ValueError("a distmult decoder needs relations (a graph with edge types)")
        self.rel = nn.Parameter(torch.empty(num_relations, dim))
        nn.init.xavier_uniform_(self.rel)

    def query(self, h: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        return h * self.rel[rel]

    def forward(self, a: torch.Tensor, b: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        return (self.query(a, rel) * b).sum(-1)


DECODERS = {"dot": DotDecoder, "hadamard": HadamardDecoder, "distmult": DistMultDecoder}
#: the decoders that take each pair's relation
RELATIONAL = ("distmult",)
