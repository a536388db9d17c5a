"""MPI helper for tests/test_metrics.py: the distributed ranking metrics and F1 equal scikit-learn's.

mpiexec -n P python -m mpi4py -m tests.mpi_metrics SEED
Random float32 scores with many ties (and -0.0 beside +0.0) in several groups, dealt to the ranks in uneven
slices (one rank may get none); every rank computes ROC-AUC and AP per group with
:func:`g3mpi.train.metrics.ranking_metrics` and checks them against scikit-learn's on all the group's scores
(<= 1e-9), the undefined groups NaN. Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI
from sklearn.metrics import average_precision_score, roc_auc_score

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.metrics import ranking_metrics


def data(seed: int):
    """(scores, positive, group) of all nodes: groups 0..3 mixed, group 4 all negative, group 5 empty."""
    rng = np.random.default_rng(seed)
    n = 2000
    scores = rng.integers(-6, 7, n).astype(np.float32) / 4   # 13 distinct values: ties everywhere
    scores[rng.random(n) < 0.3] += rng.standard_normal(int((rng.random(n) < 0.3).sum()) or 1)[0]
    scores[scores == 0] = np.where(rng.random(int((scores == 0).sum())) < 0.5, -0.0, 0.0)
    group = rng.integers(0, 5, n)
    positive = (rng.random(n) < 0.3 + 0.1 * group) & (group != 4)
    return scores.astype(np.float32), positive, group


def main(argv):
    comm = MPI.COMM_WORLD
    seed = int(argv[0]) if argv else 0
    scores, positive, group = data(seed)
    # uneven slices, the last rank's empty when there are several
    cuts = np.r_[0, np.sort(np.random.default_rng(seed + 1).integers(0, len(scores), comm.size - 1)), len(scores)]
    if comm.size > 1:
        cuts[-2] = len(scores)
    mine = slice(cuts[comm.rank], cuts[comm.rank + 1])
    wd = Watchdog(comm, float(argv[1]) if len(argv) > 1 else 0.0)
    auc, ap = ranking_metrics(wd, scores[mine], positive[mine], group[mine], 6)
    for g in range(4):
        m = group == g
        want_auc = roc_auc_score(positive[m], scores[m])
        want_ap = average_precision_score(positive[m], scores[m])
        assert abs(auc[g] - want_auc) <= 1e-9 * abs(want_auc), (g, auc[g], want_auc)
        assert abs(ap[g] - want_ap) <= 1e-9 * abs(want_ap), (g, ap[g], want_ap)
    assert np.isnan(auc[4]) and np.isnan(ap[4]) and np.isnan(auc[5]) and np.isnan(ap[5]), (auc, ap)
    if comm.rank == 0:
        print("metrics ok", auc[:4].round(6).tolist(), ap[:4].round(6).tolist())


if __name__ == "__main__":
    main(sys.argv[1:])
