"""Filtered ranking for knowledge-graph completion (g3mpi.train.ranking): MRR and Hits@1/3/10 over P = 1..4 equal
a single-process computation over every entity (tests/mpi_kg_ranking.py, <= 1e-9), and the edge cases on one
rank."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.ranking import filtered_ranks, triple_keys
from tests.conftest import run_mpi

SLOW_TESTS = ("test_filtered_ranking_equals_single_process_for_every_p",)
WD = Watchdog(MPI.COMM_SELF, 0.0)


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_filtered_ranking_equals_single_process_for_every_p(P):
    for seed in (0, 1):
        assert "kg ranking ok" in run_mpi(P, "tests.mpi_kg_ranking", seed).stdout


def test_ties_count_half_and_known_triples_are_skipped():
    x = np.array([[1.0], [2.0], [2.0], [3.0]])      # entity 3 scores above, 1 and 2 tie
    q = np.array([[1.0]])
    none = np.zeros(0, np.int64)
    got = filtered_ranks(WD, 0, x, [(q, np.array([0]), np.array([1]), none)], 4, 1)
    assert got["mrr"] == 1 / 2.5 and got["hits@1"] == 0 and got["hits@3"] == 1
    known = np.sort(triple_keys([0], [0], [3], 4, 1))   # (0, 0, 3) is true: filtered out
    got = filtered_ranks(WD, 0, x, [(q, np.array([0]), np.array([1]), known)], 4, 1)
    assert got["mrr"] == 1 / 1.5


def test_no_queries_or_non_finite_scores_give_nan():
    x = np.ones((3, 2))
    none = np.zeros(0, np.int64)
    assert np.isnan(filtered_ranks(WD, 0, x, [(np.zeros((0, 2)), none, none, none)], 3, 1)["mrr"])
    x[2, 0] = np.nan
    got = filtered_ranks(WD, 0, x, [(np.ones((1, 2)), np.array([0]), np.array([1]), none)], 3, 1)
    assert np.isnan(got["mrr"]) and np.isnan(got["hits@10"])


def test_triple_keys_refuse_overflow():
    with pytest.raises(ValueError, match="too many for 64-bit triple keys"):
        triple_keys([0], [0], [0], 1 << 30, 8)
