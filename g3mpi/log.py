"""Logging with the MPI rank in every line (the rank comes from the injected communicator, never the launcher)."""
from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s [rank %(rank)s/%(size)s] %(levelname)s %(name)s: %(message)s"


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
