"""Communication watchdog: waits with a deadline, so a rank stuck on a neighbour ends the job instead of hanging.

A blocking ``Waitsome``/``Waitall`` on a request whose peer has stalled (a hung rank, a deadlock, a lost node)
never returns, and the whole allocation burns. With a watchdog the waits of the halo exchange (forward and
backward, every layer) and of the gradient allreduce become polling loops: ``Testsome``/``Testall`` with
short sleeps (a few microseconds growing to at most ``MAX_SLEEP_S``), and a deadline. When a wait has lasted
longer than ``timeout`` seconds, the rank prints one line naming itself, the neighbour(s) it waits for, the
exchange (layer) and the direction, and aborts the communicator (which ends every rank of the job).

The start-up checks and the writing of the outputs use the watchdog's collectives and point-to-point calls
(:meth:`Watchdog.barrier`, :meth:`~Watchdog.alltoall`, :meth:`~Watchdog.allgather_text`,
:meth:`~Watchdog.bcast_text`, :meth:`~Watchdog.send_text`, :meth:`~Watchdog.recv_text`): with a deadline they are
the non-blocking calls polled to completion, so one rank stopped anywhere before, during or after training ends
the job too. A collective cannot tell which rank never arrived; a point-to-point wait names it.

Those control messages are an error message or nothing: they travel as text (:func:`encode_text`: a flag byte,
then UTF-8), in byte buffers whose length goes first or is probed, never pickled, so no rank unpickles what
another sent (the project's rule for anything read, as for checkpoints).

``timeout <= 0`` disables it: the plain blocking calls are used and nothing changes.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .abort import abort_job

#: longest sleep between two polls (the latency a polled wait can add)
MAX_SLEEP_S = 200e-6
#: polls before the first sleep
SPIN = 50


def encode_text(msg: str | None) -> np.ndarray:
    """``msg`` (text or None) as the uint8 buffer :func:`decode_text` reads back: a flag byte (1: text follows,
    0: None, so that None stays apart from ``""``), then the text's UTF-8 bytes. The one encoding of the control
    messages. Writable, since a ``Bcast`` root's buffer is also a receive buffer."""
    raw = b"\0" if msg is None else b"\1" + msg.encode("utf-8")
    return np.frombuffer(bytearray(raw), dtype=np.uint8)


def decode_text(buf: np.ndarray) -> str | None:
    """The text (or None) of a buffer written by :func:`encode_text`."""
    raw = bytes(buf)
    if raw == b"\0":
        return None
    if raw[:1] != b"\1":   # not ours: a message matched on the wrong tag would otherwise read as garbage text
        raise ValueError(f"not a watchdog text message ({len(raw)} bytes, flag {raw[:1]!r})")
    return raw[1:].decode("utf-8")


