"""Suite ``schedules``: the pipelined schedule against blocking and nocomm under a simulated network.

For every configuration (a rank count P and a ``--sim-net``; several of each in one invocation) P ranks train
the same model; the three schedules take turns epoch by epoch in the same processes (``Trainer.train_step`` with
``DistGraph.schedule`` switched), under ``--sim-net`` (each message lands no earlier than latency + size /
bandwidth after it was posted, one outgoing link per rank). nocomm skips the exchange (compute only; its
results are wrong by design). ``bind_to`` (``core``: ``mpiexec -bind-to core``) pins each rank to a core.

Reported per configuration and model: median epoch times; pipelined / blocking, pipelined / nocomm and
pipelined / ideal, where ideal = max(nocomm, blocking - nocomm) is a perfect overlap of the blocking schedule's
communication time (blocking - nocomm) with the computation; the communication share (blocking - nocomm) /
blocking; per rank the median epoch and blocked (waiting) times and rank 0's blocked time pipelined / blocking;
and one more, recorded and unmeasured, epoch of each schedule as a per-rank timeline
(:mod:`g3mpi.comm.timeline`). The input cache is off (``--no-input-cache``), so every layer's exchange runs in
every epoch. Messages travel in pieces of about ``piece_bytes`` (``g3mpi.sched.schedule``), recorded with the
result.
"""
from __future__ import annotations

from pathlib import Path

from g3mpi.sched import BLOCKING, MODES, NOCOMM, PIPELINED
from g3mpi.sched.schedule import PIECE_BYTES

from .common import Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, variant_summary, \
    worker_model_args

SCHEDULES = MODES


def ratios(t: dict, pipelined: dict, blocking: dict) -> dict:
    """The suite's ratios from the median epoch times ``t`` per schedule and the pipelined and blocking
    summaries (``variant_summary``)."""
    comm = t[BLOCKING] - t[NOCOMM]
    ideal = max(t[NOCOMM], comm)
    b0 = blocking["rank_blocked_s"][0] if blocking["rank_blocked_s"] else None
    p0 = pipelined["rank_blocked_s"][0] if pipelined["rank_blocked_s"] else None
    return dict(pipelined_vs_blocking=ratio(t[PIPELINED], t[BLOCKING]),
                pipelined_vs_nocomm=ratio(t[PIPELINED], t[NOCOMM]), ideal_s=ideal,
                pipelined_vs_ideal=ratio(t[PIPELINED], ideal), comm_share_of_blocking=ratio(comm, t[BLOCKING]),
                rank0_blocked_pipelined_vs_blocking=ratio(p0, b0))


def run(sz: Sizes, work: Path, ranks=(4,), sim_nets=("10Gbit,20us",), models=("gcn", "gat"),
        balance: str = "edges", bind_to: str = "none") -> dict:
    """``balance``: METIS vertex weights of the partition (default edges: an R-MAT graph split by node counts
    leaves one rank with most of the edges, and the others then wait for it whatever the schedule)."""
    graph = prepare_graph(sz, work)
    res = dict(graph=graph.name, balance=balance, bind_to=bind_to, piece_bytes=PIECE_BYTES, configs=[])
    for P in ranks:
        parts = prepare_parts(graph, P, work, balance=balance)
        for net in sim_nets:
            conf = dict(ranks=P, sim_net=net, bind_to=bind_to, models={})
            res["configs"].append(conf)
            for model in models:
                progress(f"schedules: {model} on {P} ranks (bind-to {bind_to}), sim-net {net}")
                slug = net.replace(",", "-").replace("/", "")
                out = run_worker(P, ["--parts", parts, "--designs", "g3", "--schedules", ",".join(SCHEDULES),
                                     "--no-input-cache", "--timeline", "--sim-net", net, "--epochs", sz.epochs,
                                     *worker_model_args(model, sz)],
                                 work / f"schedules-{model}-{P}-{slug}.json", threads=sz.threads, bind_to=bind_to)
                d = {v["schedule"]: variant_summary(v) for v in out["variants"].values()}
                t = {s: d[s]["epoch_time_median_s"] for s in SCHEDULES}
                conf["models"][model] = dict(schedules=d, epoch_time_median_s=t,
                                             **ratios(t, d[PIPELINED], d[BLOCKING]),
                                             timelines={v["schedule"]: v["timeline"] for v in out["variants"].values()
                                                        if v.get("timeline")})
                m = conf["models"][model]
                progress(f"schedules: {model}: pipelined {t[PIPELINED]:.3f}s, blocking {t[BLOCKING]:.3f}s, "
                         f"nocomm {t[NOCOMM]:.3f}s; pipelined/blocking {m['pipelined_vs_blocking']:.3f}, "
                         f"pipelined/ideal {m['pipelined_vs_ideal']:.3f}")
    return res
