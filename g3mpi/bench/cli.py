"""g3-bench: reproducible benchmarks of g3mpi, side by side with their baselines, as JSON and PNG.

    g3-bench SUITE [--nodes N] [--edges E] [--dims 128,256,40] [--epochs K] [--threads T] [--ranks P] [--smoke]
        --out DIR
    python -m g3mpi.bench.cli SUITE ... --out DIR

Suites (each writes DIR/<suite>.json and DIR/<suite>*.png):
  vs-pyg     one rank against PyTorch Geometric (edge_index and CSR adj_t), GCN / SAGE / GAT, epoch-time ratios
  kernels    one rank's epoch time against the sum of its isolated kernels (SpMM forward/backward, GEMMs, ...)
  bytes      bytes on the wire per epoch against the partition's lower bound and two naive designs, measured
  schedules  pipelined vs blocking vs nocomm under a simulated network (several --ranks and --sim-net in one run)
  scaling    1 rank x 2 threads vs 2 ranks x 1 thread (real) and 1 -> 8 ranks oversubscribed (informational)
  memory     peak RSS per rank against the theoretical size of its data; bytes per owned row, halo row, send row
             and local edge measured against the memory model (GCN, SAGE, GAT, APPNP, GCNII, a user's model; R-GCN on a
             typed graph: --graph rmat --relations R; learned node embeddings: --node-embedding D)
  partitions measured epoch time on the g3 partition vs each METIS partition of one graph, under --sim-net
  user-model a GCN written from the public primitives (docs/examples/user_gcn.py) vs the built-in GCN, pipelined
  precision  fp32 vs --precision bf16-mixed vs 16-bit --halo-dtype: epoch time, bytes, peak RSS, final accuracy
  all        every suite in turn

Multi-rank suites start ``mpiexec -n P python -m mpi4py -m g3mpi.bench.worker`` themselves (the mpiexec beside
this Python). Started on P ranks (jobs/slurm/bench.sbatch), g3-bench runs them on its own ranks instead (their
rank count must then be P; scaling needs the one-process mode). Graphs and partitions are generated with
g3-prepare / g3-partition into DIR/work (or --work) and reused by later runs with the same sizes.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from g3mpi.nn import specs
from g3mpi.options import Parser, from_options

from .common import SYSTEMS, USER, USER_REFERENCE, Sizes

PROG = "g3-bench"
SUITES = ("vs-pyg", "kernels", "bytes", "schedules", "scaling", "memory", "partitions", "user-model", "precision")

#: defaults per suite: (nodes, edges, dims, epochs, graph generator); the acceptance sizes of the issue
DEFAULTS = {
    "vs-pyg": (200_000, 4_000_000, "128,256,40", 5, "random"),
    "kernels": (200_000, 4_000_000, "128,256,40", 5, "random"),
    "bytes": (100_000, 2_000_000, "128,256,40", 2, "sbm"),
    "schedules": (65_536, 2_097_152, "64,128,128,16", 5, "rmat"),
    "scaling": (200_000, 4_000_000, "128,256,40", 5, "sbm"),
    "memory": (200_000, 4_000_000, "128,256,40", 3, "sbm"),
    "partitions": (65_536, 2_097_152, "64,128,128,16", 5, "rmat"),
    "user-model": (65_536, 1_048_576, "64,128,128,16", 5, "rmat"),
    "precision": (200_000, 4_000_000, "128,256,40", 5, "sbm"),
}
SMOKE = {
    "vs-pyg": (1500, 12_000, "16,32,4", 2, "random"),
    "kernels": (1500, 12_000, "16,32,4", 2, "random"),
    "bytes": (1500, 12_000, "16,32,4", 1, "sbm"),
    "schedules": (1024, 12_000, "16,32,32,4", 2, "rmat"),
    "scaling": (1500, 12_000, "16,32,4", 1, "sbm"),
    "memory": (1500, 12_000, "16,32,4", 1, "sbm"),
    "partitions": (1024, 12_000, "16,32,32,4", 1, "rmat"),
    "user-model": (1024, 12_000, "16,32,32,4", 1, "rmat"),
    "precision": (1500, 12_000, "16,32,4", 2, "sbm"),
}
MODELS = {"vs-pyg": "gcn,sage,gat", "kernels": "gcn,sage", "bytes": "gcn,sage", "schedules": "gcn,gat",
          "scaling": "gcn", "memory": "gcn,sage,gat,user", "partitions": "gcn", "user-model": "gcn",
          "precision": "gcn,sage,gat"}
RANKS = {"bytes": 4, "schedules": 4, "memory": 2, "partitions": 4, "user-model": 2, "precision": 1}


@dataclass(frozen=True)
class BenchConfig:
    """One g3-bench run. ValueError on options that do not go together for a suite to run (exit 2 from
    :func:`parse_args`). The parser leaves an option not given as None: the defaults are here, and where a field
    is None, the suite's own (DEFAULTS or SMOKE, MODELS, RANKS)."""

    # what to run, and where
    suite: str                          # one of SUITES, or "all"
    out: Path                           # output directory (DIR/<suite>.json and plots)
    work: Path | None = None            # generated graphs and partitions (None: OUT/work)
    # graph and model sizes (None: the suite's)
    nodes: int | None = None
    edges: int | None = None
    dims: tuple | None = None           # in, hidden..., out
    epochs: int | None = None           # measured epochs per system (a warm-up epoch comes first)
    gat_epochs: int | None = None       # of GAT in vs-pyg (None: epochs)
    threads: int | None = None          # torch threads per rank (None: 1; scaling: 2)
    heads: int = 8                      # GAT heads of hidden layers (they must divide the hidden width)
    models: tuple | None = None
    graph: str | None = None            # generator of the multi-rank suites: sbm | rmat
    relations: int = 0                  # memory: the graph typed, R relations (rmat only; R-GCN needs them)
    node_embedding: int = 0             # memory: the models learn a D-wide node embedding table (0: none)
    # how the suites measure
    ranks: tuple | None = None          # of the multi-rank suites (None: RANKS; smoke: 2); several: schedules only
    sim_net: tuple = ("10Gbit,20us",)   # schedules, partitions: simulated networks BANDWIDTH,LATENCY (several:
                                        # schedules only)
    bind_to: str = "none"               # schedules: mpiexec -bind-to (core: one rank per core)
    balance: str | None = None          # schedules: METIS vertex weights (None: edges)
    repeats: int = 2                    # scaling, partitions: alternating launches per configuration (smoke: 1)
    max_ranks: int = 8                  # scaling: largest oversubscribed rank count (smoke: 2)
    systems: tuple = SYSTEMS            # vs-pyg: the systems compared
    smoke: bool = False                 # tiny sizes: checks that a suite runs, measures nothing
    plots: bool = True

    def __post_init__(self):
        for suite in self.suites():
            models = self.models_for(suite)
            built_in = [specs.MODELS[m] for m in models if m in specs.MODELS]
            if suite == "kernels" and any(sp.aggregation not in ("gcn", "mean") or sp.form != "stack"
                                          or sp.attention for sp in built_in):
                raise ValueError(f"kernels: --models {','.join(models)}: the kernels suite times GCN and SAGE only")
            dims = self.sizes_for(suite).dims
            if any(sp.attention for sp in built_in) and len(dims) > 2 and dims[1] % self.heads:
                raise ValueError(f"{suite}: --heads {self.heads} must divide the hidden width {dims[1]} of GAT "
                                 f"(hidden width = heads x channels)")
            if suite != "schedules" and len(self.ranks or ()) > 1:
                raise ValueError(f"{suite}: --ranks {','.join(map(str, self.ranks))}: several rank counts are for "
                                 f"the schedules suite only")
            if USER in models and suite != "memory":
                raise ValueError(f"{suite}: --models {','.join(models)}: model user is the memory suite's (the "
                                 f"user-model suite measures it against gcn)")
            if (self.relations or self.node_embedding) and suite != "memory":
                raise ValueError(f"{suite}: --relations and --node-embedding are the memory suite's")
            if self.relations and self.sizes_for(suite).graph != "rmat":
                raise ValueError(f"{suite}: --relations {self.relations}: a typed graph is generated by rmat "
                                 f"(--graph rmat)")
            if any(sp.edge_types for sp in built_in) and not self.relations:
                raise ValueError(f"{suite}: --models {','.join(models)}: R-GCN needs a typed graph (--graph rmat "
                                 f"--relations R)")
            if suite == "user-model" and models != (USER_REFERENCE,):
                raise ValueError(f"user-model: --models {','.join(models)}: it measures the user GCN against gcn")
            if suite in ("partitions", "user-model") and len(self.sim_net) > 1:
                raise ValueError(f"{suite}: --sim-net given {len(self.sim_net)} times: it takes one network")
            if suite == "scaling" and self.threads is not None and self.threads < 2:
                raise ValueError(f"scaling: --threads {self.threads}: it compares 1 rank x T threads with T ranks "
                                 f"x 1 thread, so T must be at least 2")

    def suites(self) -> tuple:
        return SUITES if self.suite == "all" else (self.suite,)

    def models_for(self, suite: str) -> tuple:
        return self.models or tuple(MODELS[suite].split(","))

    def ranks_for(self, suite: str) -> int | None:
        """The rank count of a suite that runs one (the first of ``ranks``)."""
        return self.all_ranks_for(suite)[0]

    def all_ranks_for(self, suite: str) -> tuple:
        """Every rank count of ``suite`` (schedules: all of ``ranks``)."""
        return self.ranks if self.ranks is not None else (2 if self.smoke else RANKS.get(suite),)

    def sizes_for(self, suite: str) -> Sizes:
        n, e, dims, ep, gen = (SMOKE if self.smoke else DEFAULTS)[suite]
        default = lambda v, d: d if v is None else v  # noqa: E731 - 0 is a value, not "not given"
        threads = default(self.threads, 2 if suite == "scaling" else 1)
        return Sizes(nodes=default(self.nodes, n), edges=default(self.edges, e),
                     dims=default(self.dims, parse_dims(dims)), epochs=default(self.epochs, ep), threads=threads,
                     heads=self.heads, graph=gen if gen == "random" else (self.graph or gen),
                     relations=self.relations)


