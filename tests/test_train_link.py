"""``g3-train --task link`` (g3mpi.train.link): a GCN encoder and a decoder trained on Cora's random link split
85/5/10, the same model for P = 1 and 2 and within 0.01 test ROC-AUC of the single-process PyG run
(tests/link_cora_reference.py); predictions.h5 holds the val and test pairs by original node IDs with the scores
the metrics came from (scikit-learn and OGB's formulas recompute them); Hits@K and MRR as --metric; the misfits
(no link splits, a node metric) are one line on every rank."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import run_module
from tests.graphs import partition, random_graph
from tests.link_reference import ogb_hits, ogb_mrr
from tests.train_runs import error_lines, train

SLOW_TESTS = ("test_link_task_equals_pyg_for_p1_and_p2", "test_hits_and_mrr_equal_ogb_on_the_predictions",
              "test_link_misfits_are_one_line_on_every_rank")
MODEL = ["--task", "link", "--hidden", "128", "--embed-dim", "64", "--dropout", "0", "--weight-decay", "0",
         "--no-plots"]


@pytest.fixture(scope="module")
def cora_lp(tmp_path_factory, cora_npz):
    d = tmp_path_factory.mktemp("cora_lp")
    run_module("data_tools.prepare", "npz", cora_npz, "--link-split", "0.85,0.05,0.1", "--split-seed", "0",
               "--out", d / "g.h5")
    for P in (1, 2):
        run_module("data_tools.partition", d / "g.h5", "--parts", P, "--out", d / f"p{P}")
    return d


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_link_task_equals_pyg_for_p1_and_p2(cora_lp, tmp_path):
    ref = json.loads(run_module("tests.link_cora_reference", cora_lp / "g.h5", "--epochs", 15).stdout.splitlines()[-1])
    got = {}
    for P in (1, 2):
        train(P, cora_lp / f"p{P}", tmp_path / f"r{P}", *MODEL, "--metric", "roc_auc", "--epochs", 15)
        got[P] = summary(tmp_path / f"r{P}")
        assert abs(got[P]["test_roc_auc"] - ref["test_roc_auc"]) <= 0.01, (got[P], ref)
    assert got[1]["best_epoch"] == got[2]["best_epoch"]
    assert got[1]["test_roc_auc"] == pytest.approx(got[2]["test_roc_auc"], abs=1e-4)
    with h5py.File(tmp_path / "r2" / "predictions.h5") as f, h5py.File(cora_lp / "g.h5") as g:
        assert f.attrs["task"] == "link" and f.attrs["best_epoch"] == got[2]["best_epoch"]
        for s in ("val", "test"):
            assert np.array_equal(f[f"{s}_edge"][()], g[f"link_{s}_edge"][()])
            assert np.array_equal(f[f"{s}_neg_target"][:, 0] >= 0, np.ones(len(f[f"{s}_edge"]), bool))
        pos, neg = f["test_score"][()], f["test_neg_score"][()].ravel()
    assert roc_auc_score(np.r_[np.ones(len(pos)), np.zeros(len(neg))], np.r_[pos, neg]) == \
        pytest.approx(got[2]["test_roc_auc"], abs=1e-9)


def test_hits_and_mrr_equal_ogb_on_the_predictions(cora_lp, tmp_path):
    for metric in ("hits@20", "mrr"):
        run = tmp_path / metric.replace("@", "")
        train(2, cora_lp / "p2", run, *MODEL, "--metric", metric, "--epochs", 3)
        s = summary(run)
        with h5py.File(run / "predictions.h5") as f:
            pos, neg = f["test_score"][()], f["test_neg_score"][()]
        want = ogb_hits(pos, neg.ravel(), 20) if metric == "hits@20" else ogb_mrr(pos, neg)
        assert 0 < want < 1 and s[f"test_{metric}"] == pytest.approx(want, abs=1e-9), metric


@pytest.mark.parametrize("case", ["no splits", "node metric"])
def test_link_misfits_are_one_line_on_every_rank(case, cora_lp, tmp_path):
    if case == "no splits":
        partition(random_graph(n=60, c=4, seed=1), 2, tmp_path / "p2")
        parts, extra, want = tmp_path / "p2", ["--metric", "roc_auc"], "task link needs link splits"
    else:
        parts, extra, want = cora_lp / "p2", [], "metric accuracy does not fit task link"
    p = train(2, parts, tmp_path / "r", "--task", "link", "--epochs", "2", *extra, check=False)
    lines = error_lines(p.stderr)
    assert p.returncode != 0 and sorted(lines) == [0, 1], p.stderr
    assert all(len(v) == 1 and want in v[0] for v in lines.values()), p.stderr
    assert not (tmp_path / "r" / "summary.json").exists()
