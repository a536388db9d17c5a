"""Exact distributed evaluation metrics: ROC-AUC and average precision by a distributed sort of the scores, F1 and
accuracy from summed counts. NumPy and the watchdog's buffer collectives only (no torch, nothing pickled).

Every rank passes the scores of the nodes it owns; every rank gets the same values, equal to scikit-learn's on all
nodes of the split at once (``roc_auc_score``, ``average_precision_score``, ``f1_score(average="macro")``) without
gathering them: a rank holds O(owned + P) values at any time.

**Ranking metrics.** Scores come in *groups* (a split, or a split and a label column), each ranked on its own. With
``pos(s)``, ``neg(s)`` the positives and negatives of a group that have score exactly ``s``, and ``P``, ``N`` their
totals::

    ROC-AUC = sum_s pos(s) * (neg(< s) + neg(s) / 2) / (P * N)          (ties count a half, as the trapezoid does)
    AP      = sum_s pos(s) / P * pos(>= s) / (pos(>= s) + neg(>= s))    (one step per distinct score, as sklearn)

Both need, for each distinct score, the counts of the group below it over all ranks. A key ``group << 32 |
order(score)`` (``order``: the float32's bits mapped to an unsigned integer of the same order, -0 as +0) sorts by
group, then score; equal scores have equal keys. Each rank reduces its keys to (key, pos, neg) triples, the ranks
agree on P - 1 splitter keys that cut the keys into P equal shares (a bisection over the key range: one
``Allreduce`` of P - 1 counts per bit, about 32 + log2(groups) of them), send each triple to the rank of its share
(``Alltoallv``; all copies of a key go to one rank, so ties are never split), merge, and add the counts of the
ranks before them (``Exscan`` of per-group sums). A rank then owns a contiguous run of the global order and sums
its terms; an ``Allreduce`` adds the ranks' sums. The AUC's numerator ``2U`` is summed in int64 (exact for fewer
than 4e9 nodes); AP's terms in float64 (their order differs from sklearn's by rounding only, ~1e-15 relative).

A group without a positive or without a negative has no ROC-AUC (NaN, where sklearn raises); one without a positive
has no AP (NaN). A group with a non-finite score gets NaN for both (sklearn refuses such input).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

_SIGN = np.int64(0x80000000)
_LOW32 = np.int64(0xFFFFFFFF)


def score_order(scores: np.ndarray) -> np.ndarray:
    """int64 [n] in [0, 2^32): the same order as the float32 ``scores`` [n] (-0 equal to +0; NaN above +inf)."""
    s = np.ascontiguousarray(scores, dtype=np.float32) + np.float32(0)   # -0 + 0 = +0: one key for a zero
    u = s.view(np.uint32).astype(np.int64)
    return np.where(u & _SIGN, _LOW32 - u, u | _SIGN)


def ranking_metrics(wd, scores: np.ndarray, positive: np.ndarray, group: np.ndarray, num_groups: int,
                    what: str = "evaluation (ranking metrics)") -> tuple[np.ndarray, np.ndarray]:
    """(ROC-AUC [G], AP [G]) of each group over all ranks (module docstring; NaN where undefined), the same on
    every rank. This rank's ``scores`` float32 [n], ``positive`` bool [n] and ``group`` int [n] in [0, G); every
    rank calls it with the same ``num_groups``. ``wd``: the watchdog whose collectives it uses."""
    G = int(num_groups)
    scores = np.asarray(scores, dtype=np.float32).ravel()
    positive = np.asarray(positive, dtype=bool).ravel()
    group = np.asarray(group, dtype=np.int64).ravel()
    tot = np.concatenate([np.bincount(group[positive], minlength=G), np.bincount(group[~positive], minlength=G),
                          np.bincount(group[~np.isfinite(scores)], minlength=G)]).astype(np.int64)
    wd.allreduce(tot, what=what)
    pos_tot, neg_tot, bad = tot[:G], tot[G:2 * G], tot[2 * G:]
    keys, pos, neg = _triples(group << 32 | score_order(scores), positive)
    keys, pos, neg = _redistribute(wd, keys, pos, neg, what)
    g = keys >> 32
    # the positives and negatives of each group on the ranks before this one (their keys are all smaller)
    before = np.concatenate([_group_sums(g, pos, G), _group_sums(g, neg, G)])
    wd.exscan(before, what=what)
    two_u, ap = np.zeros(G, dtype=np.int64), np.zeros(G, dtype=np.float64)
    if len(keys):
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        run = np.cumsum(np.r_[True, g[1:] != g[:-1]]) - 1
        below = []
        for i, c in enumerate((pos, neg)):   # of the same group, over all ranks, with a smaller key
            excl = np.cumsum(c) - c
            below.append(before[i * G + g] + excl - excl[starts][run])
        pos_below, neg_below = below
        gs = g[starts]
        two_u[gs] = np.add.reduceat(pos * (2 * neg_below + neg), starts)
        tp = pos_tot[g] - pos_below
        seen = tp + neg_tot[g] - neg_below
        ap[gs] = np.add.reduceat(pos * (tp / np.maximum(seen, 1)), starts)
    wd.allreduce(two_u, what=what)
    wd.allreduce(ap, what=what)
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = np.where((pos_tot > 0) & (neg_tot > 0) & (bad == 0), two_u / (2.0 * pos_tot * neg_tot), np.nan)
        ap = np.where((pos_tot > 0) & (bad == 0), ap / pos_tot, np.nan)
    return auc, ap


def _triples(keys: np.ndarray, positive: np.ndarray):
    """The distinct ``keys`` (sorted) with the numbers of positives and negatives of each."""
    uk, inv, cnt = np.unique(keys, return_inverse=True, return_counts=True)
    pos = np.bincount(inv.ravel(), weights=positive, minlength=len(uk)).astype(np.int64)
    return uk, pos, cnt.astype(np.int64) - pos


def _group_sums(g: np.ndarray, c: np.ndarray, G: int) -> np.ndarray:
    """int64 [G]: the sums of ``c`` by group (exact: no float weights)."""
    out = np.zeros(G, dtype=np.int64)
    np.add.at(out, g, c)
    return out


def _splitters(wd, keys: np.ndarray, counts: np.ndarray, what: str) -> np.ndarray:
    """int64 [P-1]: splitter i is the smallest key with at least ceil((i+1) M / P) of the M keys of all ranks at or
    below it (``keys`` distinct and sorted, ``counts`` the copies of each). A bisection over the key range, all
    splitters at once: every rank makes the same steps, one ``Allreduce`` of P - 1 counts each."""
    size = wd.comm.size
    cum = np.cumsum(counts)
    ends = np.array([keys[0] if len(keys) else np.iinfo(np.int64).max,
                     -keys[-1] if len(keys) else np.iinfo(np.int64).max], dtype=np.int64)
    wd.allreduce(ends, op=MPI.MIN, what=what)
    total = np.array([int(cum[-1]) if len(cum) else 0], dtype=np.int64)
    wd.allreduce(total, what=what)
    if total[0] == 0:
        return np.zeros(size - 1, dtype=np.int64)
    want = (np.arange(1, size, dtype=np.int64) * total[0] + size - 1) // size
    lo = np.full(size - 1, ends[0] - 1, dtype=np.int64)   # at or below lo: fewer than wanted
    hi = np.full(size - 1, -ends[1], dtype=np.int64)      # at or below hi: enough
    while np.any(hi - lo > 1):
        mid = lo + (hi - lo) // 2
        at = np.searchsorted(keys, mid, side="right")
        c = np.where(at > 0, cum[np.maximum(at - 1, 0)] if len(cum) else 0, 0).astype(np.int64)
        wd.allreduce(c, what=what)
        enough = c >= want
        hi, lo = np.where(enough, mid, hi), np.where(enough, lo, mid)
    return hi


def _redistribute(wd, keys: np.ndarray, pos: np.ndarray, neg: np.ndarray, what: str):
    """The triples of all ranks with keys in this rank's share (between its splitters), merged by key: (keys
    sorted and distinct, pos, neg). Rank r's keys are all smaller than rank r+1's."""
    size = wd.comm.size
    if size == 1:
        return keys, pos, neg
    dest = np.searchsorted(_splitters(wd, keys, pos + neg, what), keys, side="left")
    send = np.ascontiguousarray(np.stack([keys, pos, neg], axis=1))
    sc = 3 * np.bincount(dest, minlength=size).astype(np.int64)
    rc = np.empty(size, dtype=np.int64)
    wd.alltoall(sc, rc, what=what)
    recv = np.empty(int(rc.sum()), dtype=np.int64)
    sd, rd = np.r_[0, np.cumsum(sc)[:-1]], np.r_[0, np.cumsum(rc)[:-1]]
    wd.alltoallv([send, (sc, sd), MPI.INT64_T], [recv, (rc, rd), MPI.INT64_T], what=what)
    recv = recv.reshape(-1, 3)
    uk, inv = np.unique(recv[:, 0], return_inverse=True)
    inv = inv.ravel()
    p, n = np.zeros(len(uk), dtype=np.int64), np.zeros(len(uk), dtype=np.int64)
    np.add.at(p, inv, recv[:, 1])
    np.add.at(n, inv, recv[:, 2])
    return uk, p, n


def f1_scores(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """float64: F1 = 2 tp / (2 tp + fp + fn) elementwise, 0 where there is nothing to score (sklearn's
    ``zero_division`` default)."""
    den = 2 * tp + fp + fn
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, 2.0 * tp / np.maximum(den, 1), 0.0)


def macro_f1(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, present: np.ndarray) -> np.ndarray:
    """The mean over the last axis of :func:`f1_scores` of the entries where ``present`` (e.g. sklearn's macro F1
    of multiclass labels: over the classes that occur in the labels or the predictions); NaN where none is."""
    f1 = f1_scores(tp, fp, fn)
    k = present.sum(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(k > 0, (f1 * present).sum(axis=-1) / np.maximum(k, 1), np.nan)


def hits_at_k(wd, pos_scores: np.ndarray, neg_scores: np.ndarray, k: int,
              what: str = "evaluation (hits@k)") -> float:
    """OGB's Hits@K against negatives shared by every positive, over all ranks: the fraction of positives scored
    strictly above the K-th largest negative score (1.0 with fewer than K negatives; NaN without positives or
    with a non-finite score). Each rank passes its own positives' and negatives' float32 scores; the K-th largest
    negative is found by a bisection over the scores' order keys (``score_order``: one ``Allreduce`` of one count
    per bit, 32 of them), so no rank holds more than its own scores."""
    k = int(k)
    if k < 1:
        raise ValueError(f"hits@k needs k >= 1, not {k}")
    pos = score_order(np.asarray(pos_scores, dtype=np.float32).ravel())
    neg = np.sort(score_order(np.asarray(neg_scores, dtype=np.float32).ravel()))
    bad = int((~np.isfinite(np.asarray(pos_scores, dtype=np.float32))).sum()
              + (~np.isfinite(np.asarray(neg_scores, dtype=np.float32))).sum())
    tot = np.array([len(pos), len(neg), bad], dtype=np.int64)
    wd.allreduce(tot, what=what)
    if tot[0] == 0 or tot[2] > 0:
        return float("nan")
    if tot[1] < k:
        return 1.0
    lo, hi = 0, 1 << 32     # at or above lo: at least k negatives; at or above hi: fewer
    c = np.zeros(1, dtype=np.int64)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        c[0] = len(neg) - np.searchsorted(neg, mid, side="left")
        wd.allreduce(c, what=what)
        lo, hi = (mid, hi) if c[0] >= k else (lo, mid)
    c[0] = int((pos > lo).sum())
    wd.allreduce(c, what=what)
    return float(c[0]) / float(tot[0])


def mrr(wd, pos_scores: np.ndarray, neg_scores: np.ndarray, what: str = "evaluation (mrr)") -> float:
    """OGB's MRR over all ranks: each positive ``pos_scores[i]`` ranked against its own negatives
    ``neg_scores[i, :]`` (both on the rank that scores them), rank = 1 + (#negatives above + #negatives at or
    above) / 2 (OGB's tie rule: the mean of the optimistic and the pessimistic rank), MRR = the mean of 1 / rank
    over every positive of every rank (float64; NaN without positives or with a non-finite score)."""
    pos = np.asarray(pos_scores, dtype=np.float32).ravel()
    neg = np.asarray(neg_scores, dtype=np.float32)
    neg = neg.reshape(len(pos), neg.shape[-1] if neg.ndim == 2 else -1)
    above = (neg > pos[:, None]).sum(axis=1)
    at_or_above = (neg >= pos[:, None]).sum(axis=1)
    rank = 0.5 * (above + at_or_above).astype(np.float64) + 1.0
    sums = np.array([(1.0 / rank).sum(), float(len(pos)),
                     float((~np.isfinite(pos)).sum() + (~np.isfinite(neg)).sum())], dtype=np.float64)
    wd.allreduce(sums, what=what)
    if sums[1] == 0 or sums[2] > 0:
        return float("nan")
    return float(sums[0] / sums[1])
