"""Suite ``schedules``: the pipelined schedule against blocking and nocomm under a simulated network.

P ranks (default 4) train the same model; the three schedules take turns epoch by epoch in the same processes
(``Trainer.train_step`` with ``DistGraph.schedule`` switched), under ``--sim-net`` (each message lands no
earlier than latency + size / bandwidth after it was posted, one outgoing link per rank). nocomm skips the
exchange (compute only; its results are wrong by design). Reported: median epoch times, pipelined / blocking
and pipelined / nocomm, and per rank compute, blocked and idle time. The input cache is off
(``--no-input-cache``), so every layer's exchange runs in every epoch.
"""
from __future__ import annotations

from pathlib import Path

from g3mpi.sched import BLOCKING, MODES, NOCOMM, PIPELINED

from .common import Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, variant_summary, \
    worker_model_args

SCHEDULES = MODES


def run(sz: Sizes, work: Path, ranks: int = 4, sim_net: str = "10Gbit,20us", models=("gcn", "gat"),
        balance: str = "edges") -> dict:
    """``balance``: METIS vertex weights of the partition (default edges: an R-MAT graph split by node counts
    leaves one rank with most of the edges, and the others then wait for it whatever the schedule)."""
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work, balance=balance)
    res = dict(graph=graph.name, ranks=ranks, sim_net=sim_net, balance=balance, models={})
    for model in models:
        progress(f"schedules: {model} on {ranks} ranks, sim-net {sim_net}")
        out = run_worker(ranks, ["--parts", parts, "--designs", "g3", "--schedules", ",".join(SCHEDULES),
                                 "--no-input-cache",
                                 "--sim-net", sim_net, "--epochs", sz.epochs, *worker_model_args(model, sz)],
                         work / f"schedules-{model}-{ranks}.json", threads=sz.threads)
        d = {v["schedule"]: variant_summary(v) for v in out["variants"].values()}
        t = {s: d[s]["epoch_time_median_s"] for s in SCHEDULES}
        res["models"][model] = dict(schedules=d, epoch_time_median_s=t,
                                    pipelined_vs_blocking=ratio(t[PIPELINED], t[BLOCKING]),
                                    pipelined_vs_nocomm=ratio(t[PIPELINED], t[NOCOMM]))
        progress(f"schedules: {model}: pipelined {t[PIPELINED]:.3f}s, blocking {t[BLOCKING]:.3f}s, "
                 f"nocomm {t[NOCOMM]:.3f}s")
    return res
