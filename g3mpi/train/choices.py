"""The tasks and metrics a run chooses from, and which metric fits which task: plain names (no torch, no MPI), so
that the settings and ``g3-train --help`` import neither. :mod:`.tasks` and :mod:`.metrics` compute them."""
from __future__ import annotations

TASKS = ("multiclass", "binary", "multilabel")
#: the metrics g3-train can report, select the best epoch and stop early by (larger is better for all)
METRICS = ("accuracy", "roc_auc", "ap", "f1_macro")
#: the summary key of each metric after ``<split>_`` (accuracy keeps the ``*_acc`` keys of the existing tools)
SUFFIX = {"accuracy": "acc", "roc_auc": "roc_auc", "ap": "ap", "f1_macro": "f1_macro"}
#: the metrics that fit each task (ROC-AUC and AP rank one score per label: none for a multiclass softmax)
TASK_METRICS = {"multiclass": ("accuracy", "f1_macro"), "binary": METRICS, "multilabel": METRICS}


def metric_misfit(task: str, metric: str) -> str | None:
    """Why ``metric`` cannot judge ``task``, or None."""
    if metric not in TASK_METRICS[task]:
        return (f"metric {metric} does not fit task {task} (it takes {', '.join(TASK_METRICS[task])}; "
                "roc_auc and ap rank one score per label: --task binary or multilabel)")
    return None
