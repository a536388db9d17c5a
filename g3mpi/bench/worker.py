"""The MPI side of the multi-rank suites: one rank per part, training epochs, per-rank figures as JSON.

    mpiexec -n P python -m mpi4py -m g3mpi.bench.worker --parts DIR --model gcn --hidden 256 --layers 2 \
        [--designs g3,g3-original,replicate-all] [--schedules pipelined,blocking,nocomm] [--sim-net 10Gbit,20us] \
        [--epochs 5] [--threads 1] [--memory] [--timeline] --json OUT.json

Every (design, schedule) pair is a "variant". All variants live in the same processes and take turns epoch by
epoch (variant A epoch 1, variant B epoch 1, ..., A epoch 2, ...), so they see the same machine load. Epoch 0 is
a warm-up and is not reported. g3mpi variants are the real trainer (``g3mpi.train.Trainer.train_step``:
forward, backward, gradient allreduce, Adam step) and its byte counters; ``g3-original`` and ``replicate-all``
are the naive designs of :mod:`g3mpi.bench.naive`.

Rank 0 writes the JSON: per variant and epoch the slowest rank's epoch time and every rank's compute, blocked
and idle (gradient allreduce: waiting for slower ranks) times and bytes; per rank the partition figures, the
peak RSS, the RSS before any data was loaded, and (``--memory``) the theoretical size of the rank's data and its
breakdown by what sizes it, measured and modelled (:func:`memory_account`). With
``--timeline`` every g3mpi variant runs one more epoch after the measured ones, recorded
(:mod:`g3mpi.comm.timeline`) and not measured, whose per-rank timeline goes into the variant's ``timeline``.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.mpi.abort import abort_job
from g3mpi.nn import specs
from g3mpi.options import Parser, from_options
from g3mpi.sched import BLOCKING, PIPELINED
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train import TrainConfig, Trainer
from g3mpi.train.startup import IDS_NOT_ONCE, read_rank_part, start_up_sums
from g3mpi.train.sysmem import current_rss_bytes, peak_rss_bytes, return_freed_memory

from .attribution import TERMS, Block, Held, RankCounts, attribute
from .results import gather_json, write_json

DESIGNS = ("g3", "g3-original", "replicate-all", "user")


def warm_libraries(comm) -> None:
    """Touch every library the run uses on tiny data (GEMM, sparse product, autograd, Adam, h5py, MPI point to
    point and collectives), so that the RSS measured afterwards (the baseline) holds the per-process fixed cost
    (interpreter, libraries, thread pools, MPI shared-memory channels) and none of the rank's data."""
    import io

    import h5py
    import scipy.sparse as sp

    from g3mpi.ops.blocks import spmm, to_torch_csr
    A = to_torch_csr(sp.random(64, 64, density=0.1, format="csr", dtype=np.float32, random_state=0))
    x = torch.randn(64, 32)
    w = torch.randn(32, 16, requires_grad=True)
    y = spmm(A, x) @ w
    torch.nn.functional.cross_entropy(y, torch.zeros(64, dtype=torch.long)).backward()
    torch.optim.Adam([w]).step()
    with h5py.File(io.BytesIO(), "w") as f:   # libhdf5's own allocations, as a part file's read makes them
        f["x"] = x.numpy()
        f["x"][:8]
    buf = np.ones(1024)
    comm.Allreduce(MPI.IN_PLACE, buf)
    send = np.ones((comm.size, 256))
    recv = np.empty_like(send)
    comm.Alltoall(send, recv)
    comm.Barrier()


#: the arrays of a ``g3mpi.ops.heads.HeadPattern`` (a permutation is None where it is the identity)
HEAD_PATTERN = ("crow", "col", "perm", "crow_t", "col_t", "perm_t")


