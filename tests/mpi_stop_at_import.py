"""MPI helper for tests/test_train_stops.py: a stop signal that reaches g3-train while it imports torch.

mpiexec -n P python -m mpi4py -m tests.mpi_stop_at_import G3-TRAIN-ARGS...
Importing torch (with what g3-train imports beside it) is most of a rank's start-up: seconds, more on a busy node or
a shared file system, so a time limit's SIGUSR1 often lands there. Here every rank sends itself SIGUSR1 as its first
import of torch begins: after MPI_Init, which installs MPICH's own SIGUSR1 handler, and before anything of g3-train
that needs torch. Exits with g3-train's status.
"""
from __future__ import annotations

import os
import signal
import sys

from g3mpi.cli import train


class _SignalAtImport:
    """A finder on ``sys.meta_path`` that finds nothing: it only sends SIGUSR1 at the first import of torch."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGUSR1)
        return None


if "torch" in sys.modules:
    raise SystemExit("tests.mpi_stop_at_import: torch was imported before g3-train started")
sys.meta_path.insert(0, _SignalAtImport())
sys.exit(train.main(sys.argv[1:]))
