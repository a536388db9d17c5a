"""g3-sweep: the combinations of a sweep's TOML grid (:mod:`g3mpi.train.sweep`), for jobs/slurm/sweep.sbatch.

    g3-sweep size GRID           the number of combinations N (submit with sbatch --array=0-(N-1))
    g3-sweep list GRID           one line per combination: its index, run directory name and g3-train arguments
    g3-sweep args GRID INDEX     combination INDEX: its run directory name, then its g3-train arguments, one a line

A grid that cannot be read or gives a bad setting is one line naming the file, status 1.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from g3mpi.options import Parser

PROG = "g3-sweep"


def main(argv=None) -> int:
    from g3mpi.train.sweep import GridError, read_grid
    ap = Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    for name, what in (("size", "print the number of combinations"), ("list", "list the combinations"),
                       ("args", "print one combination's run name and g3-train arguments")):
        p = sub.add_parser(name, help=what)
        p.add_argument("grid", help="the grid (TOML)")
        if name == "args":
            p.add_argument("index", type=int, help="the combination (SLURM_ARRAY_TASK_ID)")
    a = ap.parse_args(argv)
    try:
        grid = read_grid(a.grid)
        if a.command == "size":
            print(grid.size)
        elif a.command == "list":
            for i in range(grid.size):
                print(i, grid.name(i), shlex.join(grid.arguments(i)))
        else:
            lines = [grid.name(a.index), *grid.arguments(a.index)]
            print("\n".join(lines))
    except GridError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
