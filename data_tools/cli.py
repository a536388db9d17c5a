"""The data tools' command lines: every argument parser and ``main`` of ``g3-prepare``, ``g3-partition``,
``g3-inspect`` and ``python -m data_tools.importers.triples`` (a synthetic knowledge graph), apart from the library
code they drive (:mod:`data_tools.prepare`, :mod:`data_tools.partition`, :mod:`data_tools.inspection`,
:mod:`data_tools.importers.triples`), which import no argparse; and the benchmark scripts' parsers
(``python -m data_tools.bench_*``). The three tools' parsers are :class:`g3mpi.options.Parser`: a mistyped option
is one line naming the closest one, exit status 2.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

from g3mpi.format import FormatError, json_text
from g3mpi.format.features import FEATURE_DTYPES
from g3mpi.log import setup_tool_logging
from g3mpi.mpi.deadline import add_timeout_options
from g3mpi.mpi.termination import terminate_as_interrupt
from g3mpi.options import Parser, from_options
from g3mpi.units import parse_bandwidth

from .failures import FAILURES, failure_status
from .importers.common import BLOCK_BYTES_PER_EDGE, PrepareOptions
from .importers.triples import generate_kg
from .inspection import PROG as INSPECT, check_plot_path, inspect_path, plot_report, print_report
from .partition import (AUTO_KAMINPAR_CONTEXT, AUTO_MAX_ITERS, MAX_PARTS, MAX_SEED, MAX_WIDTH, METHOD_OPTIONS,
                        PROG as PARTITION, REFINE_OPTIONS, PartitionConfig, dispatch, launched_comm)
from .partitioners import BALANCES, METHODS, OBJECTIVES, REFINES
from .partitioners.cost import DEFAULT_EDGE_SECONDS
from .partitioners.kaminpar import CONTEXTS
from .prepare import (PROG as PREPARE, SOURCES, EdgelistSource, PrepareConfig, RmatSource, SbmSource,
                      log as prepare_log, prepare)


# g3-prepare

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512M``, ``2G``, ``1.5G`` or ``4096`` (binary units K, M, G, T; a trailing
    ``B`` or ``iB`` is accepted)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in SIZE_UNITS else ""
    try:
        value = float(t[:len(t) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)") from None
    if not value >= 0 or value * SIZE_UNITS[unit] >= 2 ** 63:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 2G)")
    return int(value * SIZE_UNITS[unit])



def fractions(text: str) -> tuple:
    from .linksplit import parse_fractions
    try:
        return parse_fractions(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--link-split ")) from None


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output and graph options (all kinds)")
    g.add_argument("--out", "-o", required=True, type=Path, help="graph.h5 to write")
    g.add_argument("--force", action="store_true", help="replace an existing output")
    g.add_argument("--symmetrize", action="store_true",
                   help="add the reverse of every edge and merge duplicates (undirected graph)")
    g.add_argument("--self-loops", choices=("keep", "drop", "add"),
                   help="keep self loops as given, drop them all, or give every node exactly one "
                        f"(default {PrepareOptions.self_loops})")
    g.add_argument("--dedup", action="store_true", help="merge repeated edges")
    g.add_argument("--normalize-features", action="store_true",
                   help="divide each feature row by its L1 norm (Planetoid / Kipf & Welling)")
    g.add_argument("--train", type=float,
                   help="fraction of labelled nodes for training when the input has no split "
                        f"(default {PrepareOptions.train})")
    g.add_argument("--val", type=float,
                   help=f"fraction for validation when the input has no split (default {PrepareOptions.val}); "
                        "the rest is test")
    g.add_argument("--seed", type=int,
                   help=f"seed of generators and random splits, >= 0 (default {PrepareOptions.seed})")
    g.add_argument("--memory-budget", type=parse_size, metavar="SIZE",
                   help="build the CSR in memory when its estimate fits in SIZE, else out of core in sorts of "
                        f"SIZE / {BLOCK_BYTES_PER_EDGE} B edges (e.g. 512M; default "
                        f"{PrepareOptions.memory_budget >> 20}M)")
    g.add_argument("--feature-dtype", choices=FEATURE_DTYPES,
                   help="dtype graph.h5 stores the features in, kept by g3-partition and widened to float32 by "
                        "g3-train (default: the input's: float16 stays float16, anything else float32)")
    g.add_argument("--allow-underflow", action="store_true", default=None,
                   help="with a 16-bit --feature-dtype, store non-zero features too small for it as zero (default: "
                        "refused, naming how many)")
    g.add_argument("--link-split", type=fractions, metavar="TRAIN,VAL,TEST",
                   help="a random link split of the edges (e.g. 0.85,0.05,0.1): val and test pairs leave the graph, "
                        "both directions of an undirected edge together (docs/LINKS.md)")
    g.add_argument("--split-seed", type=int, help=f"seed of --link-split (default {PrepareOptions.split_seed})")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bars and no summary line on stderr (the JSON summary on stdout stays)")


def prepare_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PREPARE,
                description="Import or generate a graph into one graph.h5 (see docs/PREPARE.md).")
    sub = ap.add_subparsers(dest="kind", required=True, metavar="KIND")
    for add in (_add_npz, _add_ogb, _add_edgelist, _add_sbm, _add_rmat, _add_triples):
        _common(add(sub))
    return ap


def _add_npz(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("npz", help="NumPy archive: edge_index, x, y, train/val/test_mask (e.g. cora.npz)")
    p.add_argument("input", type=Path)
    p.add_argument("--num-classes", type=int, help="number of classes (default: max label + 1)")
    return p


def _add_ogb(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("ogb", help="OGB node- or link-property dataset directory (raw/*.csv.gz, split/<scheme>/)")
    p.add_argument("input", type=Path, help="the dataset directory (containing raw/ and split/)")
    p.add_argument("--split", help="split scheme under split/ (default: the only / first one)")
    p.add_argument("--num-classes", type=int, help="number of classes (default: max label + 1)")
    return p


def _add_edgelist(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("edgelist", help="text edge list: 'source target [ignored columns]' per line")
    p.add_argument("input", type=Path, help="CSV / TSV / whitespace-separated edge list (.gz accepted)")
    p.add_argument("--delimiter",
                   help="',', ';', '|', 'tab', 'space' (any whitespace) or 'auto' (the first of , tab ; | in the "
                        "first data line, else whitespace)")
    hdr = p.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None,
                     help="the first non-comment line is a header")
    hdr.add_argument("--no-header", dest="header", action="store_false",
                     help="no header (default: detected: a first line whose IDs are not integers)")
    p.add_argument("--features", type=Path, help=".npy float [R, F]: one row per node")
    p.add_argument("--labels", type=Path, help=".npy int [R]: class per node, -1 = unlabelled; or [R, C] of 0/1 "
                                               "per class (multi-label; -1 or NaN unknown)")
    p.add_argument("--masks", type=Path,
                   help=".npz with train_mask, val_mask, test_mask bool [R] (default: random split)")
    p.add_argument("--node-ids", type=Path,
                   help=".npy int [R]: the edge-list ID of each features/labels row (default: row = ID)")
    p.add_argument("--feature-dim", type=int,
                   help="without --features: this many seeded random N(0,1) features per node "
                        f"(default {EdgelistSource.feature_dim})")
    p.add_argument("--num-classes", type=int, help="number of classes (default: max label + 1)")
    return p


def _add_triples(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("triples", help="knowledge graph: train.txt, valid.txt, test.txt of head<TAB>relation<TAB>tail")
    p.add_argument("input", type=Path, help="the directory holding the three files (.gz accepted)")
    p.add_argument("--add-inverse", action="store_true",
                   help="add relation NAME_inverse for each relation, with the reversed training triples")
    return p


def _add_sbm(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sbm", help="synthetic planted-partition graph with class-correlated features")
    p.add_argument("--nodes", type=int, help=f"number of nodes (default {SbmSource.nodes})")
    p.add_argument("--classes", type=int, help=f"number of classes, balanced at random (default {SbmSource.classes})")
    p.add_argument("--feature-dim", type=int, help=f"features per node (default {SbmSource.feature_dim})")
    p.add_argument("--avg-degree", type=float, help="average degree (default 10)")
    p.add_argument("--homophily", type=float,
                   help=f"fraction of edges inside a class (default {SbmSource.homophily})")
    p.add_argument("--p-in", type=float, help="intra-class edge probability (with --p-out)")
    p.add_argument("--p-out", type=float, help="inter-class edge probability (with --p-in)")
    p.add_argument("--noise", type=float,
                   help="std of each feature's Gaussian noise; class centres have unit norm "
                        f"(default {SbmSource.noise})")
    return p


def _add_rmat(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("rmat", help="synthetic Graph500-style R-MAT graph (a,b,c,d = .57,.19,.19,.05)")
    p.add_argument("--scale", type=int, required=True, help="2**scale nodes")
    p.add_argument("--edge-factor", type=int, help=f"edges per node (default {RmatSource.edge_factor})")
    p.add_argument("--feature-dim", type=int, help=f"features per node (default {RmatSource.feature_dim})")
    p.add_argument("--classes", type=int,
                   help=f"number of classes, uniform random labels (default {RmatSource.classes})")
    p.add_argument("--noise", type=float,
                   help="std of each feature's Gaussian noise; class centres have unit norm "
                        f"(default {RmatSource.noise:g})")
    p.add_argument("--relations", type=int,
                   help="give each edge a uniform random relation in [0, R): a typed graph (default 0: untyped)")
    return p


def config_from(args: argparse.Namespace) -> PrepareConfig:
    """The parsed command line as a PrepareConfig: options not given (None) take the dataclasses' defaults."""
    return PrepareConfig(source=from_options(SOURCES[args.kind], args), out=args.out,
                         options=from_options(PrepareOptions, args))



