"""Random partitioning: a seeded permutation of the nodes split into P equal ranges.

Owned node counts differ by at most one; edges and communication fall where they fall (the
worst-case locality baseline).
"""
from __future__ import annotations

import numpy as np


def random_partition(num_nodes: int, num_parts: int, seed: int = 0) -> tuple[np.ndarray, dict]:
    perm = np.random.default_rng(seed).permutation(num_nodes)
    part = np.empty(num_nodes, dtype=np.int64)
    part[perm] = np.arange(num_nodes, dtype=np.int64) * num_parts // max(1, num_nodes)
    return part, {}
