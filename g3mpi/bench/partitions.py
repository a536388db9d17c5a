"""Suite ``partitions``: the measured epoch time on the g3 and default partitions against each METIS partition.

The same graph is split into P parts (default 4) by node-, edge- and node+edge-balanced METIS, by the g3
partitioner (``g3-partition --method g3``, and with ``--start recursive``, the edge-cut start) and by
g3-partition's default (``--method auto``: KaMinPar refined by g3 where the graph fits); cached in the work
directory. P ranks train the same model on each partition under ``--sim-net`` (default 10Gbit,20us) with
the default (pipelined) schedule; the partitions take turns launch by launch (A, B, C, D, A, B, ...) for
``--repeats`` rounds, so all of them see the same machine load. Reported per partition: the median of the
per-launch median epoch times, per-rank compute / blocked / idle time and the partition's quality figures (from
its meta.json); and g3's (g3-cut's, the default's) epoch time as a ratio of each METIS partition's.
"""
from __future__ import annotations

import json
from pathlib import Path

from .common import Sizes, median, prepare_graph, prepare_parts, progress, ratio, run_worker, variant_summary, \
    worker_model_args

#: (label, g3-partition --method, --balance, --start)
PARTITIONS = (("metis-nodes", "metis", "nodes", "auto"), ("metis-edges", "metis", "edges", "auto"),
              ("metis-both", "metis", "both", "auto"), ("g3", "g3", "nodes", "auto"),
              ("g3-cut", "g3", "nodes", "recursive"), ("auto", "auto", "nodes", "auto"))
QUALITY = ("edge_cut", "replication_factor", "node_imbalance", "compute_imbalance", "comm_imbalance", "max_comm_rows")


def run(sz: Sizes, work: Path, ranks: int = 4, sim_net: str = "10Gbit,20us", model: str = "gcn",
        repeats: int = 2) -> dict:
    graph = prepare_graph(sz, work)
    parts = {}
    for label, method, balance, start in PARTITIONS:
        progress(f"partitions: {label} into {ranks} parts")
        parts[label] = prepare_parts(graph, ranks, work, method=method, balance=balance, start=start)
    runs = {label: [] for label in parts}
    margs = worker_model_args(model, sz)
    for rep in range(repeats):
        for label, p in parts.items():
            progress(f"partitions: {model} on the {label} partition, {ranks} ranks, sim-net {sim_net}, "
                     f"launch {rep + 1}/{repeats}")
            out = run_worker(ranks, ["--parts", p, "--sim-net", sim_net, "--epochs", sz.epochs, *margs],
                             work / f"partitions-{label}-{ranks}.json", threads=sz.threads)
            runs[label].append(variant_summary(out["variants"]["g3"]))
    res = dict(graph=graph.name, ranks=ranks, sim_net=sim_net, model=model, repeats=repeats, partitions={})
    for label, p in parts.items():
        meta = json.loads((Path(p) / "meta.json").read_text())
        q = meta.get("quality", {})
        last = runs[label][-1]
        res["partitions"][label] = dict(
            parts=str(p), start=meta.get("start"), launches=runs[label],
            epoch_time_median_s=median([r["epoch_time_median_s"] for r in runs[label]]),
            rank_compute_s=last["rank_compute_s"], rank_blocked_s=last["rank_blocked_s"],
            rank_idle_s=last["rank_idle_s"], quality={k: q.get(k) for k in QUALITY})
    t = {k: v["epoch_time_median_s"] for k, v in res["partitions"].items()}
    res["g3_vs"] = {k: ratio(t["g3"], t[k]) for k in t if not k.startswith("g3") and k != "auto"}
    res["auto_vs"] = {k: ratio(t["auto"], t[k]) for k in t if k != "auto"}
    res["g3_cut_vs"] = {k: ratio(t["g3-cut"], t[k]) for k in t if k != "g3-cut"}
    progress("partitions: " + ", ".join(f"{k} {v:.3f}s" for k, v in t.items()) + "; g3 / " +
             ", ".join(f"{k} {v:.3f}" for k, v in res["g3_vs"].items()) + "; g3-cut / " +
             ", ".join(f"{k} {v:.3f}" for k, v in res["g3_cut_vs"].items()) + "; auto / " +
             ", ".join(f"{k} {v:.3f}" for k, v in res["auto_vs"].items()))
    return res
