"""Ghost plans: per-node values moved between a node's owner and the ranks that hold it as a neighbour (a ghost),
for ranks that own contiguous row ranges of a graph (the parallel partitioner and builder)."""
from __future__ import annotations

import numpy as np

from .collectives import alltoallv, exchange_counts

#: the phase a ghost exchange names when a peer stops answering
WAIT = "ghost exchange"


class GhostPlan:
    """Which of this rank's nodes each other rank holds as ghosts, set up once from the ghosts' global IDs
    (``ghosts``: sorted, outside this rank's range ``bounds[rank]:bounds[rank+1]``). ``comm``: a communicator or a
    :class:`~.watchdog.Watchdog` over one (its deadline bounds every exchange)."""

    def __init__(self, comm, bounds: np.ndarray, ghosts: np.ndarray):
        self.comm = comm
        self.num_ghosts = len(ghosts)
        self.recv_counts = np.diff(np.searchsorted(ghosts, bounds)).astype(np.int64)   # ghosts per owner
        self.send_counts = exchange_counts(comm, self.recv_counts, WAIT)
        req = alltoallv(comm, np.asarray(ghosts, dtype=np.int64), self.recv_counts, self.send_counts, WAIT)
        #: own local rows the other ranks hold, grouped by requesting rank, ascending within each
        self.requested = req - bounds[comm.rank]

    def pull(self, own: np.ndarray) -> np.ndarray:
        """The ghosts' values (in ``ghosts`` order) from their owners' ``own`` arrays."""
        return alltoallv(self.comm, own[self.requested], self.send_counts, self.recv_counts, WAIT)

    def push_add(self, ghost_values: np.ndarray, own: np.ndarray) -> None:
        """Add every rank's ``ghost_values`` to their owners' ``own`` (in place)."""
        self.push_reduce(ghost_values, own, np.add)

    def push_reduce(self, ghost_values: np.ndarray, own: np.ndarray, ufunc) -> None:
        """Reduce every rank's ``ghost_values`` into their owners' ``own`` with ``ufunc`` (in place)."""
        got = alltoallv(self.comm, ghost_values, self.recv_counts, self.send_counts, WAIT)
        ufunc.at(own, self.requested, got)
