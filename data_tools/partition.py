"""``g3-partition``: split a graph.h5 into P parts (KaMinPar, METIS, random, G3 refinement, or streaming on MPI
ranks) and write a partition directory.

    g3-partition graph.h5 --parts 8 --out parts8/        (auto: kaminpar + g3 refinement, or stream if too large)
    g3-partition graph.h5 --parts 4 --method metis --balance nodes --out parts/
    g3-partition graph.h5 --parts 8 --method kaminpar --kaminpar-context strong --refine g3 --out parts8/
    g3-partition graph.h5 --parts 8 --method random --seed 1 --out parts8/
    g3-partition graph.h5 --parts 16 --method g3 --bandwidth 10Gbit --out parts16/
    mpiexec -n 4 g3-partition graph.h5 --parts 8 --method stream --out parts8/   (each rank reads a slice)

The graph's checksums and indices are validated before use; the output directory appears atomically and
only when complete (``--force`` replaces an earlier partition, never a directory of the user's). Under mpiexec a
serial method runs on rank 0 alone while the other ranks wait and exit with its status (:func:`on_rank0`). See
docs/PARTITION.md and docs/PARTITION_METHODS.md.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from g3mpi.format import META_NAME, FormatError, graph_fingerprint, load_graph
from g3mpi.format.atomic import check_output
from g3mpi.mpi.termination import terminate_as_interrupt
from g3mpi.mpi.deadline import DEFAULT_FLOOR_S

from .build import write_partition
from .failures import FAILURES, failure_status
from .partitioners import CostModel, calibrate, metis_partition, random_partition
from .partitioners.cost import DEFAULT_EDGE_SECONDS
from .partitioners.kaminpar import KaMinParError, KaMinParMissing, default_threads
from .partitioners.metis import MetisError, strip_self_loops

PROG = "g3-partition"
MAX_PARTS = 1024
#: largest --seed: METIS takes it as an idx_t (64-bit in pymetis 2025.2; larger values are refused by its binding)
#: and numpy's generators (random, g3's descent) need it >= 0
MAX_SEED = 2**63 - 1
#: largest --width: rows x width x 4 bytes stays within int64 for up to 2^36 rows
MAX_WIDTH = 2**24
#: the hint of a partitioning that failed or ran out of memory (the path whose memory scales with the ranks)
SCALE_HINT = "for graphs this large use the parallel path: mpiexec -n R g3-partition --method stream ..."
#: options of one method only (``PartitionConfig`` field -> method); the cost model's options (--bandwidth,
#: --edge-seconds, --width, --calibrate) apply to every method, since meta.json's estimates use them
METHOD_OPTIONS = dict(balance="metis", objective="metis", node_imbalance="g3 stream metis kaminpar auto",
                      edge_imbalance="g3 stream metis kaminpar auto",
                      max_iters="g3", cost_slack="g3", start="g3", start_balance="g3", stream_order="stream auto",
                      kaminpar_context="kaminpar auto", threads="kaminpar auto", refine="metis kaminpar auto")
#: options of the g3 refinement, which also apply to any method run with --refine g3
REFINE_OPTIONS = ("max_iters", "cost_slack")
#: KaMinPar's context under --method auto: on the quickstart's SBM graph (60k nodes, 8 parts) the fast context's
#: start, refined, cut 1.15-1.25x METIS's max communication rows at 3 seeds of 5, the default context's at none
#: (docs/PARTITION_METHODS.md)
AUTO_KAMINPAR_CONTEXT = "default"
#: KaMinPar's threads under --method auto: its partition on more than one thread differs from run to run
AUTO_KAMINPAR_THREADS = 1
#: at most this many stored edges, auto also runs METIS (node-balanced) and keeps its partition when it is within
#: both caps with fewer max communication rows: METIS costs under a second there (docs/PARTITION_METHODS.md)
AUTO_METIS_CHECK_EDGES = 1 << 21
#: the refinement's evaluations at most under --method auto (--max-iters overrides): on R-MAT 20 and 22 into 8
#: parts, 4 left 0.1-0.3 % more max communication rows than 100 in a third of the time (docs/PARTITION_METHODS.md)
AUTO_MAX_ITERS = 4
#: KaMinPar's tolerance before a refinement, as a share of the caps' (--node/--edge-imbalance minus 1): its one
#: weight then keeps the in-edges under their cap, so the refinement only evens out the node counts; on R-MAT 20
#: and 22 into 8 and 16 parts that also left 3 % fewer max communication rows than the caps' whole tolerance
KAMINPAR_REFINE_TOLERANCE = 0.5
#: methods run by one process (under mpiexec: by rank 0 alone, :func:`on_rank0`)
SERIAL_METHODS = ("kaminpar", "metis", "random", "g3")


@dataclass(frozen=True)
class PartitionConfig:
    graph: Path
    parts: int
    method: str
    out: Path
    seed: int = 0
    force: bool = False
    balance: str = "nodes"
    node_imbalance: float = 1.10
    edge_imbalance: float = 1.10
    max_iters: int | None = 100     # None (--method auto unset): resolved by choose_method
    cost_slack: float = 0.0
    start: str = "auto"
    start_balance: str = "auto"
    objective: str = "cut"
    stream_order: str = "degree"
    kaminpar_context: str = "default"
    threads: int | None = None
    refine: str = "none"
    bandwidth: float = 10e9 / 8
    edge_seconds: float = DEFAULT_EDGE_SECONDS
    width: int | None = None
    calibrate: bool = False
    progress: bool = True
    comm_timeout: float = -1.0          # --method stream: seconds a rank may wait for another (0: off; < 0: auto)
    comm_timeout_floor: float = DEFAULT_FLOOR_S   # the adaptive deadline's floor
    auto: bool = False   # resolved from --method auto (choose_method): reproducible KaMinPar, METIS check


def log(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def assign(g, cfg: PartitionConfig, model: CostModel, degrees: tuple) -> tuple[np.ndarray, dict]:
    """Node→part assignment for cfg.method (and cfg.refine), plus method-specific meta entries. ``degrees``:
    :func:`data_tools.build.degrees` of the graph."""
    n, P = g.num_nodes, cfg.parts
    if cfg.method == "random":
        return random_partition(n, P, cfg.seed)
    loops, in_deg, _ = degrees
    start, info = None, {}
    if cfg.method == "kaminpar":   # before the copy without self loops: it reads the rows block by block
        from .partitioners.kaminpar import kaminpar_partition
        tolerance = min(cfg.node_imbalance, cfg.edge_imbalance) - 1
        if cfg.refine == "g3":
            tolerance *= KAMINPAR_REFINE_TOLERANCE
        threads = AUTO_KAMINPAR_THREADS if cfg.auto else cfg.threads
        start, info = kaminpar_partition(g.indptr, g.indices, P, symmetric=bool(g.attrs["symmetric"]),
                                         in_degree=in_deg, context=cfg.kaminpar_context, threads=threads,
                                         seed=cfg.seed, imbalance=1 + tolerance, workdir=cfg.out.resolve().parent,
                                         self_loops=loops)
        if cfg.refine == "none":
            return start, info
    stored = g.indices.dtype
    indptr, indices, removed = strip_self_loops(g.indptr, np.asarray(g.indices, dtype=np.int64), loops)
    # one copy of the edges while the partitioners run (their int64 form; the graph's own is made again after)
    release = not removed and stored != indices.dtype
    if release:
        g.indices = None
    try:
        return _assign_on(g, cfg, model, indptr, indices, start, info)
    finally:
        if release:
            g.indices = indices.astype(stored)


def _assign_on(g, cfg: PartitionConfig, model: CostModel, indptr, indices, start, info) -> tuple[np.ndarray, dict]:
    """:func:`assign`'s METIS and g3 methods (and the refinement) on the graph's CSR without self loops, int64."""
    P = cfg.parts
    in_deg = np.diff(indptr)
    if cfg.method == "metis":
        start, info = metis_partition(indptr, indices, P, balance=cfg.balance, in_degree=in_deg,
                                      train_mask=g.train_mask, seed=cfg.seed, objective=cfg.objective,
                                      imbalance=min(cfg.node_imbalance, cfg.edge_imbalance))
        if cfg.refine == "none":
            return start, info
        info.setdefault("balance", cfg.balance)
        info.setdefault("metis_objective", cfg.objective)
    from .partitioners.g3 import g3_partition
    name = None if start is None else f"{cfg.method} " + (
        f"context={cfg.kaminpar_context}" if cfg.method == "kaminpar" else f"balance={cfg.balance}")
    a, refined = g3_partition(indptr, indices, P, model=model, node_imbalance=cfg.node_imbalance,
                              edge_imbalance=cfg.edge_imbalance, max_iters=cfg.max_iters, seed=cfg.seed,
                              progress=cfg.progress, log=log, cost_slack=cfg.cost_slack,
                              start_balance=cfg.start_balance, start=start, start_name=name,
                              recursive=None if cfg.start == "auto" else cfg.start == "recursive",
                              start_objective={"auto": "auto", "volume": "volume"}.get(cfg.start, "cut"),
                              symmetric=bool(g.attrs.get("symmetric", False)))
    info = dict(info, **refined) if start is not None else refined
    if cfg.auto and cfg.method == "kaminpar" and len(indices) <= AUTO_METIS_CHECK_EDGES:
        return _metis_check(g, cfg, indptr, indices, a, info)
    return a, info


def _metis_check(g, cfg: PartitionConfig, indptr, indices, a, info) -> tuple[np.ndarray, dict]:
    """auto on a small graph: node-balanced METIS's partition instead of ``a`` where it holds both caps with
    fewer max communication rows (both are deterministic, so the choice is too); meta.json's ``auto_check``
    records both counts and which was kept."""
    from .partitioners.cost import imbalance, out_edges, partition_stats
    src, dst = out_edges(indptr, indices)
    in_deg = np.diff(indptr)

    def rows(x):
        st = partition_stats(src, dst, x, cfg.parts, in_degree=in_deg)
        within = imbalance(st["owned"]) <= cfg.node_imbalance and imbalance(st["local_edges"]) <= cfg.edge_imbalance
        return int((st["halo"] + st["send"]).max()), within
    m, m_info = metis_partition(indptr, indices, cfg.parts, balance="nodes", in_degree=in_deg, seed=cfg.seed)
    (ours, _), (theirs, within) = rows(a), rows(m)
    keep = within and theirs < ours
    check = dict(max_comm_rows=ours, metis_max_comm_rows=theirs, metis_within_caps=within,
                 kept="metis" if keep else method_label(cfg))
    if keep:
        log(f"--method auto: kept node-balanced METIS's partition ({theirs} max communication rows, "
            f"{method_label(cfg)}'s {ours})")
        return m, dict(m_info, balance="nodes", auto_check=check)
    return a, dict(info, auto_check=check)


def check_out_path(graph: Path, out: Path) -> None:
    """FormatError unless ``out`` can be replaced without destroying ``graph``.

    Refused: the input itself (also through a link), a directory that holds the input (``--out . --force``
    would delete it with the rest), and a name that is not a directory entry of its own (``.``, ``..``, ``/``).
    """
    g, o = graph.resolve(), out.resolve()
    same = g == o or (graph.exists() and out.exists() and os.path.samefile(graph, out))
    if same or g.is_relative_to(o) or o.is_relative_to(g):
        inside = "" if same else f" ({graph} lies inside it)" if g.is_relative_to(o) else f" (inside {graph})"
        raise FormatError(out, f"output would overwrite the input{inside}")
    if out.name in ("", ".", "..") or o.parent == o:
        raise FormatError(out, "name the output directory itself (not '.', '..' or '/')")


def method_label(cfg: PartitionConfig) -> str:
    """meta.json's ``method``: the method, ``+g3`` when refined (``kaminpar+g3``)."""
    return cfg.method + ("+g3" if cfg.refine == "g3" else "")


