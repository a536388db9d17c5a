"""``g3-prepare KIND ... --out graph.h5``: import or generate a graph into one graph.h5 (docs/PREPARE.md).

KIND is ``npz``, ``ogb``, ``edgelist``, ``triples`` (importers) or ``sbm``, ``rmat`` (generators). Every kind shares the
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
from dataclasses import dataclass, field
from pathlib import Path

from g3mpi.format import FormatError, check_output, json_text
from g3mpi.format.features import FEATURE_DTYPES
from g3mpi.log import setup_tool_logging
from g3mpi.mpi.termination import exit_after_failed_write, interruption, terminate_as_interrupt
from g3mpi.options import Parser, from_options

from .importers.common import BLOCK_BYTES_PER_EDGE, PrepareOptions, RawGraph, write_raw_graph
from .importers.external import work_dir
from .importers.sbm import DEFAULT_HOMOPHILY, DEFAULT_NOISE
from .stages import StageMeter

PROG = "g3-prepare"
log = logging.getLogger("g3-prepare")


# -- settings ----------------------------------------------------------------------------------------------------
# What to read or generate (one dataclass per KIND), where to write it, and the options every KIND shares
# (PrepareOptions). The defaults live here and in PrepareOptions: the parser leaves an option not given as None.
@dataclass(frozen=True)
class NpzSource:
    """``npz``: a NumPy archive with edge_index, x, y and train/val/test_mask."""

    input: Path
    num_classes: int | None = None      # None: max label + 1

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.npz import load_npz
        return load_npz(self.input, num_classes=self.num_classes)


@dataclass(frozen=True)
class OgbSource:
    """``ogb``: an OGB node-property dataset directory (raw/*.csv.gz, split/<scheme>/)."""

    input: Path
    split: str | None = None            # scheme under split/ (None: the only / first one)
    num_classes: int | None = None      # None: max label + 1

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.ogb import load_ogb
        return load_ogb(self.input, split=self.split, num_classes=self.num_classes, quiet=opts.quiet,
                        spool_dir=work, spool_limit=opts.memory_budget // 2)


@dataclass(frozen=True)
class EdgelistSource:
    """``edgelist``: a text edge list, with node data from .npy / .npz files beside it."""

    input: Path
    delimiter: str = "auto"             # ',', ';', '|', 'tab', 'space' or 'auto' (from the first data line)
    header: bool | None = None          # None: detected
    features: Path | None = None        # .npy float [R, F]
    labels: Path | None = None          # .npy int [R]
    masks: Path | None = None           # .npz of train_mask, val_mask, test_mask (None: a random split)
    node_ids: Path | None = None        # .npy int [R]: edge-list ID of each row (None: row = ID)
    feature_dim: int = 0                # random features per node when there is no features file
    num_classes: int | None = None      # None: max label + 1

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.edgelist import load_edgelist
        return load_edgelist(self.input, delimiter=self.delimiter, header=self.header, features=self.features,
                             labels=self.labels, masks=self.masks, node_ids=self.node_ids,
                             feature_dim=self.feature_dim, num_classes=self.num_classes, seed=opts.seed,
                             quiet=opts.quiet, spool_dir=work, spool_limit=opts.memory_budget // 2)


@dataclass(frozen=True)
class SbmSource:
    """``sbm``: a planted-partition graph; either (avg_degree, homophily) or (p_in, p_out) sets the edges."""

    nodes: int = 50_000
    classes: int = 10
    feature_dim: int = 64
    avg_degree: float | None = None     # None: the generator's default (10); refused with p_in / p_out
    homophily: float = DEFAULT_HOMOPHILY
    p_in: float | None = None
    p_out: float | None = None
    noise: float = DEFAULT_NOISE

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.sbm import generate_sbm
        return generate_sbm(self.nodes, self.classes, self.feature_dim, avg_degree=self.avg_degree,
                            homophily=self.homophily, p_in=self.p_in, p_out=self.p_out, noise=self.noise,
                            seed=opts.seed, quiet=opts.quiet)


@dataclass(frozen=True)
class RmatSource:
    """``rmat``: a Graph500-style R-MAT graph of 2**scale nodes."""

    scale: int
    edge_factor: int = 16               # edges per node
    feature_dim: int = 32
    classes: int = 16
    noise: float = 1.0
    relations: int = 0                  # > 0: a uniform random relation per edge (a typed graph)

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.rmat import generate_rmat
        return generate_rmat(self.scale, self.edge_factor, self.feature_dim, num_classes=self.classes,
                             noise=self.noise, seed=opts.seed, quiet=opts.quiet, relations=self.relations)


@dataclass(frozen=True)
class TriplesSource:
    """``triples``: a knowledge graph in train.txt / valid.txt / test.txt (head, relation, tail a line)."""

    input: Path
    add_inverse: bool = False           # relation r gets an inverse r + R with the reversed training triples

    def load(self, opts: PrepareOptions, work: Path | None = None) -> RawGraph:
        from .importers.triples import load_triples
        return load_triples(self.input, add_inverse=self.add_inverse)


#: KIND -> its settings
SOURCES = {"npz": NpzSource, "ogb": OgbSource, "edgelist": EdgelistSource, "sbm": SbmSource, "rmat": RmatSource,
           "triples": TriplesSource}
Source = NpzSource | OgbSource | EdgelistSource | SbmSource | RmatSource | TriplesSource


@dataclass(frozen=True)
class PrepareConfig:
    """One g3-prepare run: KIND's settings, the output, the shared options. ValueError on a split, a seed or a
    number of classes that no KIND accepts (g3-prepare prints it and exits 2)."""

    source: Source
    out: Path                           # graph.h5 to write
    options: PrepareOptions = field(default_factory=PrepareOptions)

    def __post_init__(self):
        o = self.options
        if not (0 <= o.train <= 1 and 0 <= o.val <= 1 and o.train + o.val <= 1):
            raise ValueError(f"--train and --val must be fractions with train + val <= 1 (got {o.train}, {o.val})")
        if o.seed < 0:
            raise ValueError(f"--seed must be >= 0 (numpy's seed sequences take non-negative integers), got {o.seed}")
        if o.split_seed < 0:
            raise ValueError(f"--split-seed must be >= 0, got {o.split_seed}")
        if o.memory_budget < 1:
            raise ValueError(f"--memory-budget must be at least 1 byte, got {o.memory_budget}")
        c = getattr(self.source, "num_classes", None)
        if c is not None and c < 1:
            raise ValueError(f"--num-classes must be >= 1, got {c}")


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


def record_path(out: Path) -> Path:
    """The JSON record of a g3-prepare run beside its output: ``OUT.prepare.json``."""
    return out.with_name(out.name + ".prepare.json")


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


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog=PROG,
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


#: the settings that name input files (besides the positional input)
INPUT_OPTIONS = ("input", "features", "labels", "masks", "node_ids")


def check_not_an_input(cfg: PrepareConfig) -> None:
    """FormatError when ``--out`` is one of the input files (also through a link): --force would replace it."""
    out = cfg.out
    for name in INPUT_OPTIONS:
        inp = getattr(cfg.source, name, None)
        if inp is not None and inp.exists() and out.exists() and os.path.samefile(inp, out):
            raise FormatError(out, "output would overwrite the input" + ("" if name == "input" else
                                                                         f" (--{name.replace('_', '-')})"))
    if isinstance(cfg.source, OgbSource) and out.exists() and cfg.source.input.is_dir():   # the dataset's files
        for sub in ("raw", "split"):
            for f in (cfg.source.input / sub).rglob("*"):
                if f.is_file() and os.path.samefile(f, out):
                    raise FormatError(out, f"output would overwrite the input ({f})")


def prepare(cfg: PrepareConfig, split_options: tuple[str, ...] = ()) -> dict:
    """Import or generate the graph and write it. ``split_options``: the split fractions given on the command line
    (``--train``, ``--val``), which an input with its own split does not use (a warning says so)."""
    if cfg.out.is_dir():
        raise FormatError(cfg.out, "is a directory, expected a graph.h5 path")
    check_output(cfg.out, cfg.options.force)          # fail before any heavy work
    check_not_an_input(cfg)
    t0 = time.perf_counter()
    meter = StageMeter()
    with work_dir(cfg.out) as work:                  # spilled edges and buckets, removed whatever happens
        with meter.stage("read"):
            raw = cfg.source.load(cfg.options, work)
        if split_options and raw.masks is not None:
            where = getattr(cfg.source, "input", cfg.out)
            print(f"{PROG}: warning: {where}: the input has its own split: {' and '.join(split_options)} (used "
                  f"only for an input without one) ignored", file=sys.stderr)
        summary = write_raw_graph(cfg.out, raw, cfg.options, work, meter)
        del raw
    summary["seconds"] = round(time.perf_counter() - t0, 3)
    summary["out"] = str(cfg.out)
    record = record_path(cfg.out)
    meter.write(record, out=str(cfg.out), **{k: summary[k] for k in ("num_nodes", "num_edges", "build",
                                                                    "memory_budget", "block_edges", "seconds")})
    if not cfg.options.quiet:
        meter.report(log)
    summary["stages"] = meter.records
    summary["record"] = str(record)
    return summary


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    split_options = tuple(f"--{k}" for k in ("train", "val") if getattr(args, k) is not None)
    try:
        cfg = config_from(args)
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    setup_tool_logging(PROG, logging.WARNING if cfg.options.quiet else logging.INFO)
    try:
        with terminate_as_interrupt():
            summary = prepare(cfg, split_options)
    except FormatError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"{PROG}: error: {cfg.out}: out of memory while building the graph", file=sys.stderr)
        return 1
    except OSError as e:
        where = e.filename or cfg.out
        # h5py's write errors (disk full, quota) carry the errno and a multi-line HDF5 report: keep one line
        what = os.strerror(e.errno) if isinstance(e.errno, int) else " ".join(str(e.strerror or e).split())
        print(f"{PROG}: error: {where}: {what}", file=sys.stderr)
        if argv is None:   # the command itself (in-process callers get the status)
            exit_after_failed_write()
        return 1
    except KeyboardInterrupt as e:
        print(f"{PROG}: error: {cfg.out}: {interruption(e)} (no output written)", file=sys.stderr)
        return getattr(e, "exit_status", 130)
    if summary["train"] == 0 and not summary.get("links"):
        print(f"{PROG}: warning: {cfg.out}: no training nodes (no labels, or an empty train split): "
              f"g3-train will refuse this graph", file=sys.stderr)
    if not cfg.options.quiet:
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
