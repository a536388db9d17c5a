"""``g3-partition --method stream``: the partitioner whose ranks each read a slice of the graph.

    mpiexec -n 4 g3-partition graph.h5 --parts 8 --method stream --out parts/

Rank r reads rows ``r*N//R .. (r+1)*N//R - 1`` of graph.h5 (:mod:`data_tools.slices`), partitions with the
others (:mod:`data_tools.partitioners.stream`) and writes the parts ``p`` with ``p % R == r``
(:mod:`data_tools.parallel_build`); no rank holds the whole graph. A problem on any rank (bad input in its slice,
a failed write) stops every rank, non-zero, and nothing is written; rank 0 says it once for the job, one line per
distinct error naming the ranks that had it (:mod:`g3mpi.mpi.report`). See docs/PARTITION.md.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
import uuid
from pathlib import Path

import numpy as np

from g3mpi.format import META_NAME, FormatError, atomic_dir, graph_fingerprint, open_graph
from g3mpi.format.atomic import check_output
from g3mpi.format.errors import H5_READ_ERRORS, failure_reason, unreadable
from g3mpi.mpi.collectives import (RankFailed, agree, allgather_rows, allgather_text, allreduce, barrier,
                                   bcast_array, rank_bounds, set_phase)
from g3mpi.mpi.rss import peak_rss_mib
from g3mpi.mpi.termination import interruption, terminate_as_interrupt
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.mpi.report import report

PROG = "g3-partition"
#: test-only (tests/test_stalls.py): ``G3_TEST_STOP=RANK:POINT`` makes rank RANK stop itself (SIGSTOP) at POINT,
#: one of these: before partitioning, before writing the parts. Never set it in production
STOP_POINTS = ("partition", "write")


def _test_stop(comm, point: str) -> None:
    spec = os.environ.get("G3_TEST_STOP", "")
    if spec and spec == f"{comm.rank}:{point}":
        os.kill(os.getpid(), signal.SIGSTOP)


def error(comm, msg: str) -> None:
    """``g3-partition: error: [rank r] msg`` in one write() (the lines of ranks sharing a pipe never interleave)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, f"{PROG}: error: [rank {comm.rank}] {msg}\n".encode(errors="replace"))


def say(comm, msg: str) -> None:
    """A line of rank 0's (the tool's own output)."""
    if comm.rank == 0:
        print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


def guarded(comm, fn, *args):
    """``fn(*args)`` on every rank, then :func:`agree`: a FormatError (or a failed allocation) of one rank becomes
    RankFailed on every rank. ``fn`` must not communicate (a rank that failed would leave the others waiting)."""
    out, err = None, None
    try:
        out = fn(*args)
    except FormatError as e:
        err = str(e)
    except MemoryError:
        err = f"{args[0] if args else ''}: out of memory on this rank"
    agree(comm, err)
    return out


def on_root(comm, fn, *args):
    """:func:`guarded` ``fn(*args)`` on rank 0 only (its result there, None elsewhere)."""
    if comm.rank == 0:
        return guarded(comm, fn, *args)
    agree(comm, None)
    return None


def num_nodes_of(path) -> int:
    with open_graph(path) as f:
        try:
            return int(f.attrs["num_nodes"])
        except H5_READ_ERRORS as e:
            raise unreadable(path, e) from None


def check_target(cfg) -> None:
    from .partition import check_out_path
    check_out_path(cfg.graph, cfg.out)
    check_output(cfg.out, cfg.force, META_NAME)   # fail before the expensive work


