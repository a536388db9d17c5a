"""Suite ``memory``: peak RSS per rank against the theoretical size of the rank's data.

Each rank (``g3mpi.bench.worker --memory``) records its peak RSS (``getrusage``) before loading anything (the
interpreter, torch, numpy, h5py and MPI: the baseline) and after training; the theoretical size is the sum of
what the rank must hold (see ``worker.theoretical_bytes``): its part's arrays, the aggregation CSR and its
transpose, the exchange buffers, the activations autograd keeps for backward (measured with saved-tensor
hooks) and parameters with gradients and Adam moments. Ratio = (peak RSS - baseline) / theoretical; the raw
peak is reported too, and (peak - baseline) per owned row. Training has dropout 0.5 (its masks are part of what
autograd keeps). Each model is measured three times: with the runtime's defaults, with ``--remat cheap`` (the
row-wise blocks between aggregations recomputed in backward: docs/MEMORY.md) and with ``--release-memory`` (glibc
keeps no freed block of 128 KiB or more: lower peak, but every such allocation page-faults afresh).
"""
from __future__ import annotations

from pathlib import Path

from .common import Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, worker_model_args


#: dropout of the measured training (on, as the memory model assumes)
DROPOUT = 0.5
#: the measured settings: their name and the worker's extra options
MODES = {"default": [], "remat": ["--remat", "cheap"], "release-memory": ["--release-memory"]}


def _measure(sz: Sizes, work: Path, parts, ranks: int, model: str, mode: str = "default") -> dict:
    out = run_worker(ranks, ["--parts", parts, "--memory", "--epochs", sz.epochs, *worker_model_args(model, sz),
                             "--dropout", DROPOUT, *MODES[mode]],
                     work / f"memory-{model}-{ranks}-{mode}.json", threads=sz.threads)
    rk = []
    for r in out["ranks"]:
        used = r["rss_peak"] - r["rss_base"]
        rk.append(dict(rank=r["rank"], rss_peak=r["rss_peak"], rss_base=r["rss_base"], rss_data=used,
                       rss_after_setup=r["rss_after_setup"], theoretical=r["theoretical"], owned=r["owned"],
                       bytes_per_owned_row=used / max(1, r["owned"]),
                       ratio=ratio(used, r["theoretical"]["total"]),
                       raw_ratio=ratio(r["rss_peak"], r["theoretical"]["total"])))
    progress(f"memory: {model} ({mode}): (peak - baseline) / theoretical = "
             + ", ".join(f"rank {x['rank']}: {x['rss_data'] / 2**20:.0f}/{x['theoretical']['total'] / 2**20:.0f}"
                         f" MiB = {x['ratio']:.2f}x" for x in rk))
    return dict(ranks=rk, ratio_max=max(x["ratio"] for x in rk),
                bytes_per_owned_row_max=max(x["bytes_per_owned_row"] for x in rk))


def run(sz: Sizes, work: Path, ranks: int = 2, models=("gcn", "sage")) -> dict:
    """Per model, the default runtime, ``--remat cheap`` and ``--release-memory`` (freed memory returned to the
    system at once); ``remat_vs_default``: the largest rank's bytes per owned row, remat over default."""
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work)
    res = dict(graph=graph.name, ranks=ranks, models={})
    for model in models:
        progress(f"memory: {model} on {ranks} ranks")
        d = _measure(sz, work, parts, ranks, model)
        d["remat"] = _measure(sz, work, parts, ranks, model, "remat")
        d["release_memory"] = _measure(sz, work, parts, ranks, model, "release-memory")
        d["remat_vs_default"] = ratio(d["remat"]["bytes_per_owned_row_max"], d["bytes_per_owned_row_max"])
        progress(f"memory: {model}: --remat cheap / default bytes per owned row = {d['remat_vs_default']:.3f}")
        res["models"][model] = d
    return res
