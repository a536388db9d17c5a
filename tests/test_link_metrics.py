"""Link-prediction metrics (g3mpi.train.metrics: Hits@K, MRR; ROC-AUC and AP of positives against negatives) at
P = 1..4 against OGB's Evaluator formulas (tests/link_reference.py) and scikit-learn (tests/mpi_link_metrics.py),
and on one rank with ties, too few negatives and non-finite scores."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.metrics import hits_at_k, mrr
from tests.conftest import run_mpi
from tests.link_reference import ogb_hits, ogb_mrr

SLOW_TESTS = ("test_link_metrics_equal_ogb_and_sklearn_on_every_rank",)
WD = Watchdog(MPI.COMM_SELF, 0.0)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_link_metrics_equal_ogb_and_sklearn_on_every_rank(P):
    for seed in (0, 1):
        assert "link metrics ok" in run_mpi(P, "tests.mpi_link_metrics", seed).stdout


def test_hits_ties_at_the_kth_negative_do_not_count():
    pos = np.array([1.0, 2.0, 2.0, 3.0], np.float32)
    neg = np.array([2.0, 2.0, 0.5, 1.0], np.float32)
    assert hits_at_k(WD, pos, neg, 1) == ogb_hits(pos, neg, 1) == 0.25
    assert hits_at_k(WD, pos, neg, 3) == ogb_hits(pos, neg, 3) == 0.75
    assert hits_at_k(WD, pos, neg, 5) == 1.0
    assert np.isnan(hits_at_k(WD, np.array([np.nan], np.float32), neg, 1))


def test_mrr_averages_the_optimistic_and_pessimistic_rank():
    pos = np.array([1.0, 0.0], np.float32)
    neg = np.array([[1.0, 1.0, 0.0], [2.0, -1.0, -2.0]], np.float32)
    # first: 0 above, 2 at or above -> rank 2; second: 1 above -> rank 2
    assert mrr(WD, pos, neg) == ogb_mrr(pos, neg) == 0.5
    assert np.isnan(mrr(WD, np.zeros(0, np.float32), np.zeros((0, 3), np.float32)))
