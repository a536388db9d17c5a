"""Moved to :mod:`g3mpi.mpi.watchdog` (the torch-free MPI base); this name stays for existing imports."""
from g3mpi.mpi.deadline import DEFAULT_FACTOR, DEFAULT_FLOOR_S, EXIT_STALLED, Deadline
from g3mpi.mpi.watchdog import MAX_SLEEP_S, SPIN, Watchdog, decode_text, encode_text

__all__ = ["DEFAULT_FACTOR", "DEFAULT_FLOOR_S", "EXIT_STALLED", "MAX_SLEEP_S", "SPIN", "Deadline", "Watchdog",
           "decode_text", "encode_text"]