def _rows(t: torch.Tensor) -> int:
    """The outer dimension of a tensor's storage: its elements over the largest stride (the rows of the tensor it
    is a view of, transposed or not); 0 for a scalar."""
    if t.dim() == 0:
        return 0
    stride = max(t.stride())
    return t.untyped_storage().nbytes() // (t.element_size() * max(1, stride))


def _ptr(a) -> int:
    """The address of a tensor's storage or an array's data."""
    if isinstance(a, torch.Tensor):
        return a.untyped_storage().data_ptr()
    return np.asarray(a).__array_interface__["data"][0]


def loaded_part(part) -> dict:
    """The part's arrays as loaded, as :class:`~.attribution.Held` items of ``part`` (``items``), their addresses
    (``ptrs``) and the part's cut edges (``cut_edges``: in-edges from halo rows), taken before the first training
    forward drops its local CSR (that forward's peak still holds it)."""
    from g3mpi.format.partition import ARRAYS
    items, ptrs = [], set()
    for k in ARRAYS:
        a = np.asarray(getattr(part, k))
        if a.dtype != object:   # (an array not held: None)
            items.append(Held("part", k, int(a.shape[0]) if a.ndim else 0, int(a.nbytes)))
            ptrs.add(_ptr(a))
    return dict(items=items, ptrs=ptrs,
                cut_edges=int(np.count_nonzero(np.asarray(part.indices) >= part.num_owned)))


def rank_counts(part, trainer, cut_edges: int) -> RankCounts:
    """What can size this rank's arrays (:class:`~.attribution.RankCounts`)."""
    n, e = part.num_owned, part.num_local_edges
    blocks = []
    for bm in trainer.graph.matrices():
        sz = bm.sizes()     # (the self loops: the local block's entries that are not local edges)
        blocks.append(Block(sz["local_nnz"], max(0, sz["local_nnz"] - (e - cut_edges)), tuple(sz["neighbour_nnz"])))
    return RankCounts(owned=n, halo=part.num_halo, send=int(len(part.send_rows)), edges=e, cut_edges=cut_edges,
                      boundary=int(part.num_boundary), train=int(np.count_nonzero(part.train_mask)),
                      blocks=tuple(blocks), heads=tuple(sorted({p.H for p in trainer.graph.built_head_patterns()})))


def held_items(trainer, loaded: dict, saved: dict) -> list:
    """Every array this rank holds, as :class:`~.attribution.Held` items by term:
    part: every array of the rank's part as loaded (``loaded``: :func:`loaded_part`; the input features widened to
      float32 instead of their stored copy where they were stored narrower); matrices: the aggregation CSR and its
      precomputed transpose per edge weighting, at the sizes the runtime builds them (``BlockMatrix.held_arrays``),
      and GAT's head-expanded patterns; exchange: halo and send buffers of every exchange, and its halo-gradient and receive-gradient
      buffers where a gradient flows back through it (not the exchange of the raw input features), at the planned
      widths, and the input's halo rows a model keeps (the input cache); activations: the storages autograd keeps
      for backward in one training forward (``saved``: :func:`saved_activations`, those of the other terms
      left out); params: parameters, gradients and Adam's two moments."""
    part, x = trainer.part, trainer.x
    items = list(loaded["items"])
    if part.features is None:   # stored narrower: widened to float32 on loading, the stored copy freed
        items = [it for it in items if it.what != "features"]
        items.append(Held("part", "features (float32)", int(x.shape[0]), x.numel() * x.element_size()))
    for bm in trainer.graph.matrices():
        items += [Held("matrices", what, rows, b) for what, rows, b in bm.held_arrays()]
    for pat in trainer.graph.built_head_patterns():
        for k in HEAD_PATTERN:
            t = getattr(pat, k)
            if t is not None:   # (the row pointers: rows x heads, one more entry)
                items.append(Held("matrices", f"head pattern {k}", len(t) - k.startswith("crow"),
                                  t.numel() * t.element_size()))
    for ex in trainer.ctx.exchanges:
        for d, (halo, send) in zip(("forward", "backward"), ex.buffers()):
            # one send buffer per send neighbour: together one per send row
            items += [Held("exchange", f"{ex.name} {d} halo", int(halo.shape[0]), int(halo.nbytes)),
                      Held("exchange", f"{ex.name} {d} send", sum(int(b.shape[0]) for b in send),
                           sum(int(b.nbytes) for b in send))]
    kept = getattr(trainer.model, "kept_input_halo", None)
    if kept is not None:
        items.append(Held("exchange", "kept input halo", int(kept.shape[0]), int(kept.nbytes)))
    items += [Held("activations", what, rows, b) for what, rows, b in saved.values()]
    # (wide rows kept from epoch to epoch for reuse: R-GCN's messages and their gradients)
    items += [Held("activations", "reused wide rows", rows, b) for rows, b in trainer.graph.scratch.held()]
    # (a node embedding table: this rank's owned rows, with their gradients and Adam moments)
    sharded = set(trainer.sharded.values())
    items += [Held("params", f"{k} (with gradients, Adam moments)", int(p.shape[0]), 4 * p.numel() * p.element_size())
              for i, (k, p) in enumerate(trainer.named_params) if i in sharded]
    items.append(Held("params", "parameters, gradients, Adam moments", 0,
                      4 * sum(p.numel() * p.element_size() for i, p in enumerate(trainer.params) if i not in sharded)))
    return items


