"""Shared pieces of the benchmark suites: sizes, graphs and partitions on disk, launching MPI workers, JSON.

Multi-rank suites run ``g3mpi.bench.worker`` on P ranks. When ``g3-bench`` runs as one process (the usual case
on a workstation) the worker is started as ``mpiexec -n P python -m mpi4py -m g3mpi.bench.worker`` with the
mpiexec beside ``sys.executable``; when ``g3-bench`` itself was started on P ranks (``jobs/slurm/bench.sbatch``),
a suite that needs exactly P ranks runs the worker in-process on the world communicator instead.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from g3mpi.nn import specs

# the results' own module, which the worker imports too (this one launches the worker); re-exported for the suites
from .results import BenchError, gather_json, to_json, write_json  # noqa: F401


#: the memory suite's model ``user``: a GCN of the public primitives (``g3mpi.bench.memory.USER_MODEL``); the
#: built-in model that the user-model suite measures it against
USER, USER_REFERENCE = "user", "gcn"
#: the systems of the vs-pyg suite by default (g3mpi and pyg-csr always run)
SYSTEMS = ("g3mpi", "g3mpi-nocache", "pyg-csr", "pyg-edge_index")
#: every system it knows: the default ones and g3mpi under --precision bf16-mixed
KNOWN_SYSTEMS = SYSTEMS[:2] + ("g3mpi-bf16",) + SYSTEMS[2:]


def check_systems(systems) -> tuple:
    """The vs-pyg systems to compare, g3mpi first; ValueError unless they include g3mpi and pyg-csr and are all
    known."""
    systems = tuple(systems)
    if "g3mpi" not in systems or "pyg-csr" not in systems or not set(systems) <= set(KNOWN_SYSTEMS):
        raise ValueError(f"--systems {','.join(systems)!r}: must include g3mpi and pyg-csr "
                         f"(choose from {', '.join(KNOWN_SYSTEMS)})")
    return ("g3mpi",) + tuple(dict.fromkeys(s for s in systems if s != "g3mpi"))


@dataclass(frozen=True)
class Sizes:
    """Graph and model sizes of one suite run (command-line options --nodes, --edges, --dims, --epochs, ...)."""

    nodes: int
    edges: int
    dims: tuple            # in, hidden..., out (hidden layers all the same width)
    epochs: int            # measured epochs (a warm-up epoch comes first and is excluded)
    threads: int = 1
    heads: int = 8         # GAT heads in hidden layers (hidden width = heads * channels)
    graph: str = "sbm"     # generator: sbm | rmat (multi-rank suites), random (vs-pyg, kernels)
    relations: int = 0     # rmat: a typed graph of R relations (0: untyped)

    @property
    def layers(self) -> int:
        return len(self.dims) - 1

    def as_dict(self) -> dict:
        d = asdict(self)
        d["dims"] = list(self.dims)
        return d


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def machine_info() -> dict:
    import platform

    import torch
    load = os.getloadavg() if hasattr(os, "getloadavg") else (None, None, None)
    return dict(host=platform.node(), cpus=os.cpu_count(), python=platform.python_version(), torch=torch.__version__,
                load_avg_1m=load[0], time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


# -- graphs and partitions on disk ------------------------------------------------------------------------------
def _tool(module: str, *args) -> None:
    cmd = [sys.executable, "-m", module, *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    if p.returncode != 0:
        raise BenchError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr.strip()[-2000:]}")


def on_root(fn, *args):
    """Run ``fn`` on rank 0 only (every rank of a multi-rank g3-bench waits and gets its result or error). The
    result reaches every rank, rank 0 included, as it reads back from JSON (:func:`to_json`: paths as strings,
    tuples as lists), whatever the number of ranks.

    An error of ``fn`` is raised on every rank as a :class:`BenchError` with ``every_rank`` set: all ranks know
    of it, so they can end together without an abort."""
    comm = world()
    text = None
    if comm.rank == 0:
        try:
            text = to_json([fn(*args), None])
        except (BenchError, ValueError, OSError) as e:
            text = to_json([None, str(e)])
        except Exception as e:  # noqa: BLE001 - reported on every rank
            text = to_json([None, f"{type(e).__name__}: {e}"])
    if comm.size > 1:
        from g3mpi.mpi.watchdog import Watchdog
        text = Watchdog(comm, 0).bcast_text(text, 0, "g3-bench: rank 0's result")
    res, err = json.loads(text)
    if err:
        e = BenchError(err if comm.rank == 0 else f"stopping: rank 0 failed: {err}")
        e.every_rank = True
        raise e
    return res


def prepare_graph(sz: Sizes, work: Path, seed: int = 0) -> Path:
    return Path(on_root(_prepare_graph, sz, work, seed))


def prepare_parts(graph: Path, P: int, work: Path, method: str = "metis", balance: str = "nodes",
                  start: str = "auto") -> Path:
    return Path(on_root(_prepare_parts, graph, P, work, method, balance, start))


def _prepare_graph(sz: Sizes, work: Path, seed: int = 0) -> Path:
    """graph.h5 for the multi-rank suites, generated with g3-prepare (cached in ``work`` by its parameters).

    sbm: ``--avg-degree edges/nodes`` (both directions stored, so about ``edges`` directed edges), classes =
    output width; rmat: ``--scale log2(nodes)`` (rounded), ``--edge-factor edges/nodes``, symmetrized, self loops
    dropped; ``relations`` R: one of R relations drawn per edge."""
    f, c = sz.dims[0], sz.dims[-1]
    if sz.relations and sz.graph != "rmat":
        raise BenchError(f"a typed graph ({sz.relations} relations) is generated by rmat, not {sz.graph}")
    if sz.graph == "sbm":
        name = f"sbm-n{sz.nodes}-e{sz.edges}-f{f}-c{c}-s{seed}.h5"
        args = ["sbm", "--nodes", sz.nodes, "--classes", c, "--feature-dim", f,
                "--avg-degree", f"{sz.edges / sz.nodes:g}", "--seed", seed]
    elif sz.graph == "rmat":
        scale = max(1, round(math.log2(sz.nodes)))
        ef = max(1, round(sz.edges / sz.nodes / 2))
        typed = f"-r{sz.relations}" if sz.relations else ""
        name = f"rmat-s{scale}-ef{ef}-f{f}-c{c}{typed}-s{seed}.h5"
        args = ["rmat", "--scale", scale, "--edge-factor", ef, "--feature-dim", f, "--classes", c,
                "--symmetrize", "--self-loops", "drop", "--seed", seed,
                *(("--relations", sz.relations) if sz.relations else ())]
    else:
        raise BenchError(f"unknown graph generator {sz.graph!r} (sbm, rmat)")
    out = work / name
    if not out.exists():
        work.mkdir(parents=True, exist_ok=True)
        _tool("data_tools.prepare", *args, "--quiet", "--out", out)
    return out


def _prepare_parts(graph: Path, P: int, work: Path, method: str = "metis", balance: str = "nodes",
                   start: str = "auto") -> Path:
    """Partition directory of ``graph`` into P parts with g3-partition (cached); ``balance``: METIS weights
    (``--balance``, metis only: g3-partition refuses it with another method); ``start``: g3's METIS start
    (``--start``)."""
    out = work / (f"{graph.stem}.{method}{P}" + ("" if balance == "nodes" else f".{balance}")
                  + ("" if start == "auto" else f".{start}"))
    if not (out / "meta.json").exists():
        _tool("data_tools.partition", graph, "--parts", P, "--method", method,
              *(("--balance", balance) if method == "metis" else ()),
              *(("--start", start) if start != "auto" else ()), "--no-progress", "--force", "--out", out)
    return out


# -- launching MPI workers --------------------------------------------------------------------------------------
_LAUNCHER_VARS = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "I_MPI_", "SLURM_STEP", "MPICH_INTERFACE")


def child_env(threads: int | None = None) -> dict:
    """Environment of a child process: this repository on PYTHONPATH, no launcher variables of our own
    process (so a child ``mpiexec`` starts a fresh world), the thread count pinned.

    Inside a single-node SLURM allocation the child ``mpiexec`` (MPICH's Hydra) would start its proxy through
    ``srun`` (Hydra's slurm launcher), and that step waits for CPUs that our own step holds (``bench.sbatch`` runs
    g3-bench as one task), until the time limit. There the child starts its ranks by fork on this node instead
    (``HYDRA_LAUNCHER=fork``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_VARS)}
    if env.get("SLURM_JOB_ID") and env.get("SLURM_JOB_NUM_NODES", env.get("SLURM_NNODES", "1")) == "1":
        env["HYDRA_LAUNCHER"] = "fork"
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def mpiexec() -> str:
    cand = Path(sys.executable).parent / "mpiexec"
    found = str(cand) if cand.exists() else shutil.which("mpiexec")
    if not found:
        raise BenchError("no mpiexec beside the Python interpreter or on PATH")
    return found


