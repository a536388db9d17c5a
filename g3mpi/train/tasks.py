"""What a run learns and how it is judged: the loss, the predictions and the metrics of each task.

- ``multiclass``: one label in [0, C) per node, C logits, softmax cross-entropy; prediction argmax.
- ``binary``: labels 0/1 (a graph of 2 classes), one logit z, ``BCEWithLogits``; prediction ``z > 0``, score z.
- ``multilabel``: labels [N, C] of 0/1 (-1: unknown, left out of the loss and the metrics), C logits, one
  ``BCEWithLogits`` per known entry; prediction ``z > 0`` per column, scores the logits.

The loss is a sum over this rank's training nodes (entries for multilabel) divided by their number in the whole
graph, so the sum over ranks is the single-process mean (:mod:`.trainer`). Metrics (:mod:`.metrics`) are computed
over all nodes of each split, the same on every rank:

- ``accuracy``: the share of nodes predicted right (multilabel: all known entries of the node right, sklearn's
  subset accuracy); reported as ``<split>_acc`` for every task and metric.
- ``f1_macro``: sklearn's ``f1_score(average="macro")``: multiclass and binary over the classes that occur in the
  split's labels or predictions; multilabel over the columns (F1 of the positives of each).
- ``roc_auc``, ``ap`` (binary, multilabel): sklearn's ``roc_auc_score`` and ``average_precision_score`` of the
  logits; multilabel: the mean over the columns that have a positive and a negative node in the split (the rule of
  OGB's ogbn-proteins evaluator; sklearn's macro average when every column has both).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .choices import SUFFIX
from .metrics import macro_f1, ranking_metrics


def output_dim(task: str, num_classes: int) -> int:
    """The model's number of outputs: 1 logit for binary, one per class (column) otherwise."""
    return 1 if task == "binary" else int(num_classes)


def label_misfit(task: str, labels: np.ndarray, num_classes: int) -> str | None:
    """Why the graph's labels (``labels`` [n] or [n, C], ``num_classes`` C) cannot train ``task``, or None."""
    if task == "multilabel":
        if labels.ndim != 2:
            return ("task multilabel needs labels [N, C] of 0/1 per node, but the graph has one class per node "
                    "(--task multiclass, or prepare it from a multi-label y)")
        return None
    if labels.ndim != 1:
        return (f"task {task} needs one label per node, but the graph has multi-label labels [N, {num_classes}] "
                "(--task multilabel)")
    if task == "binary" and num_classes != 2:
        return (f"task binary needs labels 0/1 (a graph of 2 classes), but the graph has {num_classes} classes "
                "(--task multiclass, or prepare it with two classes)")
    return None


