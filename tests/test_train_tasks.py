"""g3-train's tasks and metrics end to end: a binary task (Chameleon, class 0 against the rest) and a multi-label one
(Cora's classes one-hot and a second column) at several P, the chosen metric reported and P-independent, equal to
scikit-learn's on predictions.h5; resume; one clear line on every rank for a metric or labels that do not fit."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from g3mpi.format import Graph
from tests.conftest import REPO, run_mpi
from tests.graphs import cora_graph, csr_from_edges, partition, random_graph
from tests.train_runs import error_lines

pytestmark = pytest.mark.slow

MOD = "g3mpi.cli.train"
CHAMELEON = REPO / "data" / "chameleon_filtered.npz"


def chameleon_binary() -> Graph:
    """Chameleon (filtered), label 1 for class 0 and 0 for the others (22 % positives on its first split)."""
    d = np.load(CHAMELEON)
    n = d["x"].shape[0]
    indptr, indices = csr_from_edges(d["edge_index"][0], d["edge_index"][1], n)
    y = (d["y"] == 0).astype(np.int64)
    return Graph(indptr, indices, d["x"].astype(np.float32), y, d["train_mask"], d["val_mask"], d["test_mask"],
                 dict(num_classes=2, source="npz:chameleon-binary"))


def cora_multilabel(cora_npz) -> Graph:
    """Cora's 7 classes one-hot, and an 8th column: the node has at least 4 in-edges."""
    g = cora_graph(cora_npz)
    Y = np.zeros((g.num_nodes, 8), dtype=np.int8)
    Y[np.arange(g.num_nodes), g.labels] = 1
    Y[:, 7] = np.diff(g.indptr) >= 4
    g.labels = Y
    g.attrs["num_classes"] = 8
    return g


def train(P, parts, out, *extra, check=True):
    return run_mpi(P, MOD, "--parts", parts, "--out", out, "--no-progress", "--log-level", "WARNING", "--hidden",
                   "16", "--seed", "3", *extra, check=check)


def summary(run) -> dict:
    return json.loads((run / "summary.json").read_text())


def split_scores(g: Graph, run, split: str):
    """(labels, logits) of the split's nodes, from predictions.h5 (rows by original node ID)."""
    with h5py.File(run / "predictions.h5") as f:
        logits, pred = f["logits"][()], f["pred"][()]
        assert f.attrs["task"] in ("binary", "multilabel")
    m = getattr(g, f"{split}_mask")
    return g.labels[m], logits[m], pred[m]


def test_binary_task_reports_roc_auc_equal_to_sklearn_and_the_same_for_every_P(tmp_path):
    g = chameleon_binary()
    args = ["--task", "binary", "--metric", "roc_auc", "--epochs", "5", "--dropout", "0.5", "--no-plots"]
    for P in (1, 2, 4):
        partition(g, P, tmp_path / f"p{P}", seed=P)
        train(P, tmp_path / f"p{P}", tmp_path / f"r{P}", *args)
    s1 = summary(tmp_path / "r1")
    assert s1["metric"] == "roc_auc" and s1["task"] == "binary"
    for P in (1, 2, 4):   # each P's metric is exactly sklearn's on its own logits
        s = summary(tmp_path / f"r{P}")
        for split in ("train", "test"):
            y, z, pred = split_scores(g, tmp_path / f"r{P}", split)
            assert z.shape[1] == 1 and set(np.unique(pred)) <= {0, 1}
            assert s[f"{split}_roc_auc"] == pytest.approx(roc_auc_score(y, z[:, 0]), rel=1e-9)
            assert s[f"{split}_acc"] == pytest.approx(float(((z[:, 0] > 0) == y).mean()), rel=1e-9)
        # the logits agree across P up to rounding (~1e-7), which can split or join a few ties among the many
        # nodes of equal features: a pair of ~30k in the training split moves the ROC-AUC by 3.5e-5
        assert s["best_epoch"] == s1["best_epoch"]
        for k in ("train_roc_auc", "val_roc_auc", "test_roc_auc", "test_acc"):
            assert s[k] == pytest.approx(s1[k], abs=1e-3), (P, k)


