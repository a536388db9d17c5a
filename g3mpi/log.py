"""Logging with the MPI rank in every line (the rank comes from the injected communicator, never the launcher), and
the data tools' ``PROG: [warning: ]message`` lines (:func:`setup_tool_logging`)."""
from __future__ import annotations

import logging
import os
import socket
import sys

_FORMAT = "%(asctime)s [rank %(rank)s/%(size)s] %(levelname)s %(name)s: %(message)s"


def node_name() -> str:
    """The node this process runs on, for the log: SLURM's node name where slurmd started it (several slurmd may
    share a host, as on the local test cluster), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


class _RankFilter(logging.Filter):
    def __init__(self, rank: int, size: int):
        super().__init__()
        self.rank, self.size = rank, size

    def filter(self, record):
        record.rank, record.size = self.rank, self.size
        return True


def setup_logging(comm, level: str = "INFO", name: str = "g3mpi") -> logging.Logger:
    """Configure the ``g3mpi`` logger for this rank: stderr, rank-prefixed lines. Idempotent."""
    log = logging.getLogger(name)
    for h in list(log.handlers):
        if getattr(h, "_g3mpi", False):
            log.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h._g3mpi = True
    h.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    h.addFilter(_RankFilter(comm.rank, comm.size))
    log.addHandler(h)
    log.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    log.propagate = False
    return log


class _ToolFormatter(logging.Formatter):
    """``PROG: message``, ``PROG: warning: message`` from WARNING up: the lines of the data tools' own
    ``print``\\ ed warnings, for what the library logs (g3mpi.format's warnings, e.g. features too large)."""

    def __init__(self, prog: str):
        super().__init__("%(message)s")
        self.prog = prog

    def format(self, record):
        return f"{self.prog}: {'warning: ' if record.levelno >= logging.WARNING else ''}{super().format(record)}"


def setup_tool_logging(prog: str, level: int = logging.WARNING) -> None:
    """Log to stderr for the command ``prog`` (g3-prepare, g3-partition, g3-inspect) at ``level``; a no-op where
    the root logger has handlers already (``logging.basicConfig``: a test's log capture)."""
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(_ToolFormatter(prog))
    logging.basicConfig(level=level, handlers=[h])