def _held_ptrs(trainer) -> set:
    """Addresses of what :func:`held_items` counts outside the activations, but the part's arrays: the input, the
    head patterns, the exchange buffers, the kept input halo."""
    ptrs = {_ptr(trainer.x)}
    ptrs.update(_ptr(getattr(p, k)) for p in trainer.graph.built_head_patterns() for k in HEAD_PATTERN
                if getattr(p, k) is not None)
    ptrs.update(_ptr(b) for ex in trainer.ctx.exchanges for halo, send in ex.buffers() for b in (halo, *send))
    kept = getattr(trainer.model, "kept_input_halo", None)
    if kept is not None:
        ptrs.add(_ptr(kept))
    return ptrs


def theoretical_bytes(items: list) -> dict:
    """What this rank must hold, by term (bytes, :func:`held_items`), and their ``total``."""
    out = {t: int(sum(it.nbytes for it in items if it.term == t)) for t in TERMS}
    out["total"] = int(sum(out.values()))
    return out


def modelled_split(trainer, counts, cfg) -> dict:
    """The memory model's split of this rank's terms ({term: {category: bytes}}, ``g3mpi.train.memory``).
    A built-in model: :func:`~g3mpi.train.memory.rank_memory_split`. A user's model: only what does not depend on
    its layers' insides: the part, the aggregation matrices its layers built (their self loops and weights), its
    exchanges at their planned widths and directions, its parameters; its activations are None (not modelled)."""
    from g3mpi.format.features import stored_dtype
    from g3mpi.train.memory import exchange_split, matrices_split, part_split, rank_memory_split, split_bytes
    part = trainer.part
    c = counts
    mats = trainer.graph.matrices()
    symmetric = bool(mats) and all(bm.symmetric for bm in mats)
    fb = np.dtype(stored_dtype(part.feature_dtype)).itemsize
    if not trainer.cfg.model_file and specs.spec(cfg.model).aggregation:   # (the models the memory model has)
        return rank_memory_split(cfg.model, owned=c.owned, halo=c.halo, send=c.send, edges=c.edges,
                                 feature_dim=part.feature_dim, hidden=cfg.hidden, num_classes=trainer.out_dim,
                                 layers=cfg.layers, heads=cfg.heads, feature_bytes=fb, input_cache=cfg.input_cache,
                                 remat=cfg.remat == "cheap", cut_edges=c.cut_edges, symmetric=symmetric,
                                 relations=trainer.graph.num_relations, num_bases=getattr(cfg, "num_bases", 0),
                                 num_blocks=getattr(cfg, "num_blocks", 0),
                                 node_embedding=getattr(cfg, "node_embedding", 0), k=trainer.cfg.k)
    matrices = split_bytes()
    for bm in mats:
        m = matrices_split(owned=c.owned, halo=c.halo, edges=c.edges, cut_edges=c.cut_edges,
                           symmetric=bool(bm.symmetric), self_loops=bm.has_diag, weighted=not bm.unit)
        matrices = {k: matrices[k] + m[k] for k in matrices}
    exchanged = sum(ex.width * (int(ex.forward_planned) + int(ex.backward_planned)) for ex in trainer.ctx.exchanges)
    kept = getattr(trainer.model, "kept_input_halo", None)
    return dict(part=part_split(owned=c.owned, halo=c.halo, send=c.send, edges=c.edges, feature_dim=part.feature_dim),
                matrices=matrices,
                exchange=exchange_split(halo=c.halo, send=c.send, exchanged=exchanged,
                                        kept_halo_width=0 if kept is None else kept.shape[1],
                                        feature_bytes=4 if kept is None else kept.dtype.itemsize),
                activations=None, params=split_bytes(const=16 * sum(p.numel() for p in trainer.params)))