def loss_sum(task: str, logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The loss summed over the nodes of ``mask`` (multilabel: over their known entries). ``logits`` [n, out],
    ``y`` [n] int64 or [n, C] (multilabel), ``mask`` bool [n]."""
    z, t = logits[mask], y[mask]
    if task == "multiclass":
        return F.cross_entropy(z, t, reduction="sum")
    if task == "binary":
        return F.binary_cross_entropy_with_logits(z[:, 0], t.to(z.dtype), reduction="sum")
    k = t >= 0
    return F.binary_cross_entropy_with_logits(z[k], t[k].to(z.dtype), reduction="sum")


def loss_terms(task: str, y: np.ndarray, mask: np.ndarray) -> int:
    """The number of terms of :func:`loss_sum` on this rank: the nodes of ``mask`` (multilabel: their known
    entries). Summed over the ranks, the loss's denominator."""
    if task == "multilabel":
        return int((y[mask] >= 0).sum())
    return int(mask.sum())


def predict(task: str, logits: np.ndarray) -> np.ndarray:
    """The predictions of ``logits`` [n, out]: int64 [n] classes (binary: 0/1), multilabel int8 [n, C] of 0/1."""
    if task == "multiclass":
        return logits.argmax(axis=1).astype(np.int64) if logits.shape[1] else np.zeros(len(logits), np.int64)
    if task == "binary":
        return (logits[:, 0] > 0).astype(np.int64)
    return (logits > 0).astype(np.int8)


def evaluate(task: str, metric: str, logits: np.ndarray, y: np.ndarray, masks: dict, wd) -> dict:
    """``<split>_acc``, and ``<split>_<metric>`` unless the metric is accuracy, for each split of ``masks`` (split
    name -> bool [n]) over all ranks (every rank calls it, every rank gets the same dict). ``logits`` [n, out]
    float32, ``y`` this rank's labels; ``wd``: the watchdog whose collectives it uses."""
    splits = list(masks)
    S = len(splits)
    pred = predict(task, logits)
    C = 2 if task == "binary" else logits.shape[1]
    # per split: nodes right, nodes; then true positives, false positives and false negatives per class (column)
    # and the classes seen in the labels or the predictions
    c = np.zeros((S, 2 + 4 * C), dtype=np.int64)
    for i, s in enumerate(splits):
        m = masks[s]
        p, t = pred[m], y[m]
        if task == "multilabel":
            k = t >= 0
            right = (p == t) | ~k
            c[i, 0], c[i, 1] = int(right.all(axis=1).sum()), len(t)
            tp, fp, fn = ((p == 1) & (t == 1)).sum(0), ((p == 1) & (t == 0)).sum(0), ((p == 0) & (t == 1)).sum(0)
            seen = k.sum(0)
        else:
            c[i, 0], c[i, 1] = int((p == t).sum()), len(t)
            tp = np.bincount(t[p == t], minlength=C)[:C]
            fp = np.bincount(p[p != t], minlength=C)[:C]
            fn = np.bincount(t[p != t], minlength=C)[:C]
            seen = np.bincount(t, minlength=C)[:C] + np.bincount(p, minlength=C)[:C]
        c[i, 2:] = np.concatenate([tp, fp, fn, seen])
    wd.allreduce(c, what="evaluation")
    out = {f"{s}_acc": (c[i, 0] / c[i, 1]) if c[i, 1] else float("nan") for i, s in enumerate(splits)}
    if metric == "f1_macro":
        tp, fp, fn, seen = (c[:, 2 + j * C:2 + (j + 1) * C] for j in range(4))
        f1 = macro_f1(tp, fp, fn, seen > 0)
        out.update({f"{s}_{SUFFIX[metric]}": float(f1[i]) if c[i, 1] else float("nan") for i, s in enumerate(splits)})
    elif metric in ("roc_auc", "ap"):
        out.update(_ranked(task, metric, logits, y, masks, wd))
    return out


def _ranked(task: str, metric: str, logits: np.ndarray, y: np.ndarray, masks: dict, wd) -> dict:
    """``<split>_<metric>`` of a ranking metric (binary: of the split's nodes; multilabel: the mean over the
    columns that have both classes in the split)."""
    splits = list(masks)
    split_of = np.full(len(y), -1, dtype=np.int64)
    for i, s in enumerate(splits):
        split_of[masks[s]] = i
    rows = split_of >= 0
    if task == "binary":
        auc, ap = ranking_metrics(wd, logits[rows, 0], y[rows] == 1, split_of[rows], len(splits))
        val = auc if metric == "roc_auc" else ap
        return {f"{s}_{SUFFIX[metric]}": float(val[i]) for i, s in enumerate(splits)}
    C = y.shape[1]
    t = y[rows]
    k = t >= 0
    group = split_of[rows][:, None] * C + np.arange(C)[None, :]
    auc, ap = ranking_metrics(wd, logits[rows][k], t[k] == 1, group[k], len(splits) * C)
    val = (auc if metric == "roc_auc" else ap).reshape(len(splits), C)
    both = ~np.isnan(auc.reshape(len(splits), C))   # the columns with a positive and a negative (finite scores)
    out = {}
    for i, s in enumerate(splits):
        v = val[i][both[i]]
        out[f"{s}_{SUFFIX[metric]}"] = float(v.mean()) if len(v) else float("nan")
    return out
