"""Single-process references of the link-prediction metrics: OGB's ``Evaluator`` formulas (ogb/linkproppred/
evaluate.py, ``_eval_hits`` and ``_eval_mrr``) written again in numpy float64, so the tests need no ogb install."""
from __future__ import annotations

import numpy as np


def ogb_hits(pos: np.ndarray, neg: np.ndarray, k: int) -> float:
    """The fraction of positives strictly above the K-th largest negative; 1.0 with fewer than K negatives."""
    if len(neg) < k:
        return 1.0
    kth = np.sort(neg)[-k]
    return float(np.sum(pos > kth)) / len(pos)


def ogb_mrr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Mean of 1 / rank, rank = 0.5 (#neg > pos + #neg >= pos) + 1 per positive against its own row of negatives."""
    p = pos.reshape(-1, 1)
    rank = 0.5 * ((neg > p).sum(1) + (neg >= p).sum(1)) + 1
    return float(np.mean(1.0 / rank.astype(np.float64)))