class Watchdog:
    """Deadline-bounded waits for one rank. ``context`` (e.g. ``"epoch 12"``) is added to the message. ``abort``
    (a callable taking the exit code) replaces ``comm.Abort`` in tests. ``limit``: what the message names as the
    deadline's setting; ``code``: the exit status of the job it ends."""

    def __init__(self, comm, timeout: float, prog: str = "g3mpi", abort=None, limit: str = "--comm-timeout",
                 code: int = 1):
        self.comm = comm
        self.timeout = float(timeout)
        self.prog = prog
        self.context = ""
        self._abort = abort
        self.limit = limit
        self.code = code

    @property
    def active(self) -> bool:
        return self.timeout > 0

    # -- waits ----------------------------------------------------------------------------------------------
    def _poll(self, test, describe, turns: int = 1):
        """Call ``test()`` (returning ``(done, value)``) until done; fire after ``turns`` x ``timeout`` seconds
        (``turns``: how many other ranks' steps the wait legitimately spans, e.g. the turns before one's own)."""
        limit = self.timeout * max(1, turns)
        t0 = time.monotonic()
        sleep, n = 0.0, 0
        while True:
            done, got = test()
            if done:
                return got
            n += 1
            if n > SPIN:
                sleep = min(MAX_SLEEP_S, max(5e-6, 2 * sleep))
                time.sleep(sleep)
            if n % 64 == 0 and time.monotonic() - t0 > limit:
                self.fire(describe(time.monotonic() - t0))

    def waitsome(self, reqs: list, peers: list, what: str) -> list:
        """``MPI.Request.Waitsome(reqs)`` with a deadline; ``peers[i]`` is the rank request i waits for."""
        if not self.active:
            return MPI.Request.Waitsome(reqs)

        def test():
            idx = MPI.Request.Testsome(reqs)
            return idx is None or len(idx) > 0, idx   # None: no active request left (as Waitsome)

        def describe(waited):
            pending = sorted({peers[i] for i, r in enumerate(reqs) if r != MPI.REQUEST_NULL and not r.Test()})
            return self._message(waited, pending, what)
        return self._poll(test, describe)

    def waitall(self, reqs: list, peers: list, what: str) -> None:
        """``MPI.Request.Waitall(reqs)`` with a deadline."""
        if not self.active:
            MPI.Request.Waitall(reqs)
            return

        def describe(waited):
            pending = sorted({peers[i] for i, r in enumerate(reqs) if r != MPI.REQUEST_NULL and not r.Test()})
            return self._message(waited, pending, what)
        self._poll(lambda: (MPI.Request.Testall(reqs), None), describe)

    def wait_collective(self, reqs: list, what: str, turns: int = 1) -> None:
        """Wait for non-blocking collectives (every rank takes part) with a deadline (``turns`` x the timeout)."""
        if not self.active:
            MPI.Request.Waitall(reqs)
            return
        self._poll(lambda: (MPI.Request.Testall(reqs), None),
                   lambda waited: self._message(waited, None, what, turns), turns)

    def _collective(self, call: str, *args, what: str, turns: int = 1, **kw) -> None:
        """``comm.<call>(*args, **kw)`` (a buffer collective, e.g. ``"Bcast"``); with a deadline (``turns`` x the
        timeout), its non-blocking twin (``Ibcast``) polled to completion."""
        if not self.active:
            getattr(self.comm, call)(*args, **kw)
            return
        self.wait_collective([getattr(self.comm, "I" + call.lower())(*args, **kw)], what, turns)

    def allreduce(self, buf, op=MPI.SUM, what: str = "gradient allreduce") -> None:
        """In-place ``Allreduce`` of a numpy buffer; with a deadline, a non-blocking one polled to completion."""
        self._collective("Allreduce", MPI.IN_PLACE, buf, op=op, what=what)

    def gather(self, sendbuf, recvbuf, root: int, what: str) -> None:
        """``Gather`` of numpy buffers to ``root``; with a deadline, ``Igather`` polled to completion."""
        self._collective("Gather", sendbuf, recvbuf, root=root, what=what)

    def barrier(self, what: str) -> None:
        """``Barrier``; with a deadline, ``Ibarrier`` polled to completion."""
        self._collective("Barrier", what=what)

    def alltoall(self, sendbuf, recvbuf, what: str) -> None:
        """``Alltoall`` of numpy buffers; with a deadline, ``Ialltoall`` polled to completion."""
        self._collective("Alltoall", sendbuf, recvbuf, what=what)

    def alltoallv(self, sendspec, recvspec, what: str) -> None:
        """``Alltoallv`` of numpy buffer specs (``[buf, (counts, displs), type]``); with a deadline, ``Ialltoallv``
        polled to completion."""
        self._collective("Alltoallv", sendspec, recvspec, what=what)

    def exscan(self, buf, what: str) -> None:
        """In-place exclusive prefix sum over the ranks of a numpy buffer (rank 0 gets zeros, which MPI leaves
        undefined); with a deadline, ``Iexscan`` polled to completion."""
        if self.comm.size > 1:
            self._collective("Exscan", MPI.IN_PLACE, buf, op=MPI.SUM, what=what)
        if self.comm.rank == 0:
            buf[...] = 0

    def allgather_text(self, msg: str | None, what: str) -> list[str | None]:
        """Every rank's ``msg`` (text or None), in rank order: ``Allgather`` of the encoded sizes, then
        ``Allgatherv`` of the bytes (with a deadline, ``Iallgather`` and ``Iallgatherv`` polled to completion)."""
        data = encode_text(msg)
        sizes = np.zeros(self.comm.size, dtype=np.int64)
        self._collective("Allgather", np.array([data.size], dtype=np.int64), sizes, what=what)
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        buf = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._collective("Allgatherv", [data, MPI.BYTE], [buf, (sizes, displs), MPI.BYTE], what=what)
        return [decode_text(buf[d:d + n]) for d, n in zip(displs.tolist(), sizes.tolist())]

    def bcast_text(self, msg: str | None, root: int, what: str, turns: int = 1) -> str | None:
        """``root``'s ``msg`` (text or None) on every rank: ``Bcast`` of the encoded size, then of the bytes (with
        a deadline of ``turns`` x the timeout, ``Ibcast`` polled to completion). Like every collective it cannot
        name the rank that never arrived (a broadcast may pass through other ranks than ``root``): say in
        ``what`` what ``root`` does before it."""
        mine = self.comm.rank == root
        data = encode_text(msg) if mine else None
        n = np.array([data.size if mine else 0], dtype=np.int64)
        self._collective("Bcast", n, root=root, what=what, turns=turns)
        buf = data if mine else np.empty(int(n[0]), dtype=np.uint8)
        self._collective("Bcast", [buf, MPI.BYTE], root=root, what=what, turns=turns)
        return msg if mine else decode_text(buf)

    def send_text(self, msg: str | None, dest: int, tag: int, what: str) -> None:
        """``Send`` of ``msg`` (text or None) to ``dest``; with a deadline, ``Isend`` waited for with
        :meth:`waitall` (which names ``dest``)."""
        data = encode_text(msg)
        if not self.active:
            self.comm.Send([data, MPI.BYTE], dest=dest, tag=tag)
            return
        self.waitall([self.comm.Isend([data, MPI.BYTE], dest=dest, tag=tag)], [dest], what)

    def recv_text(self, source: int, tag: int, what: str, turns: int = 1) -> str | None:
        """The text (or None) that ``source`` sent with :meth:`send_text`: ``Mprobe`` for its length, then the
        matched ``Recv``. With a deadline (``turns`` x the timeout: e.g. the turns of the ranks before this one),
        ``Improbe`` polled until the message is there; a rank that waits too long names ``source``."""
        status = MPI.Status()
        if not self.active:
            matched = self.comm.Mprobe(source=source, tag=tag, status=status)
        else:
            def test():
                m = self.comm.Improbe(source=source, tag=tag, status=status)
                return m is not None, m
            matched = self._poll(test, lambda waited: self._message(waited, [source], what, turns), turns)
        buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
        matched.Recv([buf, MPI.BYTE])
        return decode_text(buf)

    # -- firing ---------------------------------------------------------------------------------------------
    def _message(self, waited: float, peers, what: str, turns: int = 1) -> str:
        if "." in what and what.rsplit(".", 1)[1] in ("fwd", "bwd"):
            layer, d = what.rsplit(".", 1)
            what = f"halo exchange of layer {layer!r}, {'forward' if d == 'fwd' else 'backward'} direction"
        if peers is None:
            who = "the other ranks (some rank never arrived)"
        elif peers:
            who = ("rank " if len(peers) == 1 else "ranks ") + ", ".join(map(str, peers))
        else:
            who = "a neighbour"
        ctx = f", {self.context}" if self.context else ""
        limit = f"{self.limit} {self.timeout:g}" + (f" x {turns} turns" if turns > 1 else "")
        return (f"communication timeout: blocked {waited:.1f} s ({limit}) waiting for {who} in the {what}{ctx}; "
                "aborting the job")

    def fire(self, message: str) -> None:
        abort_job(self.comm, f"{self.prog}: error: [rank {self.comm.rank}] {message}", self.code, abort=self._abort)
        raise SystemExit(self.code)  # only reached when a test replaces the abort
