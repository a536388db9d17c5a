"""Moved to :mod:`g3mpi.mpi.termination` (the torch-free MPI base); this name stays for existing imports."""
from g3mpi.mpi.termination import (SIGNALS, Terminated, exit_after_failed_write, interruption, raise_if_terminated,
                                   terminate_as_interrupt)

__all__ = ["SIGNALS", "Terminated", "exit_after_failed_write", "interruption", "raise_if_terminated",
           "terminate_as_interrupt"]
