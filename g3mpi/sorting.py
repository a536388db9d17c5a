"""Distinct values of integer arrays by sorting.

NumPy 2.4's ``np.unique`` (and ``union1d``) of a plain array takes a hash-table path that is 8-100x slower than
sorting on integer IDs: 8.3 s against 0.08 s for 4M random int64 node IDs here. Every per-edge or per-node
``unique`` of the data path and the runtime goes through these instead.
"""
from __future__ import annotations

import numpy as np


def sorted_unique(x: np.ndarray) -> np.ndarray:
    """``np.unique(x)`` of a 1-D array (its sorted distinct values), by one sort."""
    x = np.sort(np.asarray(x).reshape(-1))
    keep = np.empty(len(x), dtype=bool)
    keep[:1] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]


def merge_unique(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``np.union1d(a, b)`` of two arrays that are each sorted and distinct: a linear merge (a stable sort of
    two sorted runs), then the duplicates dropped."""
    x = np.sort(np.concatenate([a, b]), kind="stable")
    keep = np.empty(len(x), dtype=bool)
    keep[:1] = True
    np.not_equal(x[1:], x[:-1], out=keep[1:])
    return x[keep]
