"""Communication watchdog: waits with a deadline, so a rank stuck on a peer ends the job instead of hanging.

A blocking ``Waitsome``/``Waitall`` on a request whose peer has stalled (a hung rank, a node that swaps, a lost
node, a filesystem that hangs) never returns, and the whole allocation burns. With a watchdog every wait for
another rank (the halo exchange, the gradient allreduce, the start-up checks, the outputs, the data tools'
collectives) is a polling loop over ``Testsome``/``Testall``/``Improbe`` and a deadline. When a wait has lasted
longer than the deadline, the rank prints one line naming itself, the rank(s) it waits for (a collective names
those that do not answer a roll call) and the phase, and aborts the communicator with ``EXIT_STALLED``.

**Deadlines** (:class:`~.deadline.Deadline`): fixed (``--comm-timeout S``), off (``0``: the plain blocking
calls), or adaptive, the default: before the first steps (loading, planning) ``max(floor, bytes /
STARTUP_BYTES_PER_S)`` for the largest input a peer reads (:meth:`Watchdog.expect_input`); once ``WARMUP_STEPS``
steps (epochs) have been timed (:meth:`Watchdog.step_done`), ``max(floor, factor x the slowest step seen)``.

**Quiet waits**: :data:`SPIN` polls back to back, then sleeps that double from :data:`MIN_SLEEP_S` up to
:data:`SHORT_SLEEP_S` while the wait is no longer than :data:`QUIET_AFTER_S` or the slowest epoch, then up to
``min(MAX_SLEEP_S, SLEEP_SHARE x the time waited beyond that)``: a legitimate wait keeps its latency and the MPI
progress its messages need, a stalled peer costs a waiting rank a few % of a core at most.

**Signals and orphans**: a stop signal (``stop``: a :class:`~g3mpi.mpi.stop.StopSignals`) that arrived while a
wait has lasted :data:`SIGNAL_GRACE_S` (or two of the slowest epochs) more ends the job (the peers cannot agree on
a checkpoint; the last one stays valid); SIGINT raises ``KeyboardInterrupt`` inside the loop. A rank whose parent
(the launcher's proxy) went away exits with ``EXIT_STALLED`` within :data:`ORPHAN_CHECK_S`.

The control messages of the collectives and point-to-point calls here are an error message or nothing: they
travel as text (:func:`encode_text`: a flag byte, then UTF-8), in byte buffers whose length goes first or is
probed, never pickled, so no rank unpickles what another sent (the project's rule for anything read).
"""
from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from .abort import abort_job, write_line
from .deadline import DEFAULT_FACTOR, DEFAULT_FLOOR_S, EXIT_STALLED, Deadline