def kept_label(cfg: PartitionConfig, info: dict) -> str:
    """meta.json's ``method`` of the assignment ``info`` came with (auto's check may keep METIS's)."""
    return info.get("auto_check", {}).get("kept", method_label(cfg))


def partition_graph(cfg: PartitionConfig):
    """The graph (without features), read and checked, and its assignment by ``cfg.method``: ``(g, assignment,
    meta extras, degrees)`` (:func:`data_tools.build.degrees`); what the method said is logged."""
    t0 = time.time()
    g = load_graph(cfg.graph, features=False)   # the parts' features are copied from the file block by block
    n = g.num_nodes
    if cfg.parts > max(1, n):
        raise FormatError(cfg.graph, f"cannot split {n} nodes into {cfg.parts} parts (--parts must be <= N)")
    t_load = time.time() - t0
    if not g.train_mask.any():
        print(f"{PROG}: warning: {cfg.graph}: no training nodes (no labels, or an empty train mask): g3-train will "
              f"refuse this partition", file=sys.stderr)
    edge_seconds = calibrate() if cfg.calibrate else cfg.edge_seconds
    model = CostModel(edge_seconds=edge_seconds, bandwidth=cfg.bandwidth,
                      width=cfg.width or max(1, int(g.attrs["feature_dim"])))
    log(f"{n} nodes, {g.num_edges} edges; {method_label(cfg)} into {cfg.parts} parts")
    t1 = time.time()
    from .build import degrees
    degs = degrees(g.indptr, g.indices)   # (the writer needs them too)
    assignment, info = assign(g, cfg, model, degs)
    t_part = time.time() - t1
    for said in info.get("metis_messages", ()):
        log(f"METIS said: {said}")
    if info.get("empty_parts_filled"):
        log(f"METIS left {info['empty_parts_filled']} of {cfg.parts} parts empty (too many parts for {n} nodes); "
            f"each was given the lowest-degree node of the largest part")
    extra = dict(info, partition_seconds=round(t_part, 3), load_seconds=round(t_load, 3), cost_model=model.to_dict(),
                 graph_sha256=graph_fingerprint(cfg.graph))
    if cfg.method == "metis":
        extra.setdefault("balance", cfg.balance)
        extra.setdefault("metis_objective", cfg.objective)
    return g, assignment, extra, degs


