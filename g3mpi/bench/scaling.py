"""Suite ``scaling``: ranks against threads on this machine, and 1 -> 8 ranks oversubscribed (informational).

Real comparison: 1 rank x T threads against T ranks x 1 thread (T = --threads, at least 2, default 2: the
machine's cores), same graph and model; the launches alternate (A, B, A, B, ...) so both see the same machine
load, and the median of the per-launch median epoch times is compared. Oversubscribed: P = 1, 2, 4, 8 ranks x 1
thread on this machine; with more ranks than cores these times measure the runtime's overheads, not a speed-up,
and are marked informational.
"""
from __future__ import annotations

from pathlib import Path

from .common import Sizes, median, prepare_graph, prepare_parts, progress, ratio, run_worker, variant_summary, \
    worker_model_args


def run(sz: Sizes, work: Path, model: str = "gcn", repeats: int = 2, oversub=(1, 2, 4, 8)) -> dict:
    graph = prepare_graph(sz, work)
    T = sz.threads
    if T < 2:
        raise ValueError(f"scaling compares 1 rank x T threads with T ranks x 1 thread: T = {T} must be at least 2")
    margs = worker_model_args(model, sz)
    configs = [(1, T), (T, 1)]
    runs = {f"{P}x{t}": [] for P, t in configs}
    for rep in range(repeats):
        for P, t in configs:
            parts = prepare_parts(graph, P, work)
            progress(f"scaling: {P} rank(s) x {t} thread(s), launch {rep + 1}/{repeats}")
            out = run_worker(P, ["--parts", parts, "--epochs", sz.epochs, *margs], work / f"scaling-{P}x{t}.json",
                             threads=t)
            runs[f"{P}x{t}"].append(variant_summary(out["variants"]["g3"]))
    real = {k: dict(launches=v, epoch_time_median_s=median([x["epoch_time_median_s"] for x in v]))
            for k, v in runs.items()}
    a, b = real[f"1x{T}"]["epoch_time_median_s"], real[f"{T}x1"]["epoch_time_median_s"]
    res = dict(graph=graph.name, model=model, threads=T, real=real, ranks_vs_threads=ratio(b, a),
               oversubscribed=dict(informational=True, note="more ranks than cores: not a speed-up measurement",
                                   runs={}))
    progress(f"scaling: 1x{T} {a:.3f}s, {T}x1 {b:.3f}s")
    for P in oversub:
        if P == T:
            # the same configuration as the real T x 1 runs: reuse their last launch
            res["oversubscribed"]["runs"][str(P)] = runs[f"{T}x1"][-1]
            continue
        parts = prepare_parts(graph, P, work)
        progress(f"scaling: {P} rank(s) x 1 thread (oversubscribed, informational)")
        out = run_worker(P, ["--parts", parts, "--epochs", sz.epochs, *margs], work / f"scaling-over-{P}.json",
                         threads=1)
        res["oversubscribed"]["runs"][str(P)] = variant_summary(out["variants"]["g3"])
    return res
