"""``python -m g3mpi.cli.plots RUN``: (re)draw a run directory's plots, ``training.png`` and ``ranks.png``, from its
metrics.jsonl, and ``timeline.png`` from its timeline.json where it has one (see :mod:`g3mpi.train.plots`): while
the job runs (the epochs so far), or after ``--no-plots``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from g3mpi.options import Parser

PROG = "python -m g3mpi.cli.plots"


def main(argv=None) -> int:
    from g3mpi.format.errors import failure_reason
    from g3mpi.train.plots import plot_run
    from g3mpi.train.rundir import OutputError
    ap = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="run directory of g3-train (with metrics.jsonl)")
    a = ap.parse_args(argv)
    metrics = a.run / "metrics.jsonl"
    if not metrics.is_file():
        print(f"{PROG}: error: {metrics}: no such file (not a g3-train run directory?)", file=sys.stderr)
        return 1
    try:
        drawn = plot_run(a.run)
        for p in drawn:
            print(p)
        if not drawn:
            print(f"{PROG}: {metrics} has no trained epoch: nothing to draw", file=sys.stderr)
    except (OutputError, OSError) as e:   # a plot not written, or metrics.jsonl not read
        why = e if isinstance(e, OutputError) else f"{metrics}: cannot be read: {failure_reason(e)}"
        print(f"{PROG}: error: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