def prepare_main(argv=None) -> int:
    args = prepare_parser().parse_args(argv)
    split_options = tuple(f"--{k}" for k in ("train", "val") if getattr(args, k) is not None)
    try:
        cfg = config_from(args)
    except ValueError as e:
        print(f"{PREPARE}: error: {e}", file=sys.stderr)
        return 2
    setup_tool_logging(PREPARE, logging.WARNING if cfg.options.quiet else logging.INFO)
    try:
        with terminate_as_interrupt():
            summary = prepare(cfg, split_options)
    except FAILURES as e:    # (argv None: the command itself; in-process callers get the status)
        return failure_status(PREPARE, e, out=cfg.out, out_of_memory=f"{cfg.out}: out of memory while building the "
                              "graph", command=argv is None)
    except ValueError as e:
        print(f"{PREPARE}: error: {e}", file=sys.stderr)
        return 2
    if summary["train"] == 0 and not summary.get("links"):
        print(f"{PREPARE}: warning: {cfg.out}: no training nodes (no labels, or an empty train split): "
              f"g3-train will refuse this graph", file=sys.stderr)
    if not cfg.options.quiet:
        prepare_log.info("wrote %s: %d nodes, %d edges, %d features, %d classes, split %d/%d/%d (%.1f s)",
                         summary["out"], summary["num_nodes"], summary["num_edges"], summary["feature_dim"],
                         summary["num_classes"], summary["train"], summary["val"], summary["test"], summary["seconds"])
    try:
        print(json_text(summary, indent=None, sort_keys=False), flush=True)
    except BrokenPipeError:                # `g3-prepare ... | head -0`: graph.h5 is complete, the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
    return 0



