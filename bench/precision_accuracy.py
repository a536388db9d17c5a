"""Accuracy of bf16-mixed and of 16-bit halos against fp32, and of P = 1, 2, 4 ranks (issue 52), 5 seeds each.

Tasks: Cora GCN 2 x 16 (the README's settings), chameleon with the residual GNN of docs/examples/resnet_gnn.py, and
a binary task (an SBM graph of two classes, ROC AUC). Variants: fp32 on P = 1, 2, 4; bf16-mixed on P = 1; 16-bit
halos (bfloat16, float16) on P = 2 (a halo needs two ranks). Every run is a whole ``g3-train``; its summary's
test metric is collected. Writes OUT/accuracy.json (every run's metric, per variant the mean over seeds and its
difference from fp32's on one rank, in points) and prints the table.

    python bench/precision_accuracy.py --out DIR [--seeds 5] [--tasks cora,chameleon,binary] [--variants ...]

OUT/accuracy.json is rewritten after every run; a run whose OUT/work/runs/<task>-<variant>-s<seed>/summary.json
exists is not run again (delete OUT/work/runs to start over).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
DATASETS = Path(os.environ.get("G3_DATASETS", "/work/shared/datasets"))

#: task -> (prepare arguments, train arguments, metric)
TASKS = {
    "cora": (["npz", str(ROOT / "data" / "cora.npz"), "--normalize-features"],
             ["--model", "gcn", "--epochs", "200"], "accuracy"),
    "chameleon": (["npz", str(DATASETS / "chameleon_filtered.npz")],
                  ["--model-file", f"{ROOT / 'docs' / 'examples' / 'resnet_gnn.py'}:build", "--layers", "2",
                   "--hidden", "256", "--dropout", "0.2", "--lr", "1e-4", "--weight-decay", "0", "--epochs", "300"],
                  "accuracy"),
    "binary": (["sbm", "--nodes", "2000", "--classes", "2", "--feature-dim", "16", "--avg-degree", "8",
                "--homophily", "0.6", "--noise", "1", "--seed", "1"],
               ["--model", "gcn", "--hidden", "32", "--epochs", "100", "--task", "binary", "--metric", "roc_auc"],
               "roc_auc"),
}
#: variant -> (ranks, extra g3-train arguments)
VARIANTS = {
    "fp32-p1": (1, []),
    "bf16-mixed-p1": (1, ["--precision", "bf16-mixed"]),
    "fp32-p2": (2, []),
    "halo-bfloat16-p2": (2, ["--halo-dtype", "bfloat16"]),
    "halo-float16-p2": (2, ["--halo-dtype", "float16"]),
    "fp32-p4": (4, []),
}


def sh(*args) -> None:
    subprocess.run([str(a) for a in args], check=True, stdout=subprocess.DEVNULL)


def test_metric(summary: dict, metric: str) -> float:
    key = "test_acc" if metric == "accuracy" else f"test_{metric}"
    if key not in summary:
        raise SystemExit(f"summary: no {key} (it has {', '.join(k for k in summary if k.startswith('test_'))})")
    return float(summary[key])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    work = a.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    res = dict(command=" ".join(sys.argv), seeds=a.seeds, tasks={})
    for task in a.tasks.split(","):
        prep, train, metric = TASKS[task]
        graph = work / f"{task}.h5"
        if not graph.exists():
            sh(BIN / "g3-prepare", *prep, "--out", graph, "-q")
        r = res["tasks"][task] = dict(metric=metric, train_args=train, runs={}, mean={}, diff_points={})
        for v in a.variants.split(","):
            P, extra = VARIANTS[v]
            parts = work / f"{task}-p{P}"
            if not parts.exists():
                sh(BIN / "g3-partition", graph, "--parts", P, "--method", "metis", "--out", parts)
            got = []
            for seed in range(a.seeds):
                run = work / "runs" / f"{task}-{v}-s{seed}"
                t0 = time.time()
                if not (run / "summary.json").exists():
                    sh(BIN / "mpiexec", "-n", P, BIN / "g3-train", "--parts", parts, "--out", run, "--force",
                       "--seed", seed, "--no-plots", "--no-progress", *train, *extra)
                got.append(test_metric(json.loads((run / "summary.json").read_text()), metric))
                print(f"{task} {v} seed {seed}: {got[-1]:.4f} ({time.time() - t0:.0f} s)", flush=True)
                r["runs"][v] = got
                r["mean"][v] = statistics.mean(got)
                base = r["mean"].get("fp32-p1")
                if base is not None:
                    r["diff_points"] = {v: 100 * (m - base) for v, m in r["mean"].items()}
                (a.out / "accuracy.json").write_text(json.dumps(res, indent=1))
    for task, r in res["tasks"].items():
        print(f"{task} ({r['metric']}): " + ", ".join(
            f"{v} {m:.4f} ({r['diff_points'].get(v, float('nan')):+.2f})" for v, m in r["mean"].items()))


if __name__ == "__main__":
    main()
