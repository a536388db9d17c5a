"""The start-up benchmark: a short g3-train job's wall time against that of starting the ranks at all.

    python -m g3mpi.bench.startup --parts PARTS [--ranks 4] [--launches 5] [--epochs 1] [--code DIR] --out FILE

Interleaves, ``--launches`` times each, the launches of (1) ``mpiexec -n P python -c "import torch, mpi4py.MPI"``
(the floor: Python, torch and MPI started on every rank), (2) ``mpiexec -n P python -m mpi4py -m
g3mpi.cli.train --parts PARTS --epochs E`` with plots on, from launch to exit, and (3) ``g3-train --help``; for
each ``--code DIR`` (a checkout of g3mpi, e.g. the code before a change; default: this one) the g3-train
launches run with DIR first on PYTHONPATH. Side by side, so that a busy machine slows all alike. Writes FILE
(JSON): each variant's wall times, their medians, the ratio of (2) to (1), and the median of each start-up and
shut-down phase of summary.json (where the code writes them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from g3mpi.options import Parser

from .common import mpiexec


def _timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"g3-bench startup: error: {' '.join(cmd)} exited {p.returncode}: {p.stderr[-2000:]}")
    return wall


def _env(code: str | None) -> dict:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = code + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _medians(rows: list[dict]) -> dict:
    keys = dict.fromkeys(k for r in rows for k in r)
    return {k: round(statistics.median(r[k] for r in rows if k in r), 3) for k in keys}


def bench(parts: str, ranks: int, launches: int, epochs: int, codes: list[str | None]) -> dict:
    """The measurements (see the module's docstring)."""
    mpi, py = mpiexec(), sys.executable
    floor = [mpi, "-n", str(ranks), py, "-c", "import torch, mpi4py.MPI"]
    walls: dict[str, list[float]] = {"floor": []}
    phases: dict[str, list[dict]] = {}
    work = Path(tempfile.mkdtemp(prefix="g3-bench-startup-"))
    try:
        for i in range(launches):
            walls["floor"].append(_timed(floor, _env(None)))
            for j, code in enumerate(codes):
                name = code or "this"
                run = work / f"run-{j}-{i}"
                cmd = [mpi, "-n", str(ranks), py, "-m", "mpi4py", "-m", "g3mpi.cli.train", "--parts", parts,
                       "--out", str(run), "--epochs", str(epochs), "--no-progress", "--plots"]
                walls.setdefault(f"train {name}", []).append(_timed(cmd, _env(code)))
                walls.setdefault(f"help {name}", []).append(
                    _timed([py, "-m", "g3mpi.cli.train", "--help"], _env(code)))
                summary = json.loads((run / "summary.json").read_text())
                if "startup" in summary:
                    phases.setdefault(f"startup {name}", []).append(summary["startup"])
                    phases.setdefault(f"shutdown {name}", []).append(summary["shutdown"])
                shutil.rmtree(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: round(statistics.median(v), 3) for k, v in walls.items()}
    return dict(ranks=ranks, launches=launches, epochs=epochs, parts=parts, load_average=os.getloadavg(),
                wall_s=walls, median_s=med,
                train_over_floor={k: round(v / med["floor"], 2) for k, v in med.items() if k.startswith("train ")},
                phases_median_s={k: _medians(v) for k, v in phases.items()})


def main(argv=None) -> int:
    ap = Parser(prog="g3-bench startup", description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", required=True, help="partition directory with --ranks parts")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--code", action="append", metavar="DIR",
                    help="a g3mpi checkout to measure (repeatable; default: the one imported)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args(argv)
    res = bench(a.parts, a.ranks, a.launches, a.epochs, a.code or [None])
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: res[k] for k in ("median_s", "train_over_floor", "load_average")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
