"""MPI helper for tests/test_job_report.py: g3-train on every rank, each rank's exit status written down.

    mpiexec -n P python -m mpi4py -m tests.mpi_job_exit DIR [g3-train ARGS]

Rank r writes its status to DIR/rank-r (mpiexec reports one status for the job; the tests check every rank's).
"""
from __future__ import annotations

import sys
from pathlib import Path

from mpi4py import MPI

from g3mpi.cli import train


def main() -> int:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    rank = MPI.COMM_WORLD.rank
    code = train.main(argv)
    (out / f"rank-{rank}").write_text(str(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
