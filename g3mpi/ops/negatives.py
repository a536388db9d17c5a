"""Negative pairs keyed by (seed, epoch, global edge ID), never by a rank's numbering or the number of ranks.

Negative j of positive edge e (its ID in the split, the same for every partition) keeps e's source and draws its
destination uniformly among the graph's original node IDs from a counter-based hash of (seed, epoch, e, j) (the
dropout masks' murmur3 mixing, ``g3mpi.ops.dropout``; 64 bits reduced mod N, a bias below N / 2^64). Every rank
draws the negatives of the edges it scores, and a seed trains the same model for every P. A negative may hit a
true edge, as PyG's ``negative_sampling`` may without ``force_undirected`` checks on the full graph.
"""
from __future__ import annotations

import numpy as np

from .dropout import _mix

#: salt of the negative draws (apart from every dropout site)
NEGATIVE_SALT = 0x4E454731


def negative_destinations(seed: int, epoch: int, edge_ids, k: int, num_nodes: int) -> np.ndarray:
    """int64 [m, k]: the original IDs of the destinations of the k negatives of each edge ``edge_ids`` [m]."""
    ids = np.asarray(edge_ids, dtype=np.int64).ravel().view(np.uint64)
    # the key's constant part mixed once, then broadcast (the same values as mixing it into every entry)
    h = np.full(1, 0x3C6EF372, dtype=np.uint32)
    for v in (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, epoch & 0xFFFFFFFF, NEGATIVE_SALT):
        h = _mix(h, np.uint64(v))
    h = _mix(_mix(np.repeat(h, len(ids)), ids & np.uint64(0xFFFFFFFF)), ids >> np.uint64(32))
    out = np.empty((len(ids), int(k)), dtype=np.int64)
    for j in range(int(k)):
        a = _mix(h, np.uint64(2 * j))
        b = _mix(h, np.uint64(2 * j + 1))
        u = (a.astype(np.uint64) << np.uint64(32)) | b.astype(np.uint64)
        out[:, j] = (u % np.uint64(num_nodes)).astype(np.int64)
    return out