def memory_account(trainer, part, loaded: dict, saved: dict, cfg) -> tuple[dict, dict]:
    """(the theoretical size of this rank's data by term, its breakdown: what sizes the bytes, measured
    (:func:`~.attribution.attribute` of :func:`held_items`) and modelled (:func:`modelled_split`))."""
    items = held_items(trainer, loaded, saved)
    counts = rank_counts(part, trainer, loaded["cut_edges"])
    att = attribute(items, counts)
    breakdown = dict(counts=counts.as_dict(), measured=att["terms"], attributed=att["total"],
                     ambiguous=att["ambiguous"], other_items=att["other"],
                     modelled=modelled_split(trainer, counts, cfg),
                     model=f"user:{cfg.model_file}" if trainer.cfg.model_file else cfg.model)
    return theoretical_bytes(items), breakdown


def saved_activations(trainer, epoch: int, exclude=()) -> dict:
    """The distinct storages autograd saves during one training forward of the trainer's model, but parameters,
    those at the addresses ``exclude`` and those the rank holds anyway (:func:`_held_ptrs`, taken while the
    forward's storages are alive: a freed one's address can be reused): {address: (what, rows (``_rows``),
    bytes)}."""
    from g3mpi.ops import DropoutKey
    param_ptrs = {p.untyped_storage().data_ptr() for p in trainer.params}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in param_ptrs and t.layout == torch.strided and s.data_ptr() not in seen:
            seen[s.data_ptr()] = (f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}", _rows(t), s.nbytes())
        # detached: a saved output that holds its own grad_fn is a reference cycle autograd never frees (the
        # whole forward's tensors would stay alive for the rest of the run)
        return t.detach()

    trainer.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = trainer.model(trainer.x, DropoutKey(trainer.cfg.seed, epoch))
        m = trainer.masks["train"]
        loss = torch.nn.functional.cross_entropy(logits[m], trainer.y[m], reduction="sum")
    held = set(exclude) | _held_ptrs(trainer)
    del loss, logits
    return {p: v for p, v in seen.items() if p not in held}


class Variant:
    def __init__(self, name, design, schedule, step, logits, trainer=None):
        self.name, self.design, self.schedule = name, design, schedule
        self._step, self.logits, self.trainer = step, logits, trainer
        self.epochs = []

    def step(self, epoch):
        if self.trainer is not None:
            self.trainer.use_schedule(self.schedule)
        return self._step(epoch)


