"""The MPI plumbing of the parallel partitioner (``g3-partition --method stream`` under mpiexec).

Ranks own contiguous row ranges of the graph file; :class:`GhostPlan` moves per-node values between a node's
owner and the ranks that hold it as a neighbour (a ghost). Control messages (errors) travel as UTF-8 text in byte
buffers, never pickled. Every helper takes the communicator: nothing here reads a launcher's environment.
"""
from __future__ import annotations

import resource

import numpy as np
from mpi4py import MPI


class RankFailed(Exception):
    """Some rank failed (every rank raises it after :func:`agree`): ``errs`` is every rank's error or None, in
    rank order (what :func:`g3mpi.mpi.report.report` says for the job)."""

    def __init__(self, errs: list[str | None]):
        super().__init__(next(e for e in errs if e is not None))
        self.errs = errs


def allgather_text(comm, msg: str | None) -> list[str | None]:
    """Every rank's ``msg`` (text or None), in rank order: Allgather of the sizes, Allgatherv of the UTF-8 bytes
    (a flag byte first, so that None and "" stay apart)."""
    data = np.frombuffer(b"\0" if msg is None else b"\1" + msg.encode("utf-8"), dtype=np.uint8)
    sizes = np.zeros(comm.size, dtype=np.int64)
    comm.Allgather(np.array([data.size], dtype=np.int64), sizes)
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    buf = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv([data, MPI.BYTE], [buf, (sizes, displs), MPI.BYTE])
    raw = [bytes(buf[d:d + n]) for d, n in zip(displs.tolist(), sizes.tolist())]
    return [None if r == b"\0" else r[1:].decode("utf-8") for r in raw]


def agree(comm, err: str | None) -> None:
    """Every rank learns whether any rank failed (``err``: this rank's error, or None); RankFailed on every rank
    if one did. Call it where every rank arrives, after work that may fail on some ranks only."""
    errs = allgather_text(comm, err)
    if any(e is not None for e in errs):
        raise RankFailed(errs)


def allreduce(comm, a: np.ndarray, op=MPI.SUM) -> np.ndarray:
    a = np.ascontiguousarray(a)
    out = np.empty_like(a)
    comm.Allreduce(a, out, op=op)
    return out


def allgather_rows(comm, a: np.ndarray) -> np.ndarray:
    """[R, *a.shape]: every rank's equally shaped array ``a``."""
    a = np.ascontiguousarray(a)
    out = np.empty((comm.size,) + a.shape, dtype=a.dtype)
    comm.Allgather(a, out)
    return out


def displacements(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def alltoallv(comm, send: np.ndarray, send_counts: np.ndarray, recv_counts: np.ndarray) -> np.ndarray:
    """Alltoallv of the rows of ``send`` (grouped by destination rank, ``send_counts`` rows each); returns the
    rows received, grouped by source rank (``recv_counts`` rows each). Rows may be 2-D (features)."""
    send = np.ascontiguousarray(send)
    width = int(np.prod(send.shape[1:], dtype=np.int64))
    recv = np.empty((int(np.sum(recv_counts)),) + send.shape[1:], dtype=send.dtype)
    sc, rc = np.asarray(send_counts, np.int64) * width, np.asarray(recv_counts, np.int64) * width
    # (MPI counts are C ints: a rank's message to one peer is limited to 2**31 - 1 elements)
    comm.Alltoallv([send.reshape(-1), (sc, displacements(sc))], [recv.reshape(-1), (rc, displacements(rc))])
    return recv


def exchange_counts(comm, send_counts: np.ndarray) -> np.ndarray:
    recv = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(np.ascontiguousarray(send_counts, dtype=np.int64), recv)
    return recv


def rank_bounds(n: int, size: int) -> np.ndarray:
    """[R+1] boundaries of the ranks' contiguous row ranges (rank r owns rows bounds[r] .. bounds[r+1]-1)."""
    return np.array([r * n // size for r in range(size + 1)], dtype=np.int64)


class GhostPlan:
    """Which of this rank's nodes each other rank holds as ghosts, set up once from the ghosts' global IDs
    (``ghosts``: sorted, outside this rank's range ``bounds[rank]:bounds[rank+1]``)."""

    def __init__(self, comm, bounds: np.ndarray, ghosts: np.ndarray):
        self.comm = comm
        self.num_ghosts = len(ghosts)
        self.recv_counts = np.diff(np.searchsorted(ghosts, bounds)).astype(np.int64)   # ghosts per owner
        self.send_counts = exchange_counts(comm, self.recv_counts)
        req = alltoallv(comm, np.asarray(ghosts, dtype=np.int64), self.recv_counts, self.send_counts)
        #: own local rows the other ranks hold, grouped by requesting rank, ascending within each
        self.requested = req - bounds[comm.rank]

    def pull(self, own: np.ndarray) -> np.ndarray:
        """The ghosts' values (in ``ghosts`` order) from their owners' ``own`` arrays."""
        return alltoallv(self.comm, own[self.requested], self.send_counts, self.recv_counts)

    def push_add(self, ghost_values: np.ndarray, own: np.ndarray) -> None:
        """Add every rank's ``ghost_values`` to their owners' ``own`` (in place)."""
        self.push_reduce(ghost_values, own, np.add)

    def push_reduce(self, ghost_values: np.ndarray, own: np.ndarray, ufunc) -> None:
        """Reduce every rank's ``ghost_values`` into their owners' ``own`` with ``ufunc`` (in place)."""
        got = alltoallv(self.comm, ghost_values, self.recv_counts, self.send_counts)
        ufunc.at(own, self.requested, got)


def peak_rss_mib() -> float:
    """This process's peak resident set size so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
