"""The tasks' losses and metrics (g3mpi.train.tasks, g3mpi.train.metrics) against scikit-learn and torch: ROC-AUC and
AP by the distributed sort at P = 1..4 (tests/mpi_metrics.py), F1 and accuracy, the losses, the misfits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI
from sklearn.metrics import accuracy_score, average_precision_score, f1_score, roc_auc_score

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.config import ConfigError, TrainConfig
from g3mpi.train.metrics import ranking_metrics, score_order
from g3mpi.train.choices import metric_misfit
from g3mpi.train.tasks import evaluate, label_misfit, loss_sum, loss_terms, output_dim, predict
from tests.conftest import run_mpi

SLOW_TESTS = ("test_ranking_metrics_equal_sklearns_on_every_rank",)

WD = Watchdog(MPI.COMM_SELF, 0.0)


@pytest.mark.parametrize("P,timeout", [(1, 0), (2, 0), (3, 30), (4, 0)])
def test_ranking_metrics_equal_sklearns_on_every_rank(P, timeout):
    """Scores with many ties dealt unevenly (one rank empty); with timeout, the watchdog's non-blocking calls."""
    for seed in (0, 1):
        assert "metrics ok" in run_mpi(P, "tests.mpi_metrics", seed, timeout).stdout


def test_score_order_keeps_the_float_order_and_ties_the_zeros():
    s = np.array([-np.inf, -3e38, -1.5, -1e-45, -0.0, 0.0, 1e-45, 2.5, 3e38, np.inf], dtype=np.float32)
    k = score_order(s)
    assert np.all(np.diff(k[[0, 1, 2, 3, 4, 6, 7, 8, 9]]) > 0) and k[4] == k[5]
    assert k.min() >= 0 and k.max() < 2**32


def test_ranking_on_one_rank_with_nonfinite_and_one_class_groups():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 4, 60).astype(np.float32)
    y = rng.random(60) < 0.5
    g = np.repeat([0, 1, 2], 20)
    y[20:40] = False        # group 1: no positive
    s[45] = np.nan          # group 2: a NaN score
    auc, ap = ranking_metrics(WD, s, y, g, 3)
    assert auc[0] == pytest.approx(roc_auc_score(y[:20], s[:20]), rel=1e-12)
    assert ap[0] == pytest.approx(average_precision_score(y[:20], s[:20]), rel=1e-12)
    assert np.isnan(auc[1:]).all() and np.isnan(ap[1:]).all()


def _split_masks(n, rng):
    part = rng.integers(0, 3, n)
    return {s: part == i for i, s in enumerate(("train", "val", "test"))}


def test_multiclass_accuracy_and_f1_macro_equal_sklearns():
    rng = np.random.default_rng(1)
    n, C = 300, 5
    logits = rng.standard_normal((n, C)).astype(np.float32)
    logits[:, 4] -= 10          # class 4 is never predicted ...
    y = rng.integers(0, 4, n)   # ... nor a label: sklearn leaves it out of the macro average
    masks = _split_masks(n, rng)
    out = evaluate("multiclass", "f1_macro", logits, y, masks, WD)
    for s, m in masks.items():
        p = logits[m].argmax(1)
        assert out[f"{s}_acc"] == pytest.approx(accuracy_score(y[m], p), rel=1e-12)
        assert out[f"{s}_f1_macro"] == pytest.approx(f1_score(y[m], p, average="macro"), rel=1e-12)


@pytest.mark.parametrize("metric", ["roc_auc", "ap", "f1_macro"])
def test_binary_metrics_equal_sklearns(metric):
    rng = np.random.default_rng(2)
    n = 400
    logits = np.round(rng.standard_normal((n, 1)), 1).astype(np.float32)
    y = (rng.random(n) < 0.25).astype(np.int64)
    masks = _split_masks(n, rng)
    out = evaluate("binary", metric, logits, y, masks, WD)
    ref = {"roc_auc": roc_auc_score, "ap": average_precision_score,
           "f1_macro": lambda t, z: f1_score(t, (z > 0).astype(int), average="macro")}[metric]
    for s, m in masks.items():
        assert out[f"{s}_{metric}"] == pytest.approx(ref(y[m], logits[m, 0]), rel=1e-12)
        assert out[f"{s}_acc"] == pytest.approx(accuracy_score(y[m], logits[m, 0] > 0), rel=1e-12)


