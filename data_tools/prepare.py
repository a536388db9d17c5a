"""``g3-prepare KIND ... --out graph.h5``: import or generate a graph into one graph.h5 (docs/PREPARE.md).

KIND is ``npz``, ``ogb``, ``edgelist`` (importers) or ``sbm``, ``rmat`` (generators). Every kind shares the
options that shape the CSR (``--symmetrize``, ``--self-loops``, ``--dedup``), ``--normalize-features``, the
split fractions used when the input has no split, ``--seed`` and ``--force``. Errors are one line on stderr,
``g3-prepare: error: <path>: <what>``, with a non-zero exit and no output left behind.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from g3mpi.format import FormatError, check_output, json_text

from .importers.common import PrepareOptions, RawGraph, write_raw_graph
from .termination import exit_after_failed_write, interruption, terminate_as_interrupt

PROG = "g3-prepare"
log = logging.getLogger("g3-prepare")


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output and graph options (all kinds)")
    g.add_argument("--out", "-o", required=True, type=Path, help="graph.h5 to write")
    g.add_argument("--force", action="store_true", help="replace an existing output")
    g.add_argument("--symmetrize", action="store_true",
                   help="add the reverse of every edge and merge duplicates (undirected graph)")
    g.add_argument("--self-loops", choices=("keep", "drop", "add"), default="keep",
                   help="keep self loops as given, drop them all, or give every node exactly one (default keep)")
    g.add_argument("--dedup", action="store_true", help="merge repeated edges")
    g.add_argument("--normalize-features", action="store_true",
                   help="divide each feature row by its L1 norm (Planetoid / Kipf & Welling)")
    g.add_argument("--train", type=float, default=0.6,
                   help="fraction of labelled nodes for training when the input has no split (default 0.6)")
    g.add_argument("--val", type=float, default=0.2,
                   help="fraction for validation when the input has no split (default 0.2); the rest is test")
    g.add_argument("--seed", type=int, default=0, help="seed of generators and random splits, >= 0 (default 0)")
    g.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bars and no summary line on stderr (the JSON summary on stdout stays)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG,
                                 description="Import or generate a graph into one graph.h5 (see docs/PREPARE.md).")
    sub = ap.add_subparsers(dest="kind", required=True, metavar="KIND")

    p = sub.add_parser("npz", help="NumPy archive: edge_index, x, y, train/val/test_mask (e.g. cora.npz)")
    p.add_argument("input", type=Path)
    p.add_argument("--num-classes", type=int, default=None, help="number of classes (default: max label + 1)")
    _common(p)

    p = sub.add_parser("ogb", help="OGB node-property dataset directory (raw/*.csv.gz, split/<scheme>/)")
    p.add_argument("input", type=Path, help="the dataset directory (containing raw/ and split/)")
    p.add_argument("--split", default=None, help="split scheme under split/ (default: the only / first one)")
    p.add_argument("--num-classes", type=int, default=None, help="number of classes (default: max label + 1)")
    _common(p)

    p = sub.add_parser("edgelist", help="text edge list: 'source target [ignored columns]' per line")
    p.add_argument("input", type=Path, help="CSV / TSV / whitespace-separated edge list (.gz accepted)")
    p.add_argument("--delimiter", default="auto",
                   help="',', 'tab', 'space' (any whitespace) or 'auto' (from the first data line)")
    hdr = p.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_true", default=None,
                     help="the first non-comment line is a header")
    hdr.add_argument("--no-header", dest="header", action="store_false",
                     help="no header (default: detected: a first line whose IDs are not integers)")
    p.add_argument("--features", type=Path, default=None, help=".npy float [R, F]: one row per node")
    p.add_argument("--labels", type=Path, default=None, help=".npy int [R]: class per node, -1 = unlabelled")
    p.add_argument("--masks", type=Path, default=None,
                   help=".npz with train_mask, val_mask, test_mask bool [R] (default: random split)")
    p.add_argument("--node-ids", type=Path, default=None,
                   help=".npy int [R]: the edge-list ID of each features/labels row (default: row = ID)")
    p.add_argument("--feature-dim", type=int, default=0,
                   help="without --features: this many seeded random N(0,1) features per node (default 0)")
    p.add_argument("--num-classes", type=int, default=None, help="number of classes (default: max label + 1)")
    _common(p)

    p = sub.add_parser("sbm", help="synthetic planted-partition graph with class-correlated features")
    p.add_argument("--nodes", type=int, default=50_000)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--feature-dim", type=int, default=64)
    p.add_argument("--avg-degree", type=float, default=None, help="average degree (default 10)")
    p.add_argument("--homophily", type=float, default=None, help="fraction of edges inside a class (default 0.7)")
    p.add_argument("--p-in", type=float, default=None, help="intra-class edge probability (with --p-out)")
    p.add_argument("--p-out", type=float, default=None, help="inter-class edge probability (with --p-in)")
    p.add_argument("--noise", type=float, default=None,
                   help="std of each feature's Gaussian noise; class centres have unit norm (default 0.5)")
    _common(p)

    p = sub.add_parser("rmat", help="synthetic Graph500-style R-MAT graph (a,b,c,d = .57,.19,.19,.05)")
    p.add_argument("--scale", type=int, required=True, help="2**scale nodes")
    p.add_argument("--edge-factor", type=int, default=16, help="edges per node")
    p.add_argument("--feature-dim", type=int, default=32)
    p.add_argument("--classes", type=int, default=16)
    p.add_argument("--noise", type=float, default=1.0,
                   help="std of each feature's Gaussian noise; class centres have unit norm")
    _common(p)
    return ap


def load_raw(args: argparse.Namespace, opts: PrepareOptions) -> RawGraph:
    """Run the importer or generator named by ``args.kind``."""
    if args.kind == "npz":
        from .importers.npz import load_npz
        return load_npz(args.input, num_classes=args.num_classes)
    if args.kind == "ogb":
        from .importers.ogb import load_ogb
        return load_ogb(args.input, split=args.split, num_classes=args.num_classes, quiet=opts.quiet)
    if args.kind == "edgelist":
        from .importers.edgelist import load_edgelist
        return load_edgelist(args.input, delimiter=args.delimiter, header=args.header, features=args.features,
                             labels=args.labels, masks=args.masks, node_ids=args.node_ids,
                             feature_dim=args.feature_dim, num_classes=args.num_classes, seed=opts.seed,
                             quiet=opts.quiet)
    if args.kind == "sbm":
        from .importers.sbm import DEFAULT_HOMOPHILY, DEFAULT_NOISE, generate_sbm
        return generate_sbm(args.nodes, args.classes, args.feature_dim, avg_degree=args.avg_degree,
                            homophily=DEFAULT_HOMOPHILY if args.homophily is None else args.homophily,
                            p_in=args.p_in, p_out=args.p_out,
                            noise=DEFAULT_NOISE if args.noise is None else args.noise, seed=opts.seed,
                            quiet=opts.quiet)
    if args.kind == "rmat":
        from .importers.rmat import generate_rmat
        return generate_rmat(args.scale, args.edge_factor, args.feature_dim, num_classes=args.classes,
                             noise=args.noise, seed=opts.seed, quiet=opts.quiet)
    raise ValueError(f"unknown kind {args.kind!r}")


#: the options that name input files (besides the positional input)
INPUT_OPTIONS = ("input", "features", "labels", "masks", "node_ids")


def check_not_an_input(args: argparse.Namespace) -> None:
    """FormatError when ``--out`` is one of the input files (also through a link): --force would replace it."""
    out = args.out
    for name in INPUT_OPTIONS:
        inp = getattr(args, name, None)
        if inp is not None and inp.exists() and out.exists() and os.path.samefile(inp, out):
            raise FormatError(out, "output would overwrite the input" + ("" if name == "input" else
                                                                         f" (--{name.replace('_', '-')})"))
    if args.kind == "ogb" and out.exists() and args.input.is_dir():     # the files of the dataset directory
        for sub in ("raw", "split"):
            for f in (args.input / sub).rglob("*"):
                if f.is_file() and os.path.samefile(f, out):
                    raise FormatError(out, f"output would overwrite the input ({f})")


def prepare(args: argparse.Namespace) -> dict:
    opts = PrepareOptions(symmetrize=args.symmetrize, self_loops=args.self_loops, dedup=args.dedup,
                          normalize_features=args.normalize_features, train=args.train, val=args.val,
                          seed=args.seed, force=args.force, quiet=args.quiet)
    if not (0 <= opts.train <= 1 and 0 <= opts.val <= 1 and opts.train + opts.val <= 1):
        raise ValueError(f"--train and --val must be fractions with train + val <= 1 (got {opts.train}, {opts.val})")
    if opts.seed < 0:
        raise ValueError(f"--seed must be >= 0 (numpy's seed sequences take non-negative integers), got {opts.seed}")
    if args.out.is_dir():
        raise FormatError(args.out, "is a directory, expected a graph.h5 path")
    check_output(args.out, opts.force)          # fail before any heavy work
    check_not_an_input(args)
    t0 = time.perf_counter()
    raw = load_raw(args, opts)
    summary = write_raw_graph(args.out, raw, opts)
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["out"] = str(args.out)
    return summary


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format=f"{PROG}: %(message)s",
                        stream=sys.stderr)
    try:
        with terminate_as_interrupt():
            summary = prepare(args)
    except FormatError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{PROG}: error: {args.out}: out of memory while building the graph", file=sys.stderr)
        return 1
    except OSError as e:
        where = e.filename or args.out
        # h5py's write errors (disk full, quota) carry the errno and a multi-line HDF5 report: keep one line
        what = os.strerror(e.errno) if isinstance(e.errno, int) else " ".join(str(e.strerror or e).split())
        print(f"{PROG}: error: {where}: {what}", file=sys.stderr)
        if argv is None:   # the command itself (in-process callers get the status)
            exit_after_failed_write()
        return 1
    except KeyboardInterrupt as e:
        print(f"{PROG}: error: {args.out}: {interruption(e)} (no output written)", file=sys.stderr)
        return getattr(e, "exit_status", 130)
    if summary["train"] == 0:
        print(f"{PROG}: warning: {args.out}: no training nodes (no labels, or an empty train split): "
              f"g3-train will refuse this graph", file=sys.stderr)
    if not args.quiet:
        log.info("wrote %s: %d nodes, %d edges, %d features, %d classes, split %d/%d/%d (%.1f s)", summary["out"],
                 summary["num_nodes"], summary["num_edges"], summary["feature_dim"], summary["num_classes"],
                 summary["train"], summary["val"], summary["test"], summary["seconds"])
    try:
        print(json_text(summary, indent=None, sort_keys=False), flush=True)
    except BrokenPipeError:                # `g3-prepare ... | head -0`: graph.h5 is complete, the reader left
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit's flush
    return 0


if __name__ == "__main__":
    sys.exit(main())