@dataclass(frozen=True)
class WorkerConfig:
    """One worker run. The suites pass it on the worker's command line (``common.run_worker``), which
    :func:`parse_args` reads back; the parser leaves an option not given as None, and the defaults are here."""

    # input and output
    parts: str                          # partition directory
    json: str                           # written by rank 0
    # the model
    model: str = "gcn"                  # a built-in model (g3mpi.nn.specs)
    hidden: int = 256                   # hidden width (GAT: per head)
    layers: int = 2
    heads: int = 8
    model_file: str = ""                # design "user": a user's model (g3-train --model-file PATH.py:FUNCTION)
    # what is measured: every (design, schedule) pair, epoch by epoch in turn
    designs: tuple = ("g3",)            # of DESIGNS
    schedules: tuple = (PIPELINED,)
    sim_net: str = ""                   # simulated network BANDWIDTH,LATENCY ("": off)
    chunk_rows: int = 0
    epochs: int = 5                     # measured epochs (after a warm-up epoch)
    threads: int = 1                    # torch threads per rank
    release_memory: bool = False        # as g3-train --release-memory
    input_cache: bool = True            # off: every layer exchanges every epoch
    dropout: float = 0.0                # as g3-train --dropout (the memory suite: 0.5, masks kept or recomputed)
    remat: str = "none"                 # as g3-train --remat
    node_embedding: int = 0             # as g3-train --node-embedding (0: none)
    memory: bool = False                # account the theoretical size of each rank's data
    check: bool = False                 # compare every variant's initial logits with g3mpi's
    timeline: bool = False              # one more epoch per g3mpi variant, recorded as a per-rank timeline

    def __post_init__(self):
        for d in self.designs:
            if d not in DESIGNS:
                raise ValueError(f"unknown design {d!r} ({', '.join(DESIGNS)})")
        if ("user" in self.designs) != bool(self.model_file):
            raise ValueError("design user and --model-file go together")