def run(cfg, comm) -> dict | None:
    """Partition and write on every rank of ``comm`` (a communicator, or a :class:`~g3mpi.mpi.watchdog.Watchdog`
    whose deadline bounds every wait); returns meta.json's content on rank 0 (None elsewhere)."""
    from .partitioners import CostModel, calibrate
    from .partitioners.stream import local_graph, stream_partition
    from .slices import read_slice

    t0 = time.time()
    set_phase(comm, "reading the graph's slices")
    on_root(comm, check_target, cfg)
    n = guarded(comm, num_nodes_of, cfg.graph)
    if cfg.parts > max(1, n):
        raise FormatError(cfg.graph, f"cannot split {n} nodes into {cfg.parts} parts (--parts must be <= N)")
    bounds = rank_bounds(n, comm.size)
    # the features are checked here but read again only for the write's blocks: partitioning never holds them
    sl = guarded(comm, read_slice, cfg.graph, bounds, comm.rank, True, False)
    t_load = time.time() - t0
    if not allreduce(comm, np.array([sl.masks["train_mask"].sum()], dtype=np.int64))[0]:
        say(comm, f"warning: {cfg.graph}: no training nodes (no labels, or an empty train mask): g3-train will "
                  f"refuse this partition")
    say(comm, f"{n} nodes, {sl.num_edges} edges; stream into {cfg.parts} parts on {comm.size} rank(s)")
    t1 = time.time()
    _test_stop(comm, "partition")
    set_phase(comm, "partitioning")
    lg = local_graph(comm, bounds, sl.indptr, sl.indices, bool(sl.attrs["symmetric"]))
    parts, info = stream_partition(comm, lg, cfg.parts, seed=cfg.seed, imbalance=cfg.node_imbalance,
                                   edge_imbalance=cfg.edge_imbalance, order=cfg.stream_order,
                                   log=lambda m: say(comm, m))
    t_part = time.time() - t1
    rss_part = allgather_rows(comm, np.array([peak_rss_mib()]))[:, 0]
    edge_seconds = cfg.edge_seconds
    if cfg.calibrate:
        edge_seconds = np.array([calibrate() if comm.rank == 0 else 0.0])
        bcast_array(comm, edge_seconds, 0, "calibration (rank 0 times the kernels)")
        edge_seconds = float(edge_seconds[0])
    model = CostModel(edge_seconds=edge_seconds, bandwidth=cfg.bandwidth,
                      width=cfg.width or max(1, int(sl.attrs["feature_dim"])))
    extra = dict(info, ranks=comm.size, stream_order=cfg.stream_order, partition_seconds=round(t_part, 3),
                 load_seconds=round(t_load, 3), cost_model=model.to_dict(),
                 peak_rss_mib_partition=[round(float(x), 1) for x in rss_part],
                 graph_sha256=on_root(comm, graph_fingerprint, cfg.graph))
    partition_id = allgather_text(comm, uuid.uuid4().hex if comm.rank == 0 else None)[0]
    _test_stop(comm, "write")
    set_phase(comm, "writing the parts")
    meta = write(comm, cfg, sl, lg, parts, partition_id, extra)
    rss_all = allgather_rows(comm, np.array([peak_rss_mib()]))[:, 0]
    if comm.rank == 0:
        q = meta["quality"]
        say(comm, f"wrote {cfg.out} ({cfg.parts} parts, stream, {comm.size} ranks) in {time.time() - t0:.1f}s "
                  f"(partitioning {t_part:.1f}s): edge_cut={q['edge_cut']} node_imbalance={q['node_imbalance']:.3f} "
                  f"compute_imbalance={q['compute_imbalance']:.3f} max_comm_rows={q['max_comm_rows']}")
        say(comm, "peak RSS per rank (MiB): partition stage " + " ".join(f"{x:.0f}" for x in rss_part)
                  + "; with the write " + " ".join(f"{x:.0f}" for x in rss_all))
    return meta


def write(comm, cfg, sl, lg, parts, partition_id, extra) -> dict | None:
    """The partition directory, written by every rank into rank 0's temporary directory, which replaces
    ``cfg.out`` only when every rank succeeded (``atomic_dir``)."""
    from .parallel_build import write_partition_parallel

    meta, err = None, None
    try:
        with contextlib.ExitStack() as stack:
            tmp = None
            if comm.rank == 0:
                try:
                    tmp = stack.enter_context(atomic_dir(cfg.out, META_NAME, cfg.force))
                except FormatError as e:
                    err = str(e)
            agree(comm, err, "agreement on the output directory (rank 0 makes it)")
            tmp = Path(allgather_text(comm, str(tmp) if comm.rank == 0 else None)[0])
            meta = write_partition_parallel(comm, tmp, sl, lg, parts, cfg.parts, partition_id=partition_id,
                                            method="stream", seed=cfg.seed, extra_meta=extra)
    except (OSError, RuntimeError) as e:   # rank 0's meta.json or the directory's commit (after every exchange)
        err = f"{cfg.out}: cannot be written: {failure_reason(e)}"
    agree(comm, err)
    return meta


def failed(wd: Watchdog, errs: list[str | None], own_world: bool) -> int:
    """The exit of a failure every rank knows of (``errs``: every rank's error or None): rank 0's lines for the
    job, then exit status 1 on every rank once they are out. On its own COMM_WORLD MPI is finalized first: under
    ``python -m mpi4py`` a non-zero exit with MPI initialised aborts the job, with a line of noise per rank."""
    report(wd.comm.rank, PROG, errs)
    barrier(wd, "exit after an error (rank 0's lines are out before the job ends)")
    if own_world:
        from mpi4py import MPI
        MPI.Finalize()
    return 1


def main(cfg, comm=None) -> int:
    """``g3-partition --method stream`` on ``comm`` (default COMM_WORLD); the exit status. Every wait of one rank
    for the others has the deadline of ``cfg.comm_timeout`` (adaptive by default: :mod:`g3mpi.mpi.watchdog`,
    from the graph file's share per rank): a rank that stops answering ends the job with one line naming the
    phase, and status :data:`~g3mpi.mpi.watchdog.EXIT_STALLED`."""
    from mpi4py import MPI
    own_world = comm is None
    comm = comm or MPI.COMM_WORLD
    wd = Watchdog(comm, cfg.comm_timeout, prog=PROG, floor=cfg.comm_timeout_floor)
    try:
        wd.expect_input(os.stat(cfg.graph).st_size // comm.size)
    except OSError:
        pass   # (the read names the file)
    try:
        with terminate_as_interrupt():
            run(cfg, wd)
    except RankFailed as e:
        return failed(wd, e.errs, own_world)
    except FormatError as e:   # the same on every rank (a check of values every rank has)
        return failed(wd, [str(e)] * comm.size, own_world)
    except KeyboardInterrupt as e:
        error(comm, f"{cfg.out}: {interruption(e)} (no output written)")
        comm.Abort(getattr(e, "exit_status", 130))
    except Exception:  # noqa: BLE001 - a bug on one rank: end the job, not leave the others waiting
        error(comm, f"unexpected failure:\n{traceback.format_exc()}")
        comm.Abort(1)
    return 0
