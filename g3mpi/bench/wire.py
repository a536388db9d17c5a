"""Suite ``bytes``: bytes on the wire per epoch against the partition's lower bound and two naive designs.

Lower bound of a partition (what any exact design that only moves halo rows must send per epoch): for every
layer, every halo row crosses once at the narrower of the layer's input and output widths, min(in, out) x 4
bytes (a layer can always transform before or after aggregating); forward for every layer, and backward too
for every layer whose aggregated tensor depends on parameters (all but a first layer that aggregates its raw
input, in <= out, whose input needs no gradient). Per rank, the bound counts its send rows forward and its halo
rows backward.

Measured on P ranks in the same processes, epoch by epoch (``g3mpi.bench.worker``): g3mpi (the runtime's byte
counters), ``g3-original`` (the same runtime exchanging at every layer's input width) and ``replicate-all``
(allgather of the full features every layer; see ``g3mpi.bench.naive``). All three compute the same logits
(reported as ``check_rel_diff``).

The runtime's input cache is off here (``--no-input-cache``): with it, and no input dropout, the first layer's
forward exchange runs once per run instead of once per epoch, and steady-state epochs send less than this
per-epoch bound.
"""
from __future__ import annotations

import json
from pathlib import Path

from .common import Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, variant_summary, \
    worker_model_args

DESIGNS = ("g3", "g3-original", "replicate-all")


def lower_bound(meta: dict, dims) -> dict:
    """Bytes per epoch (total and per rank sent) that the partition makes unavoidable for a GCN/SAGE stack."""
    total, per_rank = 0, [0] * meta["num_parts"]
    layers = []
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        w = min(a, b)
        bwd = not (i == 0 and a <= b)
        fwd_b = sum(p["halo"] for p in meta["parts"]) * w * 4
        bwd_b = fwd_b if bwd else 0
        layers.append(dict(layer=i, width=w, forward=fwd_b, backward=bwd_b))
        total += fwd_b + bwd_b
        for r, p in enumerate(meta["parts"]):
            per_rank[r] += p["send"] * w * 4 + (p["halo"] * w * 4 if bwd else 0)
    return dict(total=total, per_rank=per_rank, layers=layers)


def run(sz: Sizes, work: Path, ranks: int = 4, models=("gcn", "sage")) -> dict:
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work)
    meta = json.loads((parts / "meta.json").read_text())
    lb = lower_bound(meta, sz.dims)
    res = dict(graph=str(graph.name), ranks=ranks, partition=dict(method=meta["method"], **meta["quality"]),
               lower_bound=lb, models={})
    for model in models:
        progress(f"bytes: {model} on {ranks} ranks ({', '.join(DESIGNS)})")
        out = run_worker(ranks, ["--parts", parts, "--designs", ",".join(DESIGNS), "--check", "--no-input-cache",
                                 "--epochs", sz.epochs, *worker_model_args(model, sz)],
                         work / f"bytes-{model}-{ranks}.json", threads=sz.threads)
        d = {name: variant_summary(v) for name, v in out["variants"].items()}
        g3 = d["g3"]["bytes_sent_per_epoch"]
        m = dict(designs=d, check_rel_diff=out["check_rel_diff"], g3_bytes_per_epoch=g3,
                 ratio_vs_lower_bound=ratio(g3, lb["total"]),
                 rank_ratio_vs_lower_bound=[ratio(x, y) for x, y in zip(d["g3"]["rank_bytes_sent"], lb["per_rank"])])
        for nd in DESIGNS[1:]:
            b = d[nd]["bytes_sent_per_epoch"]
            m[f"{nd}_bytes_per_epoch"] = b
            m[f"saving_vs_{nd}"] = 1 - g3 / b if b else None
            m[f"factor_vs_{nd}"] = ratio(b, g3)
        res["models"][model] = m
        progress(f"bytes: {model}: g3mpi {g3 / 1e6:.2f} MB/epoch = {m['ratio_vs_lower_bound']:.4f}x lower bound; "
                 f"g3-original {m['g3-original_bytes_per_epoch'] / 1e6:.2f} MB, "
                 f"replicate-all {m['replicate-all_bytes_per_epoch'] / 1e6:.2f} MB")
    return res