#: polls before the first sleep
SPIN = 50
#: first sleep after the spin; each sleep doubles it
MIN_SLEEP_S = 5e-6
#: the longest sleep of a short wait (the latency a polled wait can add)
SHORT_SLEEP_S = 200e-6
#: a wait keeps its sleeps short for this long, and at least as long as the slowest step (epoch) seen: MPI moves
#: a large message only inside the calls that poll it (no progress thread), so a legitimate wait polls often
QUIET_AFTER_S = 1.0
#: past that, a sleep is at most this share of the time waited beyond it (the latency a long wait can add), and at
#: most MAX_SLEEP_S: a rank waiting 20 s on a stopped peer polls a few thousand times
SLEEP_SHARE = 0.02
MAX_SLEEP_S = 0.02
#: seconds a wait goes on after a stop signal arrived before it gives up on its peers, at least (and at least two
#: of the slowest epochs seen: a live job reaches its epoch end, where the ranks agree on the stop, within them)
SIGNAL_GRACE_S = 5.0
#: how often a waiting rank checks that its launcher is still there, seconds
ORPHAN_CHECK_S = 1.0
#: the roll call that names the ranks missing from a collective when its deadline passes: a rank about to fire
#: asks every other rank (one byte each, these tags, above any the exchanges use); a rank inside a polled wait
#: answers within ROLL_CALL_EVERY_S; those that did not within ROLL_CALL_WAIT_S are named
ROLL_CALL_TAG, ROLL_ANSWER_TAG = 32001, 32002
ROLL_CALL_EVERY_S = 0.25
ROLL_CALL_WAIT_S = 1.5


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
    """Deadline-bounded waits for one rank. ``timeout``: seconds (> 0), 0 (off: the plain blocking calls) or < 0
    (adaptive, :class:`Deadline`, with ``floor`` and ``factor``). ``context`` (e.g. ``"epoch 12"``) is added to
    the message. ``abort`` (a callable taking the exit code) replaces ``comm.Abort`` in tests. ``limit``: what
    the message names as the deadline's setting; ``code``: the exit status of the job it ends. ``stop``: the
    rank's :class:`~g3mpi.mpi.stop.StopSignals` (anything with ``signal_name`` and ``received_at``), whose
    signals end a wait on peers that do not come (:data:`SIGNAL_GRACE_S`). ``rank`` and ``size`` are the
    communicator's, so that the data tools pass a watchdog where they passed a communicator."""

    def __init__(self, comm, timeout: float, prog: str = "g3mpi", abort=None, limit: str = "--comm-timeout",
                 code: int = EXIT_STALLED, stop=None, floor: float = DEFAULT_FLOOR_S,
                 factor: float = DEFAULT_FACTOR):
        self.comm = comm
        self.deadline = Deadline(timeout, floor, factor)
        self.prog = prog
        self.context = ""
        self._abort = abort
        self.limit = limit
        self.code = code
        self.stop = stop
        self._ppid = os.getppid()
        self._byte = np.ones(1, dtype=np.uint8)
        self._answers: list = []   # roll-call answers in flight (their requests keep them alive)

    @property
    def timeout(self) -> float:
        """The deadline of a wait now, seconds (0: off)."""
        return self.deadline.seconds

    @property
    def active(self) -> bool:
        return self.timeout > 0

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    def expect_input(self, nbytes: int) -> None:
        """The largest input a rank reads and plans before its first step is ``nbytes`` (the adaptive start-up
        deadline grows with it)."""
        self.deadline.expect_input(nbytes)

    def step_done(self, seconds: float) -> None:
        """A step (an epoch, with its evaluation and checkpoint) took ``seconds`` (the adaptive deadline follows
        the slowest)."""
        self.deadline.step_done(seconds)
        if hasattr(self.stop, "slowest_step"):   # its watcher gives the normal stop two of them
            self.stop.slowest_step = self.deadline.slowest

    # -- waits ----------------------------------------------------------------------------------------------
    def _poll(self, test, describe, turns: int = 1):
        """Call ``test()`` (returning ``(done, value)``) until done, quietly (spin, then sleeps that grow with the
        wait); fire after ``turns`` x the deadline (``turns``: how many other ranks' steps the wait legitimately
        spans, e.g. the turns before one's own), after a stop signal's grace, or when the launcher is gone."""
        limit = self.timeout * max(1, turns)
        t0 = time.monotonic()
        sleep, n, orphan_at, answer_at = 0.0, 0, t0 + ORPHAN_CHECK_S, t0 + ROLL_CALL_EVERY_S
        while True:
            done, got = test()
            if done:
                return got
            n += 1
            if n <= SPIN:
                continue
            now = time.monotonic()
            waited = now - t0
            longer = waited - max(QUIET_AFTER_S, self.deadline.slowest)   # > 0: not a legitimate wait, likely
            cap = SHORT_SLEEP_S if longer <= 0 else max(SHORT_SLEEP_S, min(MAX_SLEEP_S, SLEEP_SHARE * longer))
            sleep = min(cap, max(MIN_SLEEP_S, 2 * sleep))
            time.sleep(sleep)
            if waited > limit:
                self.fire(describe(waited))
            self._check_signal(t0, now, describe)
            if now > orphan_at:
                orphan_at = now + ORPHAN_CHECK_S
                self._check_orphan(describe, waited)
            if now > answer_at:
                answer_at = now + ROLL_CALL_EVERY_S
                self._answer_roll_call()

    def _answer_roll_call(self) -> None:
        """Answer every roll call that arrived: this rank is waiting for its peers."""
        self._answers = [r for r in self._answers if not r.Test()]
        status = MPI.Status()
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=ROLL_CALL_TAG, status=status):
            src = status.Get_source()
            self.comm.Recv([np.empty(1, dtype=np.uint8), MPI.BYTE], source=src, tag=ROLL_CALL_TAG)
            self._answers.append(self.comm.Isend([self._byte, MPI.BYTE], dest=src, tag=ROLL_ANSWER_TAG))

    def _roll_call(self) -> list[int]:
        """The other ranks that do not answer within :data:`ROLL_CALL_WAIT_S`: not waiting with this one (stopped,
        hung, or still computing)."""
        comm = self.comm
        others = [r for r in range(comm.size) if r != comm.rank]
        calls = [comm.Isend([self._byte, MPI.BYTE], dest=r, tag=ROLL_CALL_TAG) for r in others]
        got = {r: np.zeros(1, dtype=np.uint8) for r in others}
        answers = {r: comm.Irecv([got[r], MPI.BYTE], source=r, tag=ROLL_ANSWER_TAG) for r in others}
        end = time.monotonic() + ROLL_CALL_WAIT_S
        pending = dict(answers)
        while pending and time.monotonic() < end:
            self._answer_roll_call()   # (the others may call too)
            pending = {r: q for r, q in pending.items() if not q.Test()}
            time.sleep(0.01)
        for q in pending.values():
            q.Cancel()
        del calls   # (sent eagerly, or lost with the job: it ends)
        return sorted(pending)

    def _check_signal(self, t0: float, now: float, describe) -> None:
        """Give up on the peers once a stop signal has waited :data:`SIGNAL_GRACE_S` within this wait."""
        stop = self.stop
        if stop is None or stop.signal_name is None:
            return
        if now - max(t0, stop.received_at) > max(SIGNAL_GRACE_S, 2 * self.deadline.slowest):
            self.fire(describe(now - t0).replace("communication timeout:", f"{stop.signal_name} received:", 1)
                      .replace("aborting the job", "the ranks cannot agree on a stop; aborting the job (the last "
                               "checkpoint stays valid)"))

    def _check_orphan(self, describe, waited: float) -> None:
        """Exit at once when this rank's parent (the launcher or its proxy) is gone: nobody will end it."""
        if os.getppid() != self._ppid:
            write_line(f"{self.prog}: error: [rank {self.comm.rank}] its launcher is gone (parent process "
                       f"{self._ppid} exited) after waiting {waited:.1f} s for its peers{self._where()}; exiting")
            os._exit(self.code)

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

    def allgather(self, sendbuf, recvbuf, what: str) -> None:
        """``Allgather`` of numpy buffers."""
        self._collective("Allgather", sendbuf, recvbuf, what=what)

    def allgatherv(self, sendbuf, recvbuf, what: str) -> None:
        """``Allgatherv`` of numpy buffers (``recvbuf``: ``[buf, (counts, displs), type]``)."""
        self._collective("Allgatherv", sendbuf, recvbuf, what=what)

    def alltoallv(self, sendbuf, recvbuf, what: str) -> None:
        """``Alltoallv`` of numpy buffers (``[buf, (counts, displs)]`` each)."""
        self._collective("Alltoallv", sendbuf, recvbuf, what=what)

    def exscan(self, buf, what: str) -> None:
        """In-place exclusive prefix sum over the ranks of a numpy buffer (rank 0 gets zeros, which MPI leaves
        undefined); with a deadline, ``Iexscan`` polled to completion."""
        if self.comm.size > 1:
            self._collective("Exscan", MPI.IN_PLACE, buf, op=MPI.SUM, what=what)
        if self.comm.rank == 0:
            buf[...] = 0

    def bcast(self, buf, root: int, what: str, turns: int = 1) -> None:
        """``Bcast`` of a numpy buffer from ``root``."""
        self._collective("Bcast", buf, root=root, what=what, turns=turns)

    def gatherv(self, sendbuf, recvbuf, root: int, what: str) -> None:
        """``Gatherv`` of numpy buffers to ``root`` (``recvbuf`` None on the others)."""
        self._collective("Gatherv", sendbuf, recvbuf, root=root, what=what)

    def send(self, buf, dest: int, tag: int, what: str) -> None:
        """``Send`` of a numpy buffer; with a deadline, ``Isend`` waited for with :meth:`waitall`."""
        if not self.active:
            self.comm.Send(buf, dest=dest, tag=tag)
            return
        self.waitall([self.comm.Isend(buf, dest=dest, tag=tag)], [dest], what)

    def recv(self, buf, source: int, tag: int, what: str, turns: int = 1) -> None:
        """``Recv`` into a numpy buffer; with a deadline (``turns`` x the timeout), ``Irecv`` polled (names
        ``source``)."""
        if not self.active:
            self.comm.Recv(buf, source=source, tag=tag)
            return
        req = self.comm.Irecv(buf, source=source, tag=tag)
        self._poll(lambda: (req.Test(), None), lambda waited: self._message(waited, [source], what, turns), turns)

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
        if peers is None and self.comm.size == 2:   # a collective of two: the other rank never arrived
            peers = [1 - self.comm.rank]
        elif peers is None:   # a collective: the ranks that do not answer a roll call are not waiting in it
            peers = self._roll_call() or None
        if peers is None:
            who = "the other ranks (every rank answers, yet the collective does not complete: a mismatch?)"
        elif peers:
            who = ("rank " if len(peers) == 1 else "ranks ") + ", ".join(map(str, peers))
        else:
            who = "a neighbour"
        ctx = f", {self.context}" if self.context else ""
        limit = self.deadline.describe(self.limit) + (f" x {turns} turns" if turns > 1 else "")
        return (f"communication timeout: blocked {waited:.1f} s ({limit}) waiting for {who} in the {what}{ctx}; "
                "aborting the job")

    def _where(self) -> str:
        return f", {self.context}" if self.context else ""

    def fire(self, message: str) -> None:
        abort_job(self.comm, f"{self.prog}: error: [rank {self.comm.rank}] {message}", self.code, abort=self._abort)
        raise SystemExit(self.code)  # only reached when a test replaces the abort