def build_parser():
    ap = Parser(prog="g3mpi.bench.worker", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--model", choices=specs.names())
    ap.add_argument("--hidden", type=int, help="hidden width (GAT: per head)")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--model-file", help="design user: the model file, PATH.py:FUNCTION")
    ap.add_argument("--designs")
    ap.add_argument("--schedules")
    ap.add_argument("--sim-net")
    ap.add_argument("--chunk-rows", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--release-memory", action="store_true", help="as g3-train --release-memory")
    ap.add_argument("--no-input-cache", action="store_true",
                    help="recompute the first layer's aggregation every epoch (every layer exchanges every epoch)")
    ap.add_argument("--dropout", type=float, help="as g3-train --dropout (default 0)")
    ap.add_argument("--remat", choices=("none", "cheap"), help="as g3-train --remat (default none)")
    ap.add_argument("--node-embedding", type=int, help="as g3-train --node-embedding (default 0: none)")
    ap.add_argument("--memory", action="store_true", help="account the theoretical size of each rank's data")
    ap.add_argument("--check", action="store_true", help="compare every variant's initial logits with g3mpi's")
    ap.add_argument("--timeline", action="store_true",
                    help="one more epoch per g3mpi variant, recorded as a per-rank timeline (not measured)")
    return ap


def parse_args(argv) -> WorkerConfig:
    """The command line as a WorkerConfig; ValueError on an unknown design."""
    a = build_parser().parse_args(argv)
    given = dict(vars(a))
    for k in ("designs", "schedules"):   # comma-separated on the command line
        if given[k] is not None:
            given[k] = tuple(x for x in given[k].split(",") if x)
    return from_options(WorkerConfig, given, input_cache=not a.no_input_cache)


def run(cfg: WorkerConfig, comm) -> dict | None:
    """Measure every variant of ``cfg`` on ``comm`` (one rank per part): the results on rank 0, None elsewhere."""
    torch.set_num_threads(cfg.threads)
    warm_libraries(comm)
    rss = dict(rss_base=peak_rss_bytes(), rss_base_current=current_rss_bytes())
    if cfg.release_memory:
        return_freed_memory()   # as g3-train --release-memory does before loading the part
    meta, part = read_rank_part(cfg.parts, comm, verify=False)
    loaded = loaded_part(part) if cfg.memory else None
    trainers = []   # closed at the end (exchanges and communicators freed); on an error the caller aborts the job
    variants, ref = _variants(cfg, comm, part, meta, trainers)
    check = _check_logits(variants, ref, comm) if cfg.check else {}
    saved = saved_activations(ref, 0, loaded["ptrs"]) if cfg.memory else None
    rss["rss_after_setup"] = peak_rss_bytes()
    for ep in range(cfg.epochs + 1):
        for v in variants:
            comm.Barrier()  # variants must not overlap each other; not inside the timed step
            rec = v.step(ep + 1)
            per_rank = gather_json(comm, rec)
            if comm.rank == 0 and ep > 0:
                v.epochs.append(per_rank)
    timelines = {}
    if cfg.timeline:   # epoch epochs + 2: after the warm-up and the measured ones
        for v in variants:
            if v.trainer is not None:
                comm.Barrier()
                v.step(cfg.epochs + 2)
                timelines[v.name] = v.trainer.timeline()
    theo, breakdown = memory_account(ref, part, loaded, saved, cfg) if cfg.memory else (None, None)
    ranks = gather_json(comm, _rank_info(comm, part, ref, rss, theo, breakdown))
    # not in a finally: after an error on one rank, freeing waits for exchanges the other ranks never complete,
    # and main aborts the job at once instead
    for tr in trainers:
        tr.close()
    if comm.rank != 0:
        return None
    out = dict(world_size=comm.size, parts=cfg.parts, model=cfg.model, hidden=cfg.hidden, layers=cfg.layers,
               threads=cfg.threads, sim_net=cfg.sim_net or None, num_nodes=part.num_nodes, num_edges=part.num_edges,
               feature_dim=part.feature_dim, num_classes=part.num_classes, ranks=ranks, check_rel_diff=check,
               variants={})
    for v in variants:
        out["variants"][v.name] = dict(design=v.design, schedule=v.schedule, epochs=[_epoch(r) for r in v.epochs],
                                       timeline=timelines.get(v.name))
    return out


def _train_config(cfg: WorkerConfig) -> TrainConfig:
    """The trainers' settings: the run's model and runtime, its dropout (default none), no weight decay, one more
    epoch than measured for the warm-up (and one for the timeline)."""
    return TrainConfig(parts=cfg.parts, out="", model=cfg.model, layers=cfg.layers, hidden=cfg.hidden,
                       heads=cfg.heads, dropout=cfg.dropout, remat=cfg.remat, weight_decay=0.0, lr=0.01, threads=cfg.threads,
                       schedule=cfg.schedules[0], chunk_rows=cfg.chunk_rows, sim_net=cfg.sim_net, verify=False,
                       progress=False, input_cache=cfg.input_cache, release_memory=cfg.release_memory,
                       node_embedding=cfg.node_embedding, epochs=cfg.epochs + 2,
                       timeline_epoch=cfg.epochs + 2 if cfg.timeline else 0)


def _variants(cfg: WorkerConfig, comm, part, meta: dict, trainers: list) -> tuple[list, Trainer]:
    """(every variant of ``cfg``, the reference trainer: the first one built, whose model the naive designs copy);
    the trainers built are appended to ``trainers``."""
    from .naive import ReplicateAllRunner, as_g3_original
    train_cfg = _train_config(cfg)
    split_sizes, ids_once = start_up_sums(part, Watchdog(comm, 0))
    if not ids_once:
        raise ValueError(f"{cfg.parts}: {IDS_NOT_ONCE}")
    variants, ref = [], None
    for d in cfg.designs:
        if d in ("g3", "g3-original", "user"):
            # (a user's model starts from the same seed: the user GCN from the built-in GCN's parameters)
            tc = train_cfg.replace(model_file=cfg.model_file) if d == "user" else train_cfg
            # variants share the part and switch schedules: its edges stay unless one trainer runs one schedule,
            # as g3-train does (then they go after the first forward, as there)
            alone = len(cfg.designs) == 1 and len(cfg.schedules) == 1
            tr = Trainer(tc, comm, part, meta, split_sizes, release_edges=alone)
            if d == "user":
                tr.check_model_output()
            trainers.append(tr)
            if d == "g3-original":
                as_g3_original(tr.model)
            if ref is None:
                ref = tr
            for s in cfg.schedules:
                name = d if len(cfg.schedules) == 1 else f"{d}:{s}"
                variants.append(Variant(name, d, s, tr.train_step, tr.logits, tr))
        else:
            if ref is None:
                ref = Trainer(train_cfg, comm, part, meta, split_sizes, release_edges=False)
                trainers.append(ref)
            dims = [part.feature_dim] + [cfg.hidden] * (cfg.layers - 1) + [part.num_classes]
            rr = ReplicateAllRunner(part, comm, cfg.model, dims, ref.model.state_dict(), ref.split_sizes["train"])
            variants.append(Variant(d, d, BLOCKING, rr.step, rr.logits))
    return variants, ref


def _check_logits(variants: list, ref: Trainer, comm) -> dict:
    """Every variant's relative difference of its initial logits from the reference's (over all ranks)."""
    check = {}
    base = ref.logits()
    for v in variants:
        out = v.logits() if v.trainer is None else v.trainer.logits()
        sums = np.array([float(((out - base) ** 2).sum()), float((base ** 2).sum())])
        comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        num, den = sums.tolist()
        check[v.name] = (num / den) ** 0.5 if den > 0 else 0.0
    return check


def _rank_info(comm, part, ref: Trainer, rss: dict, theo: dict | None, breakdown: dict | None) -> dict:
    """This rank's partition figures, memory (``--memory``: its theoretical size and breakdown) and exchange
    widths."""
    return dict(rank=comm.rank, cpus=sorted(os.sched_getaffinity(0)), owned=part.num_owned, halo=part.num_halo,
                send=int(len(part.send_rows)),
                local_edges=part.num_local_edges, neighbors=int(len(np.union1d(part.recv_parts, part.send_parts))),
                **rss, rss_peak=peak_rss_bytes(), rss_end_current=current_rss_bytes(), theoretical=theo,
                breakdown=breakdown,
                exchanges={ex.name: ex.width for ex in ref.ctx.exchanges})


def _epoch(per_rank: list) -> dict:
    """One measured epoch of a variant: the slowest rank's time, the bytes, and every rank's figures."""
    return dict(epoch_time_s=max(r["epoch_time_s"] for r in per_rank),
                bytes_sent=sum(r["bytes_sent"] for r in per_rank),
                bytes_recv=sum(r["bytes_recv"] for r in per_rank),
                rank_epoch_s=[r["epoch_time_s"] for r in per_rank],
                rank_compute_s=[r["compute_s"] for r in per_rank],
                rank_blocked_s=[r["blocked_s"] for r in per_rank],
                rank_idle_s=[r["allreduce_s"] for r in per_rank],
                rank_comm_s=[r["comm_s"] for r in per_rank],
                rank_bytes_sent=[r["bytes_sent"] for r in per_rank],
                rank_bytes_recv=[r["bytes_recv"] for r in per_rank],
                rank_messages=[r["messages"] for r in per_rank])


def main(argv=None, comm=None) -> int:
    comm = comm or MPI.COMM_WORLD
    try:
        # argparse's errors exit 2 on every rank (a SystemExit passes this except); a bad setting (an unknown
        # design) aborts the job as any error of the run does
        cfg = parse_args(argv)
        out = run(cfg, comm)
    except Exception as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        import traceback
        abort_job(comm, f"g3mpi.bench.worker: error: [rank {comm.rank}] {type(e).__name__}: {e}\n"
                        f"{traceback.format_exc()}")
        return 1
    if out is not None:
        write_json(Path(cfg.json), out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