def test_binary_run_resumes_to_the_straight_runs_result(tmp_path):
    g = chameleon_binary()
    partition(g, 2, tmp_path / "p2", seed=2)
    args = ["--task", "binary", "--metric", "ap", "--no-plots", "--dropout", "0.5"]
    train(2, tmp_path / "p2", tmp_path / "straight", *args, "--epochs", "6")
    train(2, tmp_path / "p2", tmp_path / "cut", *args, "--epochs", "3")
    run_mpi(2, MOD, "--resume", tmp_path / "cut", "--epochs", "6", "--no-progress", "--log-level", "WARNING")
    a, b = summary(tmp_path / "straight"), summary(tmp_path / "cut")
    for k in ("best_epoch", "train_ap", "val_ap", "test_ap", "val_acc"):
        assert a[k] == b[k], k


def test_multilabel_task_reports_macro_ap_equal_to_sklearn_for_every_P(cora_npz, tmp_path):
    g = cora_multilabel(cora_npz)
    args = ["--task", "multilabel", "--metric", "ap", "--epochs", "6", "--dropout", "0"]
    for P in (1, 3):
        partition(g, P, tmp_path / f"p{P}", seed=P)
        train(P, tmp_path / f"p{P}", tmp_path / f"r{P}", *args, *(["--no-plots"] if P > 1 else []))
    s1, s3 = summary(tmp_path / "r1"), summary(tmp_path / "r3")
    y, z, pred = split_scores(g, tmp_path / "r1", "val")
    assert pred.shape == y.shape and pred.dtype == np.int8
    assert s1["val_ap"] == pytest.approx(average_precision_score(y, z, average="macro"), rel=1e-9)
    y, z, _ = split_scores(g, tmp_path / "r1", "test")
    assert s1["test_ap"] == pytest.approx(average_precision_score(y, z, average="macro"), rel=1e-9)
    assert (tmp_path / "r1" / "training.png").exists()
    for k in ("train_ap", "val_ap", "test_ap", "test_acc"):   # (up to ties that rounding splits, as above)
        assert s3[k] == pytest.approx(s1[k], abs=1e-3), k


@pytest.mark.parametrize("case", ["metric", "binary", "multilabel", "multiclass"])
def test_a_task_or_metric_that_does_not_fit_is_one_line_on_every_rank(case, cora_npz, tmp_path):
    g = cora_multilabel(cora_npz) if case == "multiclass" else random_graph(n=60, c=4, seed=1)
    partition(g, 2, tmp_path / "p2")
    extra = {"metric": ["--metric", "roc_auc"], "binary": ["--task", "binary"],
             "multilabel": ["--task", "multilabel"], "multiclass": []}[case]
    p = train(2, tmp_path / "p2", tmp_path / "r", "--epochs", "2", *extra, check=False)
    want = {"metric": "metric roc_auc does not fit task multiclass", "binary": "task binary needs labels 0/1",
            "multilabel": "task multilabel needs labels [N, C]", "multiclass": "(--task multilabel)"}[case]
    lines = error_lines(p.stderr)
    assert p.returncode != 0 and sorted(lines) == [0, 1], p.stderr
    assert all(len(v) == 1 and want in v[0] for v in lines.values()), p.stderr
    assert not (tmp_path / "r" / "summary.json").exists()


def test_binary_run_outputs_say_what_a_user_expects(tmp_path):
    """A binary run with the defaults, stderr a pipe (as in a batch job): predictions.h5 names the graph's 2 classes
    and the model's 1 output, config.toml keeps comm_timeout and progress as "auto", no progress bar is drawn into
    the log (it was unless --no-progress), and training.png is drawn for the chosen metric."""
    g = random_graph(n=120, c=2, seed=5)
    partition(g, 2, tmp_path / "p2", seed=1)
    p = run_mpi(2, MOD, "--parts", tmp_path / "p2", "--out", tmp_path / "run", "--task", "binary", "--metric",
                "roc_auc", "--epochs", "3", "--hidden", "8")
    assert "epoch/s" not in p.stderr and "\r" not in p.stderr and "it/s" not in p.stderr, p.stderr
    with h5py.File(tmp_path / "run" / "predictions.h5") as f:
        assert f.attrs["num_classes"] == 2 and f.attrs["num_outputs"] == 1 and f["logits"].shape == (120, 1)
    saved = (tmp_path / "run" / "config.toml").read_text()
    assert 'comm_timeout = "auto"' in saved and 'progress = "auto"' in saved, saved
    assert (tmp_path / "run" / "training.png").is_file()