def run(cfg: PartitionConfig) -> dict:
    """One process: partition and write."""
    check_out_path(cfg.graph, cfg.out)
    check_output(cfg.out, cfg.force, META_NAME)  # fail before the expensive work
    t0 = time.time()
    g, assignment, extra, degs = partition_graph(cfg)
    t_part, label = extra["partition_seconds"], kept_label(cfg, extra)
    if cfg.progress:
        from tqdm import tqdm

        def progress(it, total):
            # disable=None: no bar when stderr is not a terminal (batch logs)
            return tqdm(it, total=total, desc="writing parts", unit="part", file=sys.stderr, leave=False, disable=None)
    else:
        progress = None
    meta = write_partition(g, assignment, cfg.parts, cfg.out, method=label, seed=cfg.seed, force=cfg.force,
                           extra_meta=extra, progress=progress, graph_path=cfg.graph,
                           threads=cfg.threads or default_threads(), degrees=degs)
    q = meta["quality"]
    print(f"{PROG}: wrote {cfg.out} ({cfg.parts} parts, {label}) in {time.time() - t0:.1f}s "
          f"(partitioning {t_part:.1f}s): edge_cut={q['edge_cut']} node_imbalance={q['node_imbalance']:.3f} "
          f"compute_imbalance={q['compute_imbalance']:.3f} max_comm_rows={q['max_comm_rows']}")
    if "objective_before" in extra:
        print(f"{PROG}: g3 objective (est. max epoch seconds) {extra['objective_before']:.6g} -> "
              f"{extra['objective_after']:.6g} in {extra['iterations']} iterations")
    return meta


