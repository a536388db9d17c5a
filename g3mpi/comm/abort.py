"""Moved to :mod:`g3mpi.mpi.abort` (the torch-free MPI base); this name stays for existing imports."""
from g3mpi.mpi.abort import DRAIN_TIMEOUT_S, FORWARD_GRACE_S, abort_job, unread_bytes, wait_stderr_read, write_line

__all__ = ["DRAIN_TIMEOUT_S", "FORWARD_GRACE_S", "abort_job", "unread_bytes", "wait_stderr_read", "write_line"]