# g3-partition

def partition_parser() -> argparse.ArgumentParser:
    """g3-partition's options (their values are checked by :func:`partition_args`)."""
    ap = Parser(prog=PARTITION, description="Partition a graph.h5 into P parts (see docs/PARTITION.md).")
    ap.add_argument("graph", type=Path, help="input graph.h5 (from g3-prepare)")
    ap.add_argument("--parts", "-p", type=int, required=True, help=f"number of parts, 1..min(N, {MAX_PARTS})")
    ap.add_argument("--method", choices=METHODS, default="auto",
                    help="auto (default): kaminpar + g3 refinement where the graph fits this machine's memory, else "
                         "stream (docs/PARTITION_METHODS.md)")
    ap.add_argument("--out", "-o", type=Path, required=True, help="output partition directory")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of METIS / the permutation / g3 tie-breaking, 0 .. 2**63-1 (METIS's 64-bit integer; "
                         "numpy's generators need it >= 0)")
    ap.add_argument("--force", action="store_true",
                    help="replace an earlier partition (a directory with meta.json) or an empty directory at --out")
    ap.add_argument("--balance", choices=BALANCES,
                    help="METIS vertex weights (metis only, default nodes): unit, in-degree + 1, both (two "
                         "constraints: nodes and local edges, each within the tighter of --node-imbalance and "
                         "--edge-imbalance), mixed (one weight: mean in-degree + in-degree) or train; g3 balances "
                         "nodes and edges itself")
    ap.add_argument("--objective", choices=OBJECTIVES,
                    help="what METIS minimises: the edge cut, or the total communication volume (k-way; metis only, "
                         "default cut)")
    ap.add_argument("--stream-order", choices=("degree", "natural", "random"),
                    help="order in which each rank streams its rows: most neighbours first, row order, or seeded "
                         "random (stream only; default degree)")
    ap.add_argument("--kaminpar-context", choices=CONTEXTS,
                    help="KaMinPar's configuration: fast, default, strong (fewer cut edges, slower) or terapart "
                         "(compressed graph, nodes balanced; kaminpar and auto only; default default)")
    ap.add_argument("--threads", type=int,
                    help="threads of KaMinPar and of the writer's part builds, >= 1 (kaminpar and auto; default, and "
                         "the other serial methods' writer: the CPUs of this process's affinity; auto runs KaMinPar "
                         "on one, for a reproducible partition)")
    ap.add_argument("--refine", choices=REFINES,
                    help="g3: G3's refinement of the method's assignment under the node and edge caps (metis, "
                         "kaminpar; default none; auto: g3)")
    g = ap.add_argument_group("g3 refinement and cost model")
    g.add_argument("--node-imbalance", type=float,
                   help="max owned nodes per part / mean, finite and >= 1 (g3, stream, metis --balance both; "
                        "default 1.10)")
    g.add_argument("--edge-imbalance", type=float,
                   help="max local edges per part / mean, finite and >= 1 (g3, stream, metis --balance both; "
                        "default 1.10)")
    g.add_argument("--max-iters", type=int,
                   help="refinement iterations at most, >= 0 (g3 and --refine g3; default 100, auto: "
                        f"{AUTO_MAX_ITERS})")
    g.add_argument("--cost-slack", type=float,
                   help="phase 2 may raise the max estimated epoch by this fraction (finite, >= 0) to lower the "
                        "max communication rows (g3; default 0: never)")
    g.add_argument("--start", choices=("auto", "recursive", "kway", "volume"),
                   help="METIS start of g3: recursive bisection or k-way minimising the edge cut, or k-way "
                        "minimising the communication volume (fewer communication rows, slower METIS); auto: the "
                        "volume on skewed (power-law) graphs up to 8 parts, else the cut by bisection up to 16 "
                        "parts, k-way above (g3; default auto)")
    g.add_argument("--start-balance", choices=("auto", "nodes", "edges"),
                   help="vertex weights of g3's METIS start; auto: edges on skewed (power-law) graphs, else nodes, "
                        "switching to edges when the node-balanced start is over the edge cap and cuts more than "
                        "40 %% of the edges (g3; default auto)")
    g.add_argument("--bandwidth", default="10Gbit",
                   help="network bandwidth per rank, positive, e.g. 10Gbit, 1.25GB (every method: the estimates "
                        "in meta.json; default 10Gbit)")
    g.add_argument("--edge-seconds", type=float, default=DEFAULT_EDGE_SECONDS,
                   help="compute coefficient: seconds per edge per feature, finite and > 0 (every method; "
                        "default 2e-9)")
    g.add_argument("--width", type=int, default=None,
                   help=f"row width of the cost model, 1 .. {MAX_WIDTH} (default: feature_dim)")
    g.add_argument("--calibrate", action="store_true", help="measure --edge-seconds on this machine (SpMM)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_timeout_options(ap.add_argument_group("deadlines (--method stream on MPI ranks; docs/RELIABILITY.md)"))
    return ap


def _refuse_other_methods_options(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """An option of another method than the one chosen is refused, not silently ignored; unset ones get their
    defaults."""
    refining = a.refine == "g3" or (a.method == "auto" and a.refine is None)
    for dest, method in METHOD_OPTIONS.items():
        if dest in REFINE_OPTIONS and refining:
            method += " metis kaminpar auto"
        if getattr(a, dest) is not None and a.method not in method.split():
            opt = "--" + dest.replace("_", "-")
            method = " or ".join(method.split())
            hint = {"balance": " (g3 balances nodes and edges itself)", "objective": " (g3: --start volume)"}
            ap.error(f"{opt} applies to --method {method}, not {a.method}"
                     + (hint.get(dest, "") if a.method == "g3" else ""))
        if getattr(a, dest) is not None and a.method == "metis" and dest.endswith("imbalance") \
                and a.balance != "both" and a.refine != "g3":
            ap.error(f"--{dest.replace('_', '-')} applies to --method g3 or stream, or metis with --balance both "
                     f"(the tolerance of its two constraints) or --refine g3, not metis --balance "
                     f"{a.balance or 'nodes'}")
        if dest == "refine" and a.refine is None:
            a.refine = "g3" if a.method == "auto" else "none"
        if dest == "kaminpar_context" and a.kaminpar_context is None and a.method == "auto":
            a.kaminpar_context = AUTO_KAMINPAR_CONTEXT
        if dest == "max_iters" and a.method == "auto":
            continue   # unset: choose_method gives the refinement of the method auto chooses its own default
        if getattr(a, dest) is None:
            setattr(a, dest, PartitionConfig.__dataclass_fields__[dest].default)


def partition_args(argv) -> PartitionConfig:
    ap = partition_parser()
    a = ap.parse_args(argv)
    _refuse_other_methods_options(ap, a)
    check_values(ap, a)
    try:
        bw = parse_bandwidth(a.bandwidth)
    except ValueError as e:
        ap.error(f"--bandwidth: {e}")
    return PartitionConfig(graph=a.graph, parts=a.parts, method=a.method, out=a.out, seed=a.seed, force=a.force,
                           balance=a.balance, node_imbalance=a.node_imbalance, edge_imbalance=a.edge_imbalance,
                           max_iters=a.max_iters, cost_slack=a.cost_slack, start=a.start,
                           start_balance=a.start_balance, objective=a.objective, stream_order=a.stream_order,
                           kaminpar_context=a.kaminpar_context, threads=a.threads, refine=a.refine, bandwidth=bw,
                           edge_seconds=a.edge_seconds, width=a.width, calibrate=a.calibrate,
                           progress=not a.no_progress, comm_timeout=a.comm_timeout,
                           comm_timeout_floor=a.comm_timeout_floor)


def _finite_at_least(x: float, low: float, strict: bool = False) -> bool:
    return math.isfinite(x) and (x > low if strict else x >= low)


def check_values(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Stop with an argparse error (exit 2) naming the first option whose value is out of range.

    NaN fails every comparison, so each rule is written as what a good value satisfies.
    """
    rules = (
        ("--parts", a.parts, 1 <= a.parts <= MAX_PARTS, f"must be in [1, {MAX_PARTS}]"),
        ("--seed", a.seed, 0 <= a.seed <= MAX_SEED, "must be in [0, 2**63-1]"),
        ("--node-imbalance", a.node_imbalance, _finite_at_least(a.node_imbalance, 1), "must be finite and >= 1"),
        ("--edge-imbalance", a.edge_imbalance, _finite_at_least(a.edge_imbalance, 1), "must be finite and >= 1"),
        ("--max-iters", a.max_iters, a.max_iters is None or a.max_iters >= 0, "must be >= 0"),
        ("--cost-slack", a.cost_slack, _finite_at_least(a.cost_slack, 0), "must be finite and >= 0"),
        ("--edge-seconds", a.edge_seconds, _finite_at_least(a.edge_seconds, 0, strict=True),
         "must be finite and > 0"),
        ("--width", a.width, a.width is None or 1 <= a.width <= MAX_WIDTH, f"must be in [1, {MAX_WIDTH}]"),
        ("--threads", a.threads, a.threads is None or 1 <= a.threads <= 4096, "must be in [1, 4096]"),
    )
    for name, value, ok, what in rules:
        if not ok:
            ap.error(f"{name}: {what}, got {value}")


def partition_main(argv=None) -> int:
    cfg = partition_args(argv)
    setup_tool_logging(PARTITION)
    comm = launched_comm()
    code = dispatch(cfg, argv, comm)
    if argv is None and comm is not None and code != 0:
        # the program itself (not a call from Python): every rank knows the status, so MPI is finalized and the
        # job ends with it, without python -m mpi4py's MPI_Abort (a line of launcher noise per rank)
        from mpi4py import MPI
        if not MPI.Is_finalized():
            MPI.Finalize()
    return code



# g3-inspect

def inspect_main(argv=None) -> int:
    ap = Parser(prog=INSPECT, description="Validate and summarise a graph.h5 or a partition directory.")
    ap.add_argument("path", type=Path, help="graph.h5 or partition directory")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--plot", type=Path, metavar="FILE.png", help="draw per-part compute and communication bars")
    a = ap.parse_args(argv)
    setup_tool_logging(INSPECT)
    try:
        if a.plot:
            check_plot_path(a.plot)
        r = inspect_path(a.path)
    except FormatError as e:
        print(f"{INSPECT}: error: {e}", file=sys.stderr)
        return 1
    status = 0
    try:
        if a.json:
            print(json_text(r, sort_keys=False))
        else:
            print_report(r)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader closed the pipe (g3-inspect PARTS --json | head): stop writing without a traceback and exit
        # as a tool ended by SIGPIPE does, 128 + 13; a --plot is still drawn
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 141
    if a.plot:
        if r["kind"] != "partition":
            print(f"{INSPECT}: error: {a.path}: --plot needs a partition directory", file=sys.stderr)
            return 1
        try:
            plot_report(r, a.plot)
        except FormatError as e:
            print(f"{INSPECT}: error: {e}", file=sys.stderr)
            return 1
    return status


# python -m data_tools.importers.triples

def triples_main(argv=None) -> int:
    """``python -m data_tools.importers.triples DIR [--entities N --relations R --triples M --seed S]``: write a
    synthetic knowledge graph (:func:`generate_kg`) as triple files for ``g3-prepare triples DIR``."""
    ap = argparse.ArgumentParser(prog="python -m data_tools.importers.triples",
                                 description="Write a seeded synthetic knowledge graph as train/valid/test.txt.")
    ap.add_argument("out", type=Path, help="directory to write the three files into")
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--relations", type=int, default=20)
    ap.add_argument("--triples", type=int, default=200_000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if min(a.entities, a.relations, a.triples) < 1 or a.seed < 0:
        ap.error("--entities, --relations and --triples must be >= 1, --seed >= 0")
    print(json.dumps(generate_kg(a.out, a.entities, a.relations, a.triples, seed=a.seed)))
    return 0


# the benchmark scripts (python -m data_tools.bench_*): their parsers; the runs stay in their modules

def bench_scale_parser() -> argparse.ArgumentParser:
    """``python -m data_tools.bench_scale``'s options."""
    from . import bench_scale as bench
    ap = argparse.ArgumentParser(prog="python -m data_tools.bench_scale",
                                 description=bench.__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=23, help="2**scale nodes (default 23)")
    ap.add_argument("--edge-factor", type=int, default=16, help="edges per node (default 16)")
    ap.add_argument("--feature-dim", type=int, default=32, help="default 32")
    ap.add_argument("--classes", type=int, default=8, help="default 8")
    ap.add_argument("--memory-budget", default="256M", help="g3-prepare's --memory-budget (default 256M)")
    ap.add_argument("--parts", type=int, default=8, help="parts of the partitions compared (default 8)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the parallel partitioner (default 4)")
    ap.add_argument("--train-ranks", type=int, default=2, help="training ranks, and parts of its partition "
                    "(default 2)")
    ap.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    ap.add_argument("--hidden", type=int, default=16, help="GCN hidden width (default 16)")
    ap.add_argument("--metis", choices=("auto", "on", "off"), default="auto",
                    help="run serial METIS: where its estimated memory fits (auto), always, or never")
    ap.add_argument("--skip", action="append", default=[], choices=bench.STAGES, metavar="STAGE",
                    help="leave STAGE out, using its output in WORK from an earlier run (repeatable; one of "
                         f"{', '.join(bench.STAGES)})")
    ap.add_argument("--work", type=Path, required=True, help="directory for the graph, partitions and run")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    return ap


def bench_methods_parser() -> argparse.ArgumentParser:
    """``python -m data_tools.bench_methods``'s options."""
    from . import bench_methods as bench
    ap = argparse.ArgumentParser(prog="python -m data_tools.bench_methods",
                                 description=bench.__doc__.split("\n\n")[0])
    ap.add_argument("graph", type=Path, help="graph.h5 (g3-prepare)")
    ap.add_argument("--parts", default="8,16", help="comma-separated part counts (default 8,16)")
    ap.add_argument("--methods", default="auto,kaminpar,metis,stream",
                    help=f"comma-separated subset of {','.join(bench.METHODS)} "
                         "(default auto,kaminpar,metis,stream)")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the stream and auto methods (default 4)")
    ap.add_argument("--work", type=Path, required=True, help="directory for the partitions")
    ap.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    return ap


def bench_feature_dtype_parser() -> argparse.ArgumentParser:
    """``python -m data_tools.bench_feature_dtype``'s options."""
    from . import bench_feature_dtype as bench
    ap = argparse.ArgumentParser(prog="python -m data_tools.bench_feature_dtype",
                                 description=bench.__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--nodes", type=int, default=10_000_000)
    ap.add_argument("--edges", type=int, default=20_000_000)
    ap.add_argument("--feature-dim", type=int, default=128)
    ap.add_argument("--memory-budget", default="2G")
    ap.add_argument("--train-nodes", type=int, default=None, help="train on a graph of this many nodes instead")
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--hidden", type=int, default=None, help="the trained model's width (default: --feature-dim)")
    return ap


def bench_partition_parser() -> argparse.ArgumentParser:
    """``python -m data_tools.bench_partition``'s options."""
    from . import bench_partition as bench
    ap = argparse.ArgumentParser(prog="bench_partition", description=bench.__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", default="cora,sbm,rmat18,rmat20")
    ap.add_argument("--parts", default="4,8,16")
    ap.add_argument("--out", type=Path, default=Path("bench_partition.json"))
    ap.add_argument("--cora", type=Path, default=bench.REPO / "data" / "cora.npz")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-iters", type=int, default=100)
    ap.add_argument("--width", type=int, default=128, help="row width of the cost model")
    ap.add_argument("--calibrate", action="store_true", help="measure the compute coefficient first")
    ap.add_argument("--methods", default=",".join(bench.METHODS),
                    help=f"comma-separated subset of {','.join(bench.METHODS)} "
                         "(metis-nodes is the reference of the checks)")
    ap.add_argument("--repeats", type=int, default=5,
                    help="runs per method while a run takes under 1 CPU second (the median is reported)")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="combine the rows of earlier result files (same cost model) into --out; runs nothing")
    return ap
