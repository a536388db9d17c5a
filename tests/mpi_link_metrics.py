"""MPI helper for tests/test_link_metrics.py: the link-prediction metrics over ranks equal OGB's ``Evaluator``
formulas and scikit-learn's on the whole split.

mpiexec -n P python -m mpi4py -m tests.mpi_link_metrics SEED
Positive and negative float32 scores with many ties, dealt to the ranks in uneven slices (the last rank gets none):
Hits@K against the shared negatives for several K (one above the number of negatives), MRR of each positive against
its own negatives, ROC-AUC and AP of positives vs shared negatives; each checked on every rank against
tests/link_reference.py (OGB's formulas) and scikit-learn (<= 1e-9). Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI
from sklearn.metrics import average_precision_score, roc_auc_score

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.metrics import hits_at_k, mrr, ranking_metrics
from tests.link_reference import ogb_hits, ogb_mrr

KS = (1, 3, 10, 50, 400)


def data(seed: int):
    """(positive scores [300], shared negative scores [350], per-positive negatives [300, 20])."""
    rng = np.random.default_rng(seed)
    pos = (rng.integers(-8, 12, 300) / 4).astype(np.float32)
    neg = (rng.integers(-12, 8, 350) / 4).astype(np.float32)
    own = (rng.integers(-10, 10, (300, 20)) / 4).astype(np.float32)
    pos[rng.random(300) < 0.2] = -0.0      # -0 ties +0
    return pos, neg, own


def cut(n: int, size: int, rank: int, seed: int) -> slice:
    c = np.r_[0, np.sort(np.random.default_rng(seed + 7).integers(0, n, size - 1)), n]
    if size > 1:
        c[-2] = n
    return slice(int(c[rank]), int(c[rank + 1]))


def main(argv):
    comm = MPI.COMM_WORLD
    seed = int(argv[0]) if argv else 0
    pos, neg, own = data(seed)
    mp, mn = cut(len(pos), comm.size, comm.rank, seed), cut(len(neg), comm.size, comm.rank, seed + 1)
    wd = Watchdog(comm, 0.0)
    for k in KS:
        got, want = hits_at_k(wd, pos[mp], neg[mn], k), ogb_hits(pos, neg, k)
        assert abs(got - want) <= 1e-9, (k, got, want)
    got, want = mrr(wd, pos[mp], own[mp]), ogb_mrr(pos, own)
    assert abs(got - want) <= 1e-9 * want, (got, want)
    s = np.concatenate([pos[mp], neg[mn]])
    y = np.r_[np.ones(len(pos[mp]), bool), np.zeros(len(neg[mn]), bool)]
    auc, ap = ranking_metrics(wd, s, y, np.zeros(len(s), np.int64), 1)
    ys, yy = np.concatenate([pos, neg]), np.r_[np.ones(len(pos)), np.zeros(len(neg))]
    assert abs(auc[0] - roc_auc_score(yy, ys)) <= 1e-9 and abs(ap[0] - average_precision_score(yy, ys)) <= 1e-9
    if comm.rank == 0:
        print("link metrics ok", [round(ogb_hits(pos, neg, k), 6) for k in KS], round(want, 6))


if __name__ == "__main__":
    main(sys.argv[1:])
