"""Suite ``precision``: fp32 against bf16-mixed and 16-bit halo messages, same graph, seed and model.

Each variant is a whole ``g3-train`` run (``mpiexec -n P``, its own processes, so each has its own peak RSS), the
variants alternating launch by launch (fp32, bf16-mixed, halo bfloat16, halo float16, fp32, ...) so that all see
the same machine load. From each run's summary.json: the median epoch time, the bytes sent per epoch, the peak
RSS (max over ranks; per owned row: divided by the largest part's owned rows) and the final test metric (the best
validation epoch's). Ratios are against fp32's, medians over the launches. Halo variants need P >= 2 (one rank
sends nothing) and are skipped on one rank; ``--sim-net`` applies to every variant.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from g3mpi.nn import specs

from .common import BenchError, Sizes, child_env, median, mpiexec, prepare_graph, prepare_parts, progress, ratio

#: name -> (--precision, --halo-dtype)
VARIANTS = {"fp32": ("fp32", "float32"), "bf16-mixed": ("bf16-mixed", "float32"),
            "halo-bfloat16": ("fp32", "bfloat16"), "halo-float16": ("fp32", "float16")}


def train_args(model: str, sz: Sizes) -> list:
    """g3-train's model options for sizes ``sz`` (GAT: hidden width = heads x channels)."""
    hidden = sz.dims[1] if len(sz.dims) > 2 else sz.dims[-1]
    if specs.spec(model).attention:
        hidden = max(1, hidden // sz.heads)
    return ["--model", model, "--hidden", hidden, "--layers", sz.layers, "--heads", sz.heads]


def launch(P: int, parts: Path, run_dir: Path, args: list, threads: int, timeout: float = 3600) -> dict:
    """One ``g3-train`` run on P ranks: its summary.json."""
    cmd = [mpiexec(), "-n", str(P), sys.executable, "-m", "mpi4py", "-m", "g3mpi.cli.train", "--parts", str(parts),
           "--out", str(run_dir), "--force", "--no-progress", "--no-plots", "--timeline-epoch", "0",
           "--threads", str(threads), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(threads), timeout=timeout)
    summary = run_dir / "summary.json"
    if p.returncode != 0 or not summary.exists():
        raise BenchError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr.strip()[-3000:]}")
    return json.loads(summary.read_text())


def run(sz: Sizes, work: Path, ranks: int = 1, models=("gcn",), sim_net: str = "", repeats: int = 1,
        seed: int = 0, variants=tuple(VARIANTS)) -> dict:
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work)
    meta = json.loads((parts / "meta.json").read_text())
    owned = max(int(p["owned"]) for p in meta["parts"])
    names = [v for v in variants if ranks > 1 or VARIANTS[v][1] == "float32"]
    net = ["--sim-net", sim_net] if sim_net and ranks > 1 else []
    out = dict(graph=graph.name, ranks=ranks, sim_net=sim_net or None, seed=seed, owned_rows_max=owned,
               skipped=[v for v in variants if v not in names], models={})
    for model in models:
        runs = {v: [] for v in names}
        for rep in range(repeats):
            for v in names:
                prec, halo = VARIANTS[v]
                progress(f"precision: {model} {v}, launch {rep + 1}/{repeats}")
                s = launch(ranks, parts, work / f"precision-{model}-{v}",
                           [*train_args(model, sz), "--epochs", sz.epochs + 1, "--eval-every", sz.epochs + 1,
                            "--seed", seed, "--precision", prec, "--halo-dtype", halo, *net], sz.threads)
                runs[v].append(dict(epoch_time_median_s=s["epoch_time_median_s"],
                                    bytes_sent_per_epoch=s["bytes_sent_per_epoch"],
                                    peak_rss_bytes=s["peak_rss_bytes_max"],
                                    peak_rss_per_owned_row=s["peak_rss_bytes_max"] / max(owned, 1),
                                    test_metric=s["test_acc"], metric=s["metric"], final_loss=s["final_loss"]))
        res = {}
        for v, rs in runs.items():
            res[v] = dict(launches=rs, **{k: median([r[k] for r in rs]) for k in
                                          ("epoch_time_median_s", "bytes_sent_per_epoch", "peak_rss_bytes",
                                           "peak_rss_per_owned_row", "test_metric")})
        base = res["fp32"]
        for v in res.values():
            v["vs_fp32"] = dict(epoch_time=ratio(v["epoch_time_median_s"], base["epoch_time_median_s"]),
                                bytes=ratio(v["bytes_sent_per_epoch"], base["bytes_sent_per_epoch"]),
                                peak_rss=ratio(v["peak_rss_bytes"], base["peak_rss_bytes"]),
                                test_metric_points=100.0 * (v["test_metric"] - base["test_metric"]))
        progress(f"precision: {model}: " + ", ".join(
            f"{v} {r['vs_fp32']['epoch_time']:.3f}x time, {r['vs_fp32']['peak_rss']:.3f}x RSS"
            for v, r in res.items()))
        out["models"][model] = res
    return out
