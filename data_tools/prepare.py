"""``g3-prepare KIND ... --out graph.h5``: import or generate a graph into one graph.h5 (docs/PREPARE.md).

KIND is ``npz``, ``ogb``, ``edgelist``, ``triples`` (importers) or ``sbm``, ``rmat`` (generators). Every kind shares the
options that shape the CSR (``--symmetrize``, ``--self-loops``, ``--dedup``), ``--normalize-features``, the
split fractions used when the input has no split, ``--seed`` and ``--force``. Errors are one line on stderr,
``g3-prepare: error: <path>: <what>``, with a non-zero exit and no output left behind.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from g3mpi.format import FormatError, check_output

from .importers.common import PrepareOptions, RawGraph, write_raw_graph
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


def record_path(out: Path) -> Path:
    """The JSON record of a g3-prepare run beside its output: ``OUT.prepare.json``."""
    return out.with_name(out.name + ".prepare.json")


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
    """``g3-prepare`` (its parser and main live in :mod:`data_tools.cli`; this name stays for scripts installed
    before)."""
    from .cli import prepare_main
    return prepare_main(argv)


if __name__ == "__main__":
    sys.exit(main())
