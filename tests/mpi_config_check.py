"""MPI helper for tests/test_train_cli.py: a command line or configuration that only one rank finds bad.

    mpiexec -n 2 python -m mpi4py -m tests.mpi_config_check CASE PARTS OUT

Under mpiexec every rank sees the same command line and files; here rank 1 alone is given a bad one while the
other ranks' is good. CASE ``cli``: --epochs ten; ``config``: a --config that does not exist; ``absent``: as
``cli``, but rank 0 never reaches the configuration check (it sleeps) and the check's limit is 2 s. Exits with
g3-train's status.
"""
from __future__ import annotations

import sys
import time

from mpi4py import MPI

from g3mpi.cli import train

BAD = dict(cli=["--epochs", "ten"], config=["--config", "/nonexistent/g3-config.toml"], absent=["--epochs", "ten"])


def main() -> int:
    case, parts, out = sys.argv[1:4]
    rank = MPI.COMM_WORLD.rank
    argv = ["--parts", parts, "--out", out, "--epochs", "1", "--no-progress"] + (BAD[case] if rank == 1 else [])
    if case == "absent":
        train.CONFIG_CHECK_TIMEOUT_S = 2.0
        if rank == 0:
            time.sleep(120)
            return 0
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