def world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


def run_worker(P: int, args: list, out_json: Path, threads: int = 1, timeout: float = 3600,
               bind_to: str = "none") -> dict:
    """Run ``g3mpi.bench.worker`` on P ranks; return the JSON its rank 0 wrote to ``out_json``.

    One process: a child ``mpiexec -n P`` (``--oversubscribe`` is not needed with MPICH), with ``-bind-to
    BIND_TO`` unless ``none``. Already on exactly P ranks: in-process on the world communicator (every rank must
    call this; the launcher placed the ranks)."""
    from . import worker
    args = [*map(str, args), "--threads", str(threads), "--json", str(out_json)]
    comm = world()
    if comm.size > 1:
        if comm.size != P:
            raise BenchError(f"this measurement needs {P} ranks but g3-bench runs on {comm.size}: start g3-bench "
                             f"as one process (it launches mpiexec itself) or on {P} ranks")
        rc = worker.main(args, comm)
        comm.Barrier()
        if rc != 0:
            raise BenchError(f"worker {' '.join(args)} failed on rank {comm.rank}")
        return json.loads(Path(out_json).read_text())
    bind = [] if bind_to == "none" else ["-bind-to", bind_to]
    cmd = [mpiexec(), "-n", str(P), *bind, sys.executable, "-m", "mpi4py", "-m", "g3mpi.bench.worker", *args]
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(threads), timeout=timeout)
    if p.returncode != 0 or not Path(out_json).exists():
        raise BenchError(f"{' '.join(cmd)} failed (exit {p.returncode}) after {time.time() - t0:.0f}s:\n"
                         f"{p.stderr.strip()[-3000:]}")
    return json.loads(Path(out_json).read_text())


