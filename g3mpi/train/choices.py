"""The tasks and metrics a run chooses from, and which metric fits which task: plain names (no torch, no MPI), so
that the settings and ``g3-train --help`` import neither. :mod:`.tasks`, :mod:`.link` and :mod:`.metrics` compute
them."""
from __future__ import annotations

TASKS = ("multiclass", "binary", "multilabel", "link")
#: the decoders of ``--task link`` (``g3mpi.nn.link.DECODERS``)
DECODERS = ("dot", "hadamard", "distmult")
#: the K of OGB's Hits@K that ``--metric hits@K`` takes (the values OGB's link datasets and papers report)
HITS_K = (1, 3, 10, 20, 50, 100)
HITS = tuple(f"hits@{k}" for k in HITS_K)
#: the metrics g3-train can report, select the best epoch and stop early by (larger is better for all)
METRICS = ("accuracy", "roc_auc", "ap", "f1_macro", "mrr") + HITS
#: the summary key of each metric after ``<split>_`` (accuracy keeps the ``*_acc`` keys of the existing tools)
SUFFIX = {"accuracy": "acc", "roc_auc": "roc_auc", "ap": "ap", "f1_macro": "f1_macro", "mrr": "mrr",
          **{h: h for h in HITS}}
#: the metrics that fit each task (ROC-AUC and AP rank one score per label: none for a multiclass softmax; the
#: ranking metrics of pairs only for link prediction)
NODE_RANKED = ("accuracy", "roc_auc", "ap", "f1_macro")
TASK_METRICS = {"multiclass": ("accuracy", "f1_macro"), "binary": NODE_RANKED, "multilabel": NODE_RANKED,
                "link": ("roc_auc", "ap", "mrr") + HITS}


def metric_misfit(task: str, metric: str) -> str | None:
    """Why ``metric`` cannot judge ``task``, or None."""
    if metric not in TASK_METRICS[task]:
        if task == "link":
            return (f"metric {metric} does not fit task link (it takes {', '.join(TASK_METRICS[task])}: the "
                    "scores of node pairs are ranked)")
        why = ("mrr and hits@K rank node pairs: --task link" if metric in ("mrr",) + HITS else
               "roc_auc and ap rank one score per label: --task binary or multilabel")
        return f"metric {metric} does not fit task {task} (it takes {', '.join(TASK_METRICS[task])}; {why})"
    return None
