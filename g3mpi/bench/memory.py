"""Suite ``memory``: peak RSS per rank against the theoretical size of the rank's data, and what sizes that data,
measured against the memory model.

Each rank (``g3mpi.bench.worker --memory``) records its peak RSS (``getrusage``) before loading anything (the
interpreter, torch, numpy, h5py and MPI: the baseline) and after training; the theoretical size is the sum of
what the rank must hold (see ``worker.held_items``): its part's arrays, the aggregation CSR and its
transpose, the exchange buffers, the activations autograd keeps for backward (measured with saved-tensor
hooks) and parameters with gradients and Adam moments. Ratio = (peak RSS - baseline) / theoretical; the raw
peak is reported too, and (peak - baseline) per owned row. Training has dropout 0.5 (its masks are part of what
autograd keeps). Each model is measured three times: with ``--remat none`` (autograd keeps what each op saves),
with ``--remat cheap`` (g3-train's default: the row-wise blocks between aggregations recomputed in backward:
docs/MEMORY.md) and with ``--remat none --release-memory`` (glibc keeps no freed block of 128 KiB or more: lower
peak, but every such allocation page-faults afresh).

Breakdown (per rank, ``breakdown``): every byte of the theoretical size attributed to what sizes it, the rank's
owned rows, halo rows, send rows, local edges, or nothing of the graph (``const``), by the length of its array
(:mod:`.attribution`; ``other`` where none matches), against the same split of the memory model
(``g3mpi.train.memory.rank_memory_split``), as bytes per owned row, per halo row, per send row and per local edge
and their ratio; ``unattributed`` = peak - baseline - theoretical (the allocator's free blocks, temporaries).
Model ``user`` is a model a user writes with the public layer API (``USER_MODEL``, loaded as ``g3-train
--model-file`` loads it): the memory model says nothing of its activations, so those are measured only ("not
modelled"); the other terms are modelled from its part, the matrices and exchanges its layers built and its
parameters. R-GCN (``rgcn``) runs on a typed graph (``--graph rmat --relations R``): its typed block, R x out
wide messages and relation weights are the model's ``relations`` terms. With ``--node-embedding D`` every model
learns a D-wide node embedding table beside the features (g3-train's ``--node-embedding``): the table, its
gradient and Adam's moments are params bytes per owned row (measured as held, modelled with the optimiser step's
temporaries), its halo rows an exchange.
"""
from __future__ import annotations

from pathlib import Path

from g3mpi.train.memory import UNITS, by_category, per_unit

from .attribution import MEASURED, TERMS
from .common import USER, USER_REFERENCE, Sizes, prepare_graph, prepare_parts, progress, ratio, run_worker, \
    worker_model_args
from .usermodel import USER_GCN

#: dropout of the measured training (on, as the memory model assumes)
DROPOUT = 0.5
#: the measured settings: their name and the worker's extra options
#: (explicit, whatever the worker's and g3-train's defaults: g3-train's is cheap, the worker's none)
MODES = {"none": ["--remat", "none"], "remat": ["--remat", "cheap"],
         "release-memory": ["--remat", "none", "--release-memory"]}
#: model ``user`` (USER): a GCN written from the public primitives of ``g3mpi.nn`` (docs/examples/user_gcn.py)
USER_MODEL = f"{USER_GCN}:build"
#: the category whose bytes each unit of ``g3mpi.train.memory.UNITS`` divides
UNIT_CATEGORY = {"owned_row": "owned", "halo_row": "halo", "send_row": "send", "edge": "edge"}


def _model_args(model: str, sz: Sizes, node_embedding: int = 0) -> list:
    emb = ["--node-embedding", node_embedding] if node_embedding else []
    if model == USER:     # (the user GCN takes the run's hidden width and layers, as g3-train passes them)
        return ["--designs", "user", "--model-file", USER_MODEL, *worker_model_args(USER_REFERENCE, sz), *emb]
    return [*worker_model_args(model, sz), *emb]


def _per_unit(cats: dict | None, counts: dict) -> dict:
    return dict.fromkeys(UNIT_CATEGORY) if cats is None else per_unit(
        cats, owned=counts["owned"], halo=counts["halo"], send=counts["send"], edges=counts["edges"])


def _side_by_side(measured: dict, modelled: dict | None, counts: dict) -> dict:
    """{unit: {measured, modelled, ratio}}: bytes per owned row, halo row, send row and edge of two
    {category: bytes} (``modelled`` None: not modelled)."""
    m, mod = _per_unit(measured, counts), _per_unit(modelled, counts)
    return {u: dict(measured=m[u], modelled=mod[u], ratio=ratio(m[u], mod[u])) for u, _ in UNITS}


def compare(b: dict, rss_data: int) -> dict:
    """One rank's breakdown (the worker's ``breakdown``) as the report gives it: bytes by category measured
    (``measured``, with ``other``) and modelled (``modelled``; None where a term is not modelled), and by term
    (``measured_terms``, ``modelled_terms``: {term: {category: bytes}}, a term not modelled None); per unit side by
    side over every term (``per_unit``; over the modelled terms only in ``per_unit_modelled_terms`` where one is
    not) and per term (``terms``); ``unattributed`` = ``rss_data`` - the attributed bytes."""
    counts, meas, mod = b["counts"], b["measured"], b["modelled"]
    not_modelled = [t for t in TERMS if mod.get(t) is None]
    modelled = [t for t in TERMS if t not in not_modelled]
    measured = {c: sum(meas[t][c] for t in TERMS) for c in MEASURED}
    mod_all = None if not_modelled else by_category({t: mod[t] for t in TERMS})
    out = dict(counts=counts, measured=measured, modelled=mod_all, not_modelled=not_modelled,
               attributed=b["attributed"], ambiguous=b["ambiguous"], unattributed=rss_data - b["attributed"],
               other_items=b["other_items"], measured_terms=meas, modelled_terms=mod,
               per_unit=_side_by_side(measured, mod_all, counts))
    if not_modelled:
        out["per_unit_modelled_terms"] = _side_by_side(by_category({t: meas[t] for t in modelled}),
                                                       by_category({t: mod[t] for t in modelled}), counts)
    out["terms"] = {t: _side_by_side(meas[t], mod[t], counts) for t in TERMS}
    return out