def progress(msg: str) -> None:
    if world().rank == 0:
        print(f"g3-bench: {msg}", file=sys.stderr, flush=True)


def ratio(a, b):
    return (a / b) if (a is not None and b) else None


def nbytes(*arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


def variant_summary(v: dict) -> dict:
    """Medians over epochs of a worker variant: epoch time, bytes, and per rank compute / blocked / idle."""
    eps = v["epochs"]
    P = len(eps[0]["rank_compute_s"]) if eps else 0

    def per_rank(key):
        return [median([e[key][r] for e in eps]) for r in range(P)]
    return dict(epoch_time_median_s=median([e["epoch_time_s"] for e in eps]), rank_epoch_s=per_rank("rank_epoch_s"),
                bytes_sent_per_epoch=median([e["bytes_sent"] for e in eps]),
                rank_compute_s=per_rank("rank_compute_s"), rank_blocked_s=per_rank("rank_blocked_s"),
                rank_idle_s=per_rank("rank_idle_s"), rank_bytes_sent=per_rank("rank_bytes_sent"),
                rank_bytes_recv=per_rank("rank_bytes_recv"), epochs=len(eps))


def worker_model_args(model: str, sz: Sizes) -> list:
    """--model/--hidden/--layers/--heads of the worker for sizes ``sz`` (GAT: hidden width = heads x channels)."""
    hidden = sz.dims[1] if len(sz.dims) > 2 else sz.dims[-1]
    if specs.spec(model).attention:
        hidden = max(1, hidden // sz.heads)
    return ["--model", model, "--hidden", hidden, "--layers", sz.layers, "--heads", sz.heads]