#: environment variables that MPI launchers set in every process they start (Hydra/MPICH: PMI_*, PMIx: PMIX_*,
#: Open MPI: OMPI_COMM_WORLD_*): only whether MPI is initialised is decided by them, never a rank or a size
LAUNCHER_VARS = ("PMI_SIZE", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


def launched_comm():
    """COMM_WORLD when this process was started by an MPI launcher (``mpiexec``, ``srun``, or ``python -m
    mpi4py``), else None: a serial run on a machine without a working MPI never calls MPI_Init."""
    if "mpi4py" not in sys.modules and not any(v in os.environ for v in LAUNCHER_VARS):
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD


def on_rank0(comm, fn) -> int:
    """``fn()`` (a serial method's whole run, returning its exit status) on rank 0 of ``comm`` only; the other
    ranks wait for its status and return it: one writer of the output directory, and one exit status for the
    job. The others wait in a non-blocking broadcast tested every 0.1 s, so that they do not spin on the CPUs
    rank 0 computes on (MPICH's blocking wait polls)."""
    from g3mpi.mpi.watchdog import Watchdog   # (imports MPI: only under a launcher)
    status = np.zeros(1, dtype=np.int64)
    # no deadline (rank 0 computes for as long as the method takes), but a quiet wait: polled, sleeping
    wd = Watchdog(comm, math.inf, prog=PROG)
    what = "the serial method's exit status (rank 0 runs it)"
    if comm.rank == 0:
        log(f"the method is serial: rank 0 runs it, ranks 1..{comm.size - 1} wait for its exit status")
        try:
            status[0] = fn()
        except BaseException:   # the others must not wait for ever (python -m mpi4py then aborts them all)
            status[0] = 1
            wd.bcast(status, 0, what)
            raise
    wd.bcast(status, 0, what)
    return int(status[0])


def choose_method(cfg: PartitionConfig, comm) -> PartitionConfig:
    """``--method auto`` resolved: kaminpar where the graph fits this machine by :func:`fits_in_memory` (and
    the kaminpar package is there; else g3, METIS + refinement), stream otherwise. Under mpiexec rank 0 decides
    (the ranks may see different free memory) and broadcasts its choice."""
    choice = np.zeros(1, dtype=np.int64)
    names = ("kaminpar", "g3", "stream")
    if comm is None or comm.rank == 0:
        choice[0] = names.index(auto_method(cfg.graph))
    if comm is not None and comm.size > 1:
        from g3mpi.mpi.watchdog import Watchdog   # (imports MPI: only under a launcher)
        Watchdog(comm, math.inf, prog=PROG).bcast(choice, 0, "the choice of --method auto")
    method = names[int(choice[0])]
    refine = "none" if method in ("g3", "stream") else cfg.refine
    if comm is None or comm.rank == 0:
        log(f"--method auto: {method}" + ("+g3" if refine == "g3" else "") + f" ({AUTO_REASON[method]})")
    # KaMinPar's start is within the in-edge cap already; g3's METIS start needs the whole refinement
    max_iters = cfg.max_iters if cfg.max_iters is not None else \
        AUTO_MAX_ITERS if method == "kaminpar" else PartitionConfig.__dataclass_fields__["max_iters"].default
    return dataclasses.replace(cfg, method=method, refine=refine, max_iters=max_iters, auto=True)


#: why auto chose a method (docs/PARTITION_METHODS.md)
AUTO_REASON = dict(kaminpar="the graph fits this machine's memory",
                   g3="the kaminpar package is not installed: pip install kaminpar for the faster default",
                   stream="the graph does not fit this machine's memory: each rank reads a slice")


def auto_method(graph: Path) -> str:
    """``kaminpar``, ``g3`` (no kaminpar package) or ``stream`` for --method auto (an unreadable graph: kaminpar,
    whose run then names the problem)."""
    try:
        from g3mpi.format import open_graph
        with open_graph(graph) as f:
            n, e = int(f.attrs["num_nodes"]), int(f.attrs["num_edges"])
            symmetric = bool(f.attrs.get("symmetric", False))
    except (FormatError, KeyError, TypeError, ValueError, OSError):
        return "kaminpar"
    if not fits_in_memory(n, e if symmetric else 2 * e):   # KaMinPar partitions A + A^T
        return "stream"
    try:
        import kaminpar  # noqa: F401
    except ImportError:
        return "g3"
    return "kaminpar"


#: peak bytes of ``--method kaminpar --refine g3`` per stored edge and per node (docs/PARTITION_METHODS.md)
KAMINPAR_BYTES_PER_EDGE = 64
KAMINPAR_BYTES_PER_NODE = 400
#: the share of this machine's available memory auto lets the serial path use
AUTO_MEMORY_SHARE = 0.8


def kaminpar_memory(num_nodes: int, num_edges: int) -> int:
    """Estimated peak bytes of kaminpar + g3 refinement on a graph of this size (``num_edges``: of the symmetric
    graph KaMinPar gets, twice the stored edges of a graph not stored symmetric)."""
    return KAMINPAR_BYTES_PER_EDGE * num_edges + KAMINPAR_BYTES_PER_NODE * num_nodes


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def fits_in_memory(num_nodes: int, num_edges: int) -> bool:
    avail = available_memory()
    return avail is None or kaminpar_memory(num_nodes, num_edges) <= AUTO_MEMORY_SHARE * avail


def serial_main(cfg: PartitionConfig, argv) -> int:
    """A serial method's whole run; its exit status, after one error line if it failed."""
    try:
        with terminate_as_interrupt():
            run(cfg)
    except (MetisError, KaMinParError) as e:
        hint = "" if isinstance(e, KaMinParMissing) else f"; {SCALE_HINT}"
        print(f"{PROG}: error: {cfg.graph}: --method {cfg.method}: {e}{hint}", file=sys.stderr)
        return 1
    except FAILURES as e:    # (argv None: the command itself; in-process callers get the status)
        return failure_status(PROG, e, out=cfg.out, out_of_memory=f"{cfg.graph}: out of memory (--method "
                              f"{cfg.method}); {SCALE_HINT}", command=argv is None)
    return 0


def dispatch(cfg: PartitionConfig, argv, comm) -> int:
    if cfg.method == "auto":
        cfg = choose_method(cfg, comm)
    if cfg.method == "stream":   # every rank of the MPI job (mpiexec -n R g3-partition ...)
        from .parallel import main as parallel_main
        return parallel_main(cfg, comm)
    if comm is not None and comm.size > 1:
        return on_rank0(comm, lambda: serial_main(cfg, argv))
    return serial_main(cfg, argv)


def main(argv=None) -> int:
    """``g3-partition`` (its parser and main live in :mod:`data_tools.cli`; this name stays for scripts installed
    before)."""
    from .cli import partition_main
    return partition_main(argv)


if __name__ == "__main__":
    sys.exit(main())