class _Parser(Parser):
    """One error line, the same on every rank (each parses the same options before any communication)."""


def _int(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v}: must be at least {lo}")
        return v
    parse.__name__ = f"integer >= {lo}"
    return parse


def parse_dims(text: str) -> tuple:
    """'128,256,40' -> (128, 256, 40): an input and an output width at least, hidden widths all equal."""
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers such as 128,256,40") \
            from None
    if len(dims) < 2 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: at least an input and an output width, all >= 1")
    if len(dims) > 3 and len(set(dims[1:-1])) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: hidden layers must all have the same width")
    return dims


def _models(text: str) -> tuple:
    KNOWN = specs.names()     # the models' one home
    models = tuple(m for m in text.split(",") if m)
    bad = [m for m in models if m not in KNOWN + (USER,)]
    if not models or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated {', '.join(KNOWN)} (memory: also user)")
    return models


def _ranks(text: str) -> tuple:
    """'2' or '2,4': rank counts, each at least 1."""
    parse = _int(1)
    return tuple(parse(t) for t in text.split(","))


def _sim_net(text: str) -> str:
    from g3mpi.comm.simnet import parse_sim_net
    if text.lower() == "none":      # the real transport only: nothing to hide on one machine
        return ""
    try:
        parse_sim_net(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--sim-net {text!r}: ")) from None
    return text


def _systems(text: str) -> tuple:
    from .common import check_systems
    try:
        return check_systems(s for s in text.split(",") if s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--systems ")) from None


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    ap.add_argument("suite", choices=SUITES + ("all",))
    ap.add_argument("--out", required=True, type=Path, help="output directory (created)")
    ap.add_argument("--work", type=Path, help="directory of generated graphs and partitions (default OUT/work)")
    ap.add_argument("--nodes", type=_int(2), help="graph nodes (default per suite; vs-pyg: 200000)")
    ap.add_argument("--edges", type=_int(1), help="directed edges (default per suite; vs-pyg: 4000000)")
    ap.add_argument("--dims", type=parse_dims,
                    help="layer widths in,hidden...,out (default per suite; vs-pyg: 128,256,40)")
    ap.add_argument("--epochs", type=_int(1), help="measured epochs per system (a warm-up epoch comes first)")
    ap.add_argument("--gat-epochs", type=_int(1), help="measured epochs of GAT in vs-pyg (default: --epochs)")
    ap.add_argument("--threads", type=_int(1),
                    help="torch threads per rank (default 1); scaling: T of 1 rank x T threads against T ranks x "
                         "1 thread (default 2, at least 2)")
    ap.add_argument("--ranks", type=_ranks,
                    help="ranks of bytes (4), schedules (4), memory (2), partitions (4); --smoke: 2; schedules: "
                         "several, comma-separated (e.g. 2,4)")
    ap.add_argument("--models", type=_models,
                    help=f"comma-separated built-in models: {', '.join(specs.names())} (default per suite; "
                         "kernels: gcn and sage only; memory: also user, a model written with the public layer "
                         "API)")
    ap.add_argument("--heads", type=_int(1),
                    help="GAT heads of hidden layers (hidden width = heads x channels: they must divide it)")
    ap.add_argument("--graph", choices=("sbm", "rmat"), help="generator of the multi-rank suites")
    ap.add_argument("--relations", type=_int(1),
                    help="memory: the graph typed with R relations, one drawn per edge (--graph rmat; needed by "
                         "rgcn)")
    ap.add_argument("--node-embedding", type=_int(1), metavar="D",
                    help="memory: every model learns a D-wide node embedding table beside the features (as "
                         "g3-train --node-embedding)")
    ap.add_argument("--sim-net", type=_sim_net, action="append",
                    help="schedules, partitions, precision: simulated network BANDWIDTH,LATENCY, or none (default "
                         "10Gbit,20us); schedules: repeat it to measure several networks in one run")
    ap.add_argument("--bind-to", choices=("none", "core"),
                    help="schedules: mpiexec -bind-to (core: each rank on its own core while ranks <= cores; "
                         "default none)")
    ap.add_argument("--balance", choices=("nodes", "edges", "both", "train"),
                    help="schedules: METIS vertex weights of the partition (default edges)")
    ap.add_argument("--repeats", type=_int(1),
                    help="scaling, partitions: alternating launches per configuration (--smoke: 1)")
    ap.add_argument("--max-ranks", type=_int(1),
                    help="scaling: largest oversubscribed rank count (--smoke: 2)")
    ap.add_argument("--systems", type=_systems,
                    help="vs-pyg: systems compared (g3mpi and pyg-csr always; pyg-edge_index needs several GiB "
                         "at the default size)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: checks that a suite runs, measures nothing")
    ap.add_argument("--no-plots", action="store_true")
    return ap


def parse_args(argv) -> BenchConfig:
    """The options as a BenchConfig, checked alone and together for every suite to run (exit 2 with one line
    otherwise)."""
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        if a.sim_net is not None:
            a.sim_net = tuple(a.sim_net)
        return from_options(BenchConfig, a, plots=not a.no_plots)
    except ValueError as e:
        ap.error(str(e))


def run_suite(suite: str, cfg: BenchConfig, argv) -> dict:
    from . import common
    sz = cfg.sizes_for(suite)
    models = cfg.models_for(suite)
    work = cfg.work or cfg.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    ranks = cfg.ranks_for(suite)
    t0 = time.time()
    if suite == "vs-pyg":
        from .pyg import run
        res = common.on_root(lambda: run(sz, models=models, gat_epochs=cfg.gat_epochs, systems=cfg.systems))
    elif suite == "kernels":
        from .kernels import run
        res = common.on_root(lambda: run(sz, models=models))
    elif suite == "bytes":
        from .wire import run
        res = run(sz, work, ranks=ranks, models=models)
    elif suite == "schedules":
        from .overlap import run
        res = run(sz, work, ranks=cfg.all_ranks_for(suite), sim_nets=cfg.sim_net, models=models,
                  balance=cfg.balance or "edges", bind_to=cfg.bind_to)
    elif suite == "scaling":
        from .scaling import run
        over = tuple(p for p in (1, 2, 4, 8, 16, 32) if p <= (2 if cfg.smoke else cfg.max_ranks))
        res = run(sz, work, model=models[0], repeats=1 if cfg.smoke else cfg.repeats, oversub=over)
    elif suite == "partitions":
        from .partitions import run
        res = run(sz, work, ranks=ranks, sim_net=cfg.sim_net[0], model=models[0],
                  repeats=1 if cfg.smoke else cfg.repeats)
    elif suite == "precision":
        from .precision import run
        res = common.on_root(lambda: run(sz, work, ranks=ranks, models=models,
                                         sim_net=cfg.sim_net[0] if cfg.sim_net else "",
                                         repeats=1 if cfg.smoke else cfg.repeats))
    elif suite == "user-model":
        from .usermodel import run
        res = run(sz, work, ranks=ranks, sim_net=cfg.sim_net[0] if cfg.sim_net else "")
    else:
        from .memory import run
        res = run(sz, work, ranks=ranks, models=models, node_embedding=cfg.node_embedding)
    doc = dict(suite=suite, command="g3-bench " + " ".join(argv), sizes=sz.as_dict(), models=list(models),
               smoke=cfg.smoke, machine=common.machine_info(), elapsed_s=round(time.time() - t0, 1),
               result=res, plots=[])

    def output():
        from .plots import PLOTS
        if cfg.plots and suite in PLOTS:   # (precision: a table, no plot)
            doc["plots"] = [Path(f).name for f in PLOTS[suite](res, cfg.out)]
        common.write_json(cfg.out / f"{suite}.json", doc)
        common.progress(f"{suite}: wrote {cfg.out / (suite + '.json')}" +
                        (f" and {', '.join(doc['plots'])}" if doc["plots"] else ""))
    common.on_root(output)   # a failure on rank 0 reaches every rank (the next suite would wait for it)
    return doc


def fail(comm, e: BaseException) -> int:
    """Report the error ``e`` of this rank and return the exit status 1; on several ranks end every rank: those
    that all raised it (``every_rank``) together, one rank's own error with an abort of the job (the others may
    wait for it in a collective)."""
    from g3mpi.mpi.abort import abort_job, wait_stderr_read, write_line

    from .common import BenchError
    msg = str(e) if isinstance(e, (BenchError, ValueError, OSError)) else \
        f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    line = f"{PROG}: error: [rank {comm.rank}] {msg}"
    if comm.size == 1:
        write_line(line)
    elif getattr(e, "every_rank", False):
        write_line(line)
        wait_stderr_read()
        comm.Barrier()   # every rank's line is out before any exits (under python -m mpi4py the first exit aborts)
    else:
        abort_job(comm, line)
    return 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(argv)   # bad options: exit 2 on every rank, before any communication
    from .common import on_root, world
    comm = world()
    try:
        if cfg.out.exists() and not cfg.out.is_dir():
            raise ValueError(f"{cfg.out}: exists and is not a directory")
        on_root(lambda: cfg.out.mkdir(parents=True, exist_ok=True))
        for suite in cfg.suites():
            run_suite(suite, cfg, argv)
    except Exception as e:  # noqa: BLE001 - one failing rank must not leave the others waiting
        return fail(comm, e)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
