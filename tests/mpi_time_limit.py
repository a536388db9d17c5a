"""MPI helper for tests/test_train_stops.py: g3-train's ``--time-limit`` when the ranks' clocks disagree.

mpiexec -n P python -m mpi4py -m tests.mpi_time_limit G3-TRAIN-ARGS...
Each rank times the limit from its own start, and the ranks start a few milliseconds apart, so at an epoch end
the limit can have passed on some ranks only. Here the last rank's clock is made to start an hour early, so that
its limit has passed at the first epoch end while everyone else's has not: the run must still stop there and say
it was the time limit (not "a stop signal"). Exits with g3-train's status.
"""
from __future__ import annotations

import sys

from mpi4py import MPI

from g3mpi.cli import train
from g3mpi.mpi import stop

if MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1:
    _stop_after = stop.StopSignals.stop_after

    def _early_clock(self, seconds):
        self._started -= 3600.0
        _stop_after(self, seconds)

    stop.StopSignals.stop_after = _early_clock

sys.exit(train.main(sys.argv[1:]))
