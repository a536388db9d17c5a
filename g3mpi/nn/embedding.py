"""Learned node embeddings for graphs without (or beside) features: a parameter table sharded by owner.

    NodeEmbedding(graph, dim, seed, key, std)()   -> [n, dim]: this rank's owned rows of the table

Each rank holds, and its optimiser updates, only the rows of the nodes it owns (``[n_owned, dim]``); the halo rows a
layer needs travel as features do: the table's rows are the input of the model's first layer, whose exchange sends
them (or their product with its weight) to the neighbours and whose backward returns the halo's gradients to their
owners. So an owned row's gradient is already the whole graph's (no allreduce: :func:`sharded_parameters` names the
tables, which the trainer leaves out of the gradient allreduce), its optimiser state (Adam's moments) is sharded
with it, and after any number of steps the table equals one process's training of the whole table.

Initialisation: row i is N(0, std^2) values drawn from a counter-based hash of (seed, the table's ``key``, the
ORIGINAL node ID of i, column), never from a rank's numbering, so a seed gives the same table for every number of
ranks and every partition, whatever else the model holds (``torch.nn.Embedding`` draws N(0, 1) too); a model with
two tables gives them different keys.

``EmbeddingInput(embedding, model, concat)`` is the model ``g3-train --node-embedding DIM`` trains: ``model``
(a built-in stack or a ``--model-file`` module, built for ``dim`` (+ feature_dim) inputs) on the table's rows,
concatenated with the node features when ``concat`` (the graph has them).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from g3mpi.ops import DistGraph


_U64 = np.uint64
#: entries initialised at a time (rows x dim): the hash's temporaries, a few uint64 and float64 arrays of this
#: size, stay a few tens of MB whatever the width (at 2^14 rows of 256 they were ~0.3 GB, the run's peak)
_INIT_VALUES = 1 << 20


def _splitmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (in place on uint64, which wraps by definition)."""
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


def embedding_init(ids, dim: int, seed: int, key: int = 0, std: float = 1.0) -> np.ndarray:
    """float32 [len(ids), dim]: row r is N(0, std^2) values keyed by (seed, key, ids[r], column) (Box-Muller on
    two 53-bit uniforms of the hash per entry): the same row for the same original node ID wherever it is held."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        base = _splitmix(np.array([seed], dtype=_U64) * _U64(0x9E3779B97F4A7C15) + _U64(key))
        cols = np.arange(1, 2 * dim + 1, dtype=_U64) * _U64(0xD1B54A32D192ED03)
        out = np.empty((len(ids), dim), dtype=np.float32)
        step = max(1, _INIT_VALUES // (2 * dim))
        for a in range(0, len(ids), step):
            rk = _splitmix(_splitmix(ids[a:a + step] ^ base) + base)
            z = _splitmix(rk[:, None] + cols[None, :])
            u = (z >> _U64(11)).astype(np.float64) * 2.0 ** -53
            u1, u2 = 1.0 - u[:, 0::2], u[:, 1::2]        # u1 in (0, 1]: its log is finite
            out[a:a + step] = std * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    return out


class NodeEmbedding(nn.Module):
    """A learned ``dim``-wide row per node, this rank holding its owned rows (``weight`` [n_owned, dim]; module
    docstring). ``forward()`` returns them, the input of a layer as features would be."""

    def __init__(self, graph: DistGraph, dim: int, seed: int = 0, key: int = 0, std: float = 1.0):
        super().__init__()
        if int(dim) < 1:
            raise ValueError(f"node embedding dim must be at least 1 (got {dim})")
        if not 0 <= int(key) < 2**63 or not 0 <= int(seed) < 2**63:
            raise ValueError(f"node embedding seed and key must be in [0, 2**63) (got {seed}, {key})")
        self.graph, self.dim, self.seed, self.key, self.std = graph, int(dim), int(seed), int(key), float(std)
        init = embedding_init(graph.orig_ids.numpy(), self.dim, self.seed, self.key, self.std)
        self.weight = nn.Parameter(torch.from_numpy(init))

    def forward(self) -> torch.Tensor:
        return self.weight

    def extra_repr(self) -> str:
        return f"rows={self.weight.shape[0]} (owned), dim={self.dim}, seed={self.seed}, key={self.key}, std={self.std}"


def sharded_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters of ``model`` held by owner (the ``NodeEmbedding`` tables), by their ``named_parameters``
    names: each rank's own rows, never allreduced, saved per rank (the others are replicated)."""
    mine = {id(m.weight) for m in model.modules() if isinstance(m, NodeEmbedding)}
    return {name: p for name, p in model.named_parameters() if id(p) in mine}


def replicated_state(model: nn.Module, state: dict | None = None) -> dict:
    """``state`` (default ``model.state_dict()``) without the sharded tables: what every rank holds alike."""
    state = model.state_dict() if state is None else state
    mine = sharded_parameters(model)
    return {k: v for k, v in state.items() if k not in mine}


class EmbeddingInput(nn.Module):
    """``model`` on the node embeddings (``embedding``), with the features ``x`` appended when ``concat``
    (state_dict keys ``embedding.weight``, ``model.*``). ``forward(x, key)`` as any model's."""

    def __init__(self, embedding: NodeEmbedding, model: nn.Module, concat: bool):
        super().__init__()
        self.embedding, self.model, self.concat = embedding, model, bool(concat)

    @property
    def convs(self):
        """The inner stack's layers (the gradient allreduce buckets them layer by layer), when it has them."""
        return self.model.convs

    def forward(self, x: torch.Tensor, key=None) -> torch.Tensor:
        h = self.embedding()
        if self.concat:
            h = torch.cat([h, x.to(h.dtype)], dim=1)
        return self.model(h) if key is None else self.model(h, key)

    def extra_repr(self) -> str:
        return f"concat={self.concat}"