def _fmt(x, unit="") -> str:
    return "-" if x is None else (f"{x:.0f}{unit}" if x >= 100 else f"{x:.1f}{unit}")


def breakdown_line(model: str, mode: str, rank: int, c: dict) -> str:
    """The progress line of one rank's :func:`compare`: measured / modelled bytes per unit = their ratio."""
    names = dict(owned_row="owned row", halo_row="halo row", send_row="send row", edge="edge")

    def units(pu):
        return ", ".join(f"{names[u]} {_fmt(v['measured'])}/{_fmt(v['modelled'])} B"
                         + (f" = {v['ratio']:.2f}x" if v["ratio"] is not None else "") for u, v in pu.items())
    if c["not_modelled"]:
        meas = ", ".join(f"{names[u]} {_fmt(v['measured'])} B" for u, v in c["per_unit"].items())
        body = (f"measured per {meas} ({', '.join(c['not_modelled'])} not modelled); the other terms, measured / "
                f"modelled per {units(c['per_unit_modelled_terms'])}")
    else:
        body = f"measured / modelled per {units(c['per_unit'])}"
    return (f"memory: {model} ({mode}): rank {rank}: {body}; const {c['measured']['const'] / 2**10:.0f} KiB, other "
            f"{c['measured']['other'] / 2**10:.0f} KiB, unattributed {c['unattributed'] / 2**20:.1f} MiB")


def _measure(sz: Sizes, work: Path, parts, ranks: int, model: str, mode: str = "none",
             node_embedding: int = 0) -> dict:
    emb = f"-emb{node_embedding}" if node_embedding else ""
    out = run_worker(ranks, ["--parts", parts, "--memory", "--epochs", sz.epochs,
                             *_model_args(model, sz, node_embedding), "--dropout", DROPOUT, *MODES[mode]],
                     work / f"memory-{model}{emb}-{ranks}-{mode}.json", threads=sz.threads)
    model = _label(model, node_embedding)
    rk = []
    for r in out["ranks"]:
        used = r["rss_peak"] - r["rss_base"]
        rk.append(dict(rank=r["rank"], rss_peak=r["rss_peak"], rss_base=r["rss_base"], rss_data=used,
                       rss_after_setup=r["rss_after_setup"], theoretical=r["theoretical"], owned=r["owned"],
                       bytes_per_owned_row=used / max(1, r["owned"]),
                       ratio=ratio(used, r["theoretical"]["total"]),
                       raw_ratio=ratio(r["rss_peak"], r["theoretical"]["total"]),
                       breakdown=compare(r["breakdown"], used)))
    progress(f"memory: {model} ({mode}): (peak - baseline) / theoretical = "
             + ", ".join(f"rank {x['rank']}: {x['rss_data'] / 2**20:.0f}/{x['theoretical']['total'] / 2**20:.0f}"
                         f" MiB = {x['ratio']:.2f}x" for x in rk))
    for x in rk:
        progress(breakdown_line(model, mode, x["rank"], x["breakdown"]))
    return dict(ranks=rk, ratio_max=max(x["ratio"] for x in rk),
                bytes_per_owned_row_max=max(x["bytes_per_owned_row"] for x in rk))


def _label(model: str, node_embedding: int) -> str:
    return f"{model} + node embedding {node_embedding}" if node_embedding else model


def run(sz: Sizes, work: Path, ranks: int = 2, models=("gcn", "sage"), node_embedding: int = 0) -> dict:
    """Per model (``user``: :data:`USER_MODEL`), ``--remat none`` (autograd keeps what it saves), ``--remat cheap``
    (g3-train's default) and ``--remat none --release-memory`` (freed memory returned to the system at once);
    ``remat_vs_none``: the largest rank's bytes per owned row, cheap over none. ``node_embedding`` D: every model
    on a D-wide learned node embedding table beside the features."""
    graph = prepare_graph(sz, work)
    parts = prepare_parts(graph, ranks, work)
    res = dict(graph=graph.name, ranks=ranks, relations=sz.relations, node_embedding=node_embedding, models={},
               user_model=USER_MODEL if USER in models else None)
    for model in models:
        label = _label(model, node_embedding)
        progress(f"memory: {label} on {ranks} ranks" + (f" ({USER_MODEL})" if model == USER else ""))
        d = _measure(sz, work, parts, ranks, model, node_embedding=node_embedding)
        d["remat"] = _measure(sz, work, parts, ranks, model, "remat", node_embedding)
        d["release_memory"] = _measure(sz, work, parts, ranks, model, "release-memory", node_embedding)
        d["remat_vs_none"] = ratio(d["remat"]["bytes_per_owned_row_max"], d["bytes_per_owned_row_max"])
        progress(f"memory: {label}: --remat cheap / none bytes per owned row = {d['remat_vs_none']:.3f}")
        res["models"][model] = d
    return res
