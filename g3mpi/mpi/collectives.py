"""The collectives of the data tools (and any MPI program here), over a :class:`~.watchdog.Watchdog`: buffer-based
(never pickled), each with the watchdog's deadline, and the agreement of every rank on whether any rank failed.

Every function takes ``comm``: a :class:`~.watchdog.Watchdog` (the waits have its deadline) or a bare
communicator (the waits block, as :func:`as_watchdog` makes a watchdog without a deadline). ``what`` names the
phase in the one line a rank prints when its peers stop answering.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .watchdog import Watchdog

#: what a wait is called when the caller names nothing more precise
COLLECTIVE = "collective"


class RankFailed(Exception):
    """Some rank failed (every rank raises it after :func:`agree`): ``errs`` is every rank's error or None, in
    rank order (what :func:`g3mpi.mpi.report.report` says for the job)."""

    def __init__(self, errs: list[str | None]):
        super().__init__(next(e for e in errs if e is not None))
        self.errs = errs


def as_watchdog(comm) -> Watchdog:
    """``comm`` itself if it is a watchdog, else a watchdog without a deadline over the communicator ``comm``."""
    return comm if isinstance(comm, Watchdog) else Watchdog(comm, 0)


def set_phase(comm, phase: str) -> None:
    """Name the phase the waits from now on belong to (``"partitioning"``), for the line a deadline prints;
    nothing for a bare communicator."""
    if isinstance(comm, Watchdog):
        comm.context = phase


def allgather_text(comm, msg: str | None, what: str = "agreement") -> list[str | None]:
    """Every rank's ``msg`` (text or None), in rank order (:meth:`Watchdog.allgather_text`)."""
    return as_watchdog(comm).allgather_text(msg, what)


def agree(comm, err: str | None, what: str = "agreement") -> None:
    """Every rank learns whether any rank failed (``err``: this rank's error, or None); RankFailed on every rank
    if one did. Call it where every rank arrives, after work that may fail on some ranks only."""
    errs = allgather_text(comm, err, what)
    if any(e is not None for e in errs):
        raise RankFailed(errs)


def allreduce(comm, a: np.ndarray, op=MPI.SUM, what: str = COLLECTIVE) -> np.ndarray:
    """The element-wise reduction (``op``) of every rank's ``a``, a new array."""
    out = np.array(a, copy=True, order="C")
    as_watchdog(comm).allreduce(out, op=op, what=what)
    return out


def allgather_rows(comm, a: np.ndarray, what: str = COLLECTIVE) -> np.ndarray:
    """[R, *a.shape]: every rank's equally shaped array ``a``."""
    a = np.ascontiguousarray(a)
    out = np.empty((comm.size,) + a.shape, dtype=a.dtype)
    as_watchdog(comm).allgather(a, out, what)
    return out


def allgatherv(comm, a: np.ndarray, what: str = COLLECTIVE) -> tuple[np.ndarray, np.ndarray]:
    """(every rank's 1-D ``a`` concatenated in rank order, each rank's length)."""
    a = np.ascontiguousarray(a)
    sizes = allgather_rows(comm, np.array([a.size], dtype=np.int64), what)[:, 0]
    out = np.empty(int(sizes.sum()), dtype=a.dtype)
    as_watchdog(comm).allgatherv(a, [out, (sizes, displacements(sizes))], what)
    return out, sizes


def displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def alltoallv(comm, send: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray,
              what: str = COLLECTIVE) -> np.ndarray:
    """Alltoallv of the rows of ``send`` (grouped by destination rank, ``send_counts`` rows each); returns the
    rows received, grouped by source rank (``recv_counts`` rows each). Rows may be 2-D (features)."""
    send = np.ascontiguousarray(send)
    width = int(np.prod(send.shape[1:], dtype=np.int64))
    recv = np.empty((int(np.sum(recv_counts)),) + send.shape[1:], dtype=send.dtype)
    sc, rc = np.asarray(send_counts, np.int64) * width, np.asarray(recv_counts, np.int64) * width
    # (MPI counts are C ints: a rank's message to one peer is limited to 2**31 - 1 elements)
    as_watchdog(comm).alltoallv([send.reshape(-1), (sc, displacements(sc))],
                                [recv.reshape(-1), (rc, displacements(rc))], what)
    return recv


def exchange_counts(comm, send_counts: np.ndarray, what: str = COLLECTIVE) -> np.ndarray:
    """Alltoall of one count per rank pair: what each rank sends this one."""
    recv = np.empty(comm.size, dtype=np.int64)
    as_watchdog(comm).alltoall(np.ascontiguousarray(send_counts, dtype=np.int64), recv, what)
    return recv


def bcast_array(comm, a: np.ndarray, root: int = 0, what: str = COLLECTIVE) -> np.ndarray:
    """``root``'s array ``a`` (same shape and dtype on every rank) on every rank, in place."""
    as_watchdog(comm).bcast(a, root, what)
    return a


def barrier(comm, what: str = COLLECTIVE) -> None:
    as_watchdog(comm).barrier(what)


def rank_bounds(n: int, size: int) -> np.ndarray:
    """[R+1] boundaries of the ranks' contiguous row ranges (rank r owns rows bounds[r] .. bounds[r+1]-1)."""
    return np.array([r * n // size for r in range(size + 1)], dtype=np.int64)