@pytest.mark.parametrize("metric", ["roc_auc", "ap", "f1_macro", "accuracy"])
def test_multilabel_metrics_equal_sklearns_macro(metric):
    rng = np.random.default_rng(3)
    n, C = 500, 4
    logits = np.round(rng.standard_normal((n, C)), 1).astype(np.float32)
    y = (rng.random((n, C)) < 0.3).astype(np.int8)
    masks = _split_masks(n, rng)
    out = evaluate("multilabel", metric, logits, y, masks, WD)
    ref = {"roc_auc": lambda t, z: roc_auc_score(t, z, average="macro"),
           "ap": lambda t, z: average_precision_score(t, z, average="macro"),
           "f1_macro": lambda t, z: f1_score(t, (z > 0).astype(int), average="macro"),
           "accuracy": lambda t, z: accuracy_score(t, (z > 0).astype(int))}[metric]
    key = "acc" if metric == "accuracy" else metric
    for s, m in masks.items():
        assert out[f"{s}_{key}"] == pytest.approx(ref(y[m], logits[m]), rel=1e-12)


def test_multilabel_roc_auc_averages_the_columns_with_both_classes():
    """OGB's rule: a column without a positive (or a negative) in the split is left out, not an error."""
    rng = np.random.default_rng(4)
    n = 200
    logits = rng.standard_normal((n, 3)).astype(np.float32)
    y = (rng.random((n, 3)) < 0.4).astype(np.int8)
    y[:, 2] = 0
    masks = {"train": np.ones(n, bool)}
    out = evaluate("multilabel", "roc_auc", logits, y, masks, WD)
    assert out["train_roc_auc"] == pytest.approx(roc_auc_score(y[:, :2], logits[:, :2]), rel=1e-12)


def test_losses_equal_torch_means_and_skip_unknown_labels():
    torch.manual_seed(0)
    z = torch.randn(50, 3, requires_grad=True)
    mask = torch.rand(50) < 0.6
    y = torch.randint(0, 3, (50,))
    assert torch.allclose(loss_sum("multiclass", z, y, mask) / int(mask.sum()), F.cross_entropy(z[mask], y[mask]))
    yb = torch.randint(0, 2, (50,))
    assert torch.allclose(loss_sum("binary", z[:, :1], yb, mask) / int(mask.sum()),
                          F.binary_cross_entropy_with_logits(z[mask, 0], yb[mask].float()))
    ym = torch.randint(-1, 2, (50, 3)).to(torch.int8)   # -1: unknown
    k = ym[mask] >= 0
    loss = loss_sum("multilabel", z, ym, mask) / loss_terms("multilabel", ym.numpy(), mask.numpy())
    assert torch.allclose(loss, F.binary_cross_entropy_with_logits(z[mask][k], ym[mask][k].float()))
    loss.backward()
    assert torch.isfinite(z.grad).all()


def test_outputs_predictions_and_misfits():
    assert (output_dim("binary", 2), output_dim("multiclass", 7), output_dim("multilabel", 7)) == (1, 7, 7)
    z = np.array([[-1.0, 2.0], [0.5, -0.5]], dtype=np.float32)
    assert predict("multiclass", z).tolist() == [1, 0]
    assert predict("binary", z[:, :1]).tolist() == [0, 1]
    assert predict("multilabel", z).tolist() == [[0, 1], [1, 0]]
    assert "multilabel" in label_misfit("multilabel", np.zeros(3, np.int64), 3)
    assert "2 classes" in label_misfit("binary", np.zeros(3, np.int64), 3)
    assert "--task multilabel" in label_misfit("multiclass", np.zeros((3, 2), np.int8), 2)
    assert label_misfit("binary", np.zeros(3, np.int64), 2) is None
    assert "does not fit task multiclass" in metric_misfit("multiclass", "roc_auc")
    with pytest.raises(ConfigError, match="metric roc_auc does not fit task multiclass"):
        TrainConfig(metric="roc_auc")
    assert TrainConfig(task="binary", metric="ap").metric == "ap"
