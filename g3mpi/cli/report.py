"""g3-report: the runs of a sweep (or any runs) side by side (:mod:`g3mpi.train.report`).

    g3-report runs/sweep-1234                       one line per run: settings, accuracies, epochs, time
    g3-report runs/a runs/b --plot lr [--metric val_acc] [--plot-out acc-vs-lr.png]

Each PATH is a run directory or a directory of runs (sweep.sbatch's). The table shows the model, seed and learning
rate and every other setting in which the runs differ, then the best validation and test accuracy (of the
best-validation epoch), the best epoch, the epochs trained and the training time in seconds. ``--plot SETTING``
draws the accuracy against SETTING. A run without summary.json (unfinished) or with an unreadable file is one line
naming the file, status 1; ``--partial`` leaves such runs out with a warning line each.
"""
from __future__ import annotations

import argparse
import sys

from g3mpi.options import Parser

PROG = "g3-report"


def main(argv=None) -> int:
    from g3mpi.train.report import METRICS, ReportError, format_table, plot_vs, read_runs, table
    from g3mpi.train.rundir import OutputError
    ap = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", metavar="PATH", help="a run directory, or a directory of runs")
    ap.add_argument("--plot", metavar="SETTING", help="plot the accuracy against this setting (e.g. lr, seed)")
    ap.add_argument("--metric", default="test_acc", choices=METRICS, help="the value to plot (default test_acc)")
    ap.add_argument("--plot-out", metavar="PNG", help="the plot's file (default accuracy-vs-SETTING.png)")
    ap.add_argument("--partial", action="store_true", help="leave out unfinished or unreadable runs, with a warning")
    a = ap.parse_args(argv)
    try:
        runs, skipped = read_runs(a.paths, partial=a.partial)
        for line in skipped:
            print(f"{PROG}: warning: left out: {line}", file=sys.stderr)
        if not runs:
            raise ReportError("no finished run to report")
        print(format_table(table(runs)))
        if a.plot:
            print(plot_vs(runs, a.plot, a.metric, a.plot_out or f"accuracy-vs-{a.plot}.png"), file=sys.stderr)
    except (ReportError, OutputError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
