"""Moved to :mod:`g3mpi.mpi.stop` (the torch-free MPI base); this name stays for existing imports."""
from g3mpi.mpi.stop import EXIT_STOPPED, REPEAT_WINDOW, STOP_SIGNALS, STOP_SLOTS, StopSignals

__all__ = ["EXIT_STOPPED", "REPEAT_WINDOW", "STOP_SIGNALS", "STOP_SLOTS", "StopSignals"]
