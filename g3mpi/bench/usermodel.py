"""Suite ``user-model``: a GCN written by a user from the public primitives of ``g3mpi.nn``
(docs/examples/user_gcn.py, as ``g3-train --model-file`` loads it) against the built-in GCN.

Both train in the same P processes, epoch by epoch in turn (``Trainer.train_step``: forward, backward, gradient
allreduce, Adam step), pipelined, from the same seed (the user GCN has the built-in one's parameters, so their
initial logits agree: ``initial_logits_rel_diff``). The input cache is off (``--no-input-cache``: a built-in
model's first-layer cache for a constant input), so every layer of both exchanges every epoch. Reported: median
epoch times, user / built-in, and per rank the compute and blocked times.
"""
from __future__ import annotations

from pathlib import Path

from g3mpi.sched import PIPELINED

from .common import USER_REFERENCE, Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, \
    variant_summary, worker_model_args

#: the user model measured unless another is given (the repository's example)
USER_GCN = Path(__file__).resolve().parents[2] / "docs" / "examples" / "user_gcn.py"


def run(sz: Sizes, work: Path, ranks: int = 2, sim_net: str = "", model_file: str | None = None) -> dict:
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work)
    spec = model_file or f"{USER_GCN}:build"
    progress(f"user-model: {spec} vs the built-in gcn on {ranks} ranks" + (f", sim-net {sim_net}" if sim_net else ""))
    out = run_worker(ranks, ["--parts", parts, "--designs", "g3,user", "--model-file", spec, "--schedules",
                             PIPELINED, "--no-input-cache", "--check", "--epochs", sz.epochs,
                             *(["--sim-net", sim_net] if sim_net else []), *worker_model_args(USER_REFERENCE, sz)],
                     work / f"user-model-{ranks}.json", threads=sz.threads)
    d = {v["design"]: variant_summary(v) for v in out["variants"].values()}
    t = dict(builtin=d["g3"]["epoch_time_median_s"], user=d["user"]["epoch_time_median_s"])
    res = dict(graph=graph.name, ranks=ranks, sim_net=sim_net or None, model_file=spec,
               designs=dict(builtin=d["g3"], user=d["user"]), epoch_time_median_s=t,
               user_vs_builtin=ratio(t["user"], t["builtin"]),
               initial_logits_rel_diff=out["check_rel_diff"].get("user"))
    progress(f"user-model: built-in {t['builtin']:.3f}s, user {t['user']:.3f}s per epoch; user/built-in "
             f"{res['user_vs_builtin']:.3f}")
    return res
