"""Halo exchange between neighbouring ranks: plan once, execute every layer, free at the end.

The shape follows mpi4py-fft's ``Transfer``: buffers and persistent requests are created once per
(part, message width, exchange) and started every time. Only ranks that share a boundary talk to each other.

Forward (owners -> halos): each send neighbour q gets ``h_own[send_rows_q]`` gathered into a contiguous send
buffer; the message from receive neighbour p lands directly in p's slice of the halo buffer (the part format
groups halo rows by owner, so a slice is contiguous). Backward (halos -> owners): the gradient of the halo
slice of p goes back to p, which sums it into the rows it sent (see ``g3mpi.ops``).

Every exchange owns distinct tags (4 per exchange: forward data/arrival stamp, backward data/stamp), so messages
of different layers or directions can never match each other; MPI's non-overtaking rule keeps successive
epochs of one exchange in order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .simnet import SimNet

#: sleep between polls while blocked on messages
POLL_SLEEP_S = 50e-6


@dataclass
class CommStats:
    """Counters of one rank, reset by the trainer every epoch."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    messages_sent: int = 0
    blocked_s: float = 0.0   # wall time spent waiting for messages that had not landed
    comm_s: float = 0.0      # per transfer: posting to last landing, summed over transfers
    per_exchange: dict = field(default_factory=dict)  # transfer name -> {counter: value}

    def add(self, name: str, counter: str, value) -> None:
        d = self.per_exchange.setdefault(name, {})
        d[counter] = d.get(counter, 0) + value

    def reset(self) -> None:
        self.bytes_sent = self.bytes_recv = self.messages_sent = 0
        self.blocked_s = self.comm_s = 0.0
        self.per_exchange = {}

    def as_dict(self) -> dict:
        return dict(bytes_sent=self.bytes_sent, bytes_recv=self.bytes_recv, messages_sent=self.messages_sent,
                    blocked_s=self.blocked_s, comm_s=self.comm_s,
                    overlap=(1.0 - self.blocked_s / self.comm_s) if self.comm_s > 0 else None)


@dataclass
class HaloPlan:
    """Who sends what to whom, derived once from a part file (numpy only)."""

    num_owned: int
    num_halo: int
    recv_parts: list          # [k] neighbour ranks we receive halo rows from, increasing
    recv_offsets: np.ndarray  # [k+1] halo-row offsets of their slices
    send_parts: list          # [k'] neighbour ranks that need our rows, increasing
    send_idx: list            # [k'] int64 arrays of owned local rows, in the order of the peer's halo slice

    @classmethod
    def from_part(cls, part) -> "HaloPlan":
        so = np.asarray(part.send_offsets, dtype=np.int64)
        rows = np.asarray(part.send_rows, dtype=np.int64)
        return cls(num_owned=int(part.num_owned), num_halo=int(part.num_halo),
                   recv_parts=[int(p) for p in part.recv_parts], recv_offsets=np.asarray(part.recv_offsets, np.int64),
                   send_parts=[int(p) for p in part.send_parts],
                   send_idx=[np.ascontiguousarray(rows[so[i]:so[i + 1]]) for i in range(len(part.send_parts))])

    def recv_slice(self, i: int) -> slice:
        """Halo rows (0-based within the halo) of the i-th receive neighbour."""
        return slice(int(self.recv_offsets[i]), int(self.recv_offsets[i + 1]))

    @property
    def boundary_rows(self) -> np.ndarray:
        """Owned rows that some neighbour needs (in any send list), sorted."""
        if not self.send_idx:
            return np.zeros(0, dtype=np.int64)
        return np.unique(np.concatenate(self.send_idx))

    @property
    def send_ranges(self) -> list:
        """Per send neighbour, (lo, hi) when its rows are the owned rows lo .. hi-1 (increasing: the part
        format's boundary-first order makes most lists so), else None."""
        return [(int(ix[0]), int(ix[-1]) + 1) if len(ix) and int(ix[-1]) - int(ix[0]) + 1 == len(ix) else None
                for ix in self.send_idx]


class Transfer:
    """One direction of an exchange: fixed peers and buffers, persistent requests, start / test / wait.

    ``send_bufs[i]`` goes to ``send_peers[i]``; ``recv_bufs[i]`` is filled by ``recv_peers[i]``. Receives are
    posted by ``post_recvs``; sends leave one by one (``send(i)``) or together (``send_all``) as soon as their
    buffer is ready. ``test`` and ``wait_some`` return the receive indices that have newly landed.
    With a ``watchdog`` (``g3mpi.comm.watchdog``), every blocking wait has a deadline. With a ``recorder``
    (``g3mpi.comm.timeline``), posts, sends, landings and blocked spans are recorded while it is active.
    """

    watchdog = None

    def __init__(self, comm, send_peers, send_bufs, recv_peers, recv_bufs, tag: int, stats: CommStats,
                 simnet: SimNet | None = None, name: str = "", recorder=None):
        self.comm, self.stats, self.simnet, self.name = comm, stats, simnet, name
        self.recorder = recorder
        self.send_peers, self.recv_peers = list(send_peers), list(recv_peers)
        self.send_bufs, self.recv_bufs = send_bufs, recv_bufs
        for b in list(send_bufs) + list(recv_bufs):
            if not b.flags.c_contiguous:
                raise ValueError("exchange buffers must be contiguous")
        self._tag = tag
        self._view_sends = []     # (request, array, peer) of sends from the caller's arrays (``send(i, view)``)
        self._send_reqs = [comm.Send_init(b, p, tag) for b, p in zip(send_bufs, self.send_peers)]
        self._recv_reqs = [comm.Recv_init(b, p, tag) for b, p in zip(recv_bufs, self.recv_peers)]
        k = len(self.recv_peers)
        if simnet is not None:
            # arrival stamps travel beside the data (simulation only; not counted as bytes)
            self._stamp_out = [np.zeros(1) for _ in self.send_peers]
            self._stamp_in = [np.zeros(1) for _ in self.recv_peers]
            self._send_reqs += [comm.Send_init(s, p, tag + 1) for s, p in zip(self._stamp_out, self.send_peers)]
            self._recv_reqs += [comm.Recv_init(s, p, tag + 1) for s, p in zip(self._stamp_in, self.recv_peers)]
        self._mpi_done = np.zeros(len(self._recv_reqs), dtype=bool)
        self._t_data = np.zeros(len(self._recv_reqs))
        self._landed = np.zeros(k, dtype=bool)
        self._posted = False
        self.round_open = False   # set by begin(), cleared by end(): one round may span several callers
        self._sent = np.zeros(len(self.send_peers), dtype=bool)
        self._send_active = False
        self._t0 = 0.0
        self._t_last = 0.0
        self.send_bytes = [int(b.nbytes) for b in send_bufs]
        self.recv_bytes = [int(b.nbytes) for b in recv_bufs]

    @property
    def num_recvs(self) -> int:
        return len(self.recv_peers)

    # -- posting ------------------------------------------------------------------------------------------------
    def post_recvs(self) -> None:
        """Post every receive (and complete the previous round's sends, long finished by now)."""
        if self._posted:
            raise RuntimeError(f"exchange {self.name}: receives posted twice without completing")
        self._t0 = time.perf_counter()
        self._t_last = self._t0
        self._finish_sends()
        rec = self.recorder
        if rec is not None and rec.active:
            rec.add("post", self.name, time.perf_counter())
        self._mpi_done[:] = False
        self._landed[:] = False
        self._sent[:] = False
        if self._recv_reqs:
            MPI.Prequest.Startall(self._recv_reqs)
            self._posted = True

    def send(self, i: int, view: np.ndarray | None = None) -> None:
        """Start sending buffer i (its content must be final and stay untouched until the next round), or
        ``view`` in its place: rows of the caller's own array, shaped like buffer i, sent without a copy (kept
        referenced, and untouched by the caller, until the sends complete)."""
        if self._sent[i]:
            raise RuntimeError(f"exchange {self.name}: buffer {i} sent twice in one round")
        reqs = [] if view is not None else [self._send_reqs[i]]
        t = time.perf_counter()
        if view is not None:
            self._view_sends.append((self.comm.Isend(view, self.send_peers[i], self._tag), view, self.send_peers[i]))
        if self.simnet is not None:
            self._stamp_out[i][0] = self.simnet.arrival(self.send_bytes[i], t)
            reqs.append(self._send_reqs[len(self.send_peers) + i])
        if reqs:
            MPI.Prequest.Startall(reqs)
        rec = self.recorder
        if rec is not None and rec.active:
            rec.add("send", self.name, t, peer=self.send_peers[i])
        self._sent[i] = True
        self._send_active = True
        self.stats.bytes_sent += self.send_bytes[i]
        self.stats.messages_sent += 1
        self.stats.add(self.name, "bytes_sent", self.send_bytes[i])

    def send_all(self) -> None:
        for i in range(len(self.send_peers)):
            if not self._sent[i]:
                self.send(i)

    def start(self) -> None:
        self.post_recvs()
        self.send_all()

    def begin(self) -> None:
        """Open a round (post the receives) unless one is open already."""
        if not self.round_open:
            self.post_recvs()
            self.round_open = True

    def end(self) -> None:
        self.round_open = False

    @property
    def all_sent(self) -> bool:
        return bool(self._sent.all())

    # -- completion ---------------------------------------------------------------------------------------------
    def _deliverable(self, now: float) -> list:
        k = self.num_recvs
        out = []
        for i in np.nonzero(~self._landed)[0]:
            if not self._mpi_done[i]:
                continue
            if self.simnet is not None:
                if not self._mpi_done[k + i] or now < self._stamp_in[i][0]:
                    continue
                # visible at the simulated arrival, but never before the data really arrived
                t_land = max(float(self._stamp_in[i][0]), self._t_data[i])
            else:
                t_land = now
            self._landed[i] = True
            rec = self.recorder
            if rec is not None and rec.active:
                rec.add("land", self.name, t_land, peer=self.recv_peers[i])
            self.stats.bytes_recv += self.recv_bytes[i]
            self._t_last = max(self._t_last, t_land)
            out.append(int(i))
        if out and self._landed.all():
            self.stats.comm_s += self._t_last - self._t0
            self.stats.add(self.name, "comm_s", self._t_last - self._t0)
            self._posted = False
        return out

    def _poll_recvs(self) -> None:
        """Testsome over the receives MPI has not completed yet; marks completions and their times."""
        pending = np.nonzero(~self._mpi_done)[0]
        if len(pending):
            idx = MPI.Request.Testsome([self._recv_reqs[j] for j in pending])
            if idx:
                self._mpi_done[pending[idx]] = True
                self._t_data[pending[idx]] = time.perf_counter()

    def progress(self) -> None:
        """Let MPI progress this transfer's messages (marks completions; landing is decided by ``test``)."""
        if self._posted:
            self._poll_recvs()
        elif self._send_active:
            MPI.Request.Testall(self._send_reqs + [v[0] for v in self._view_sends])

    def test(self) -> list:
        """Receive indices that have landed since the last call (never blocks)."""
        if not self._posted:
            return []
        self._poll_recvs()
        return self._deliverable(time.perf_counter())

    def wait_some(self) -> list:
        """Block until at least one more receive has landed; returns the newly landed indices."""
        if not self._posted:
            return []
        t0 = time.perf_counter()
        try:
            while True:
                got = self.test()
                if got or not self._posted:
                    return got
                pending = np.nonzero(~self._mpi_done)[0]
                if self.simnet is not None:
                    k = self.num_recvs
                    waiting = [self._stamp_in[i][0] for i in range(k)
                               if not self._landed[i] and self._mpi_done[i] and self._mpi_done[k + i]]
                    if waiting:
                        delay = min(waiting) - time.perf_counter()
                        if len(pending) == 0 and delay > 0:
                            time.sleep(delay)
                        elif delay > 0:
                            time.sleep(min(delay, 20e-6))
                        continue
                if self.watchdog is not None and self.watchdog.active:
                    # a deadline-bounded wait (it polls and sleeps too): a stalled neighbour ends the job
                    k = self.num_recvs
                    reqs = [self._recv_reqs[j] for j in pending]
                    idx = self.watchdog.waitsome(reqs, [self.recv_peers[j % k] for j in pending], self.name)
                    if idx:
                        self._mpi_done[pending[idx]] = True
                        self._t_data[pending[idx]] = time.perf_counter()
                    continue
                # poll, then sleep briefly: a busy-waiting rank would steal the core of a rank still
                # computing what we wait for (ranks often share cores)
                time.sleep(POLL_SLEEP_S)
        finally:
            self._blocked("blocked_s", "wait", t0)

    def wait_all(self) -> list:
        """Block until every receive has landed; returns the indices that landed during this call."""
        out = []
        while self._posted:
            out += self.wait_some()
        return out

    @property
    def landed(self) -> np.ndarray:
        return self._landed

    def _finish_sends(self) -> None:
        if self._send_active:
            t0 = time.perf_counter()
            k = len(self.send_peers)
            reqs = self._send_reqs + [v[0] for v in self._view_sends]
            if self.watchdog is not None and self.watchdog.active:
                peers = [self.send_peers[j % k] for j in range(len(self._send_reqs))] + [v[2] for v in self._view_sends]
                self.watchdog.waitall(reqs, peers, self.name)
            else:
                while not MPI.Request.Testall(reqs):
                    time.sleep(POLL_SLEEP_S)
            self._view_sends = []
            self._blocked("send_blocked_s", "send_wait", t0)
            self._send_active = False

    def _blocked(self, stat: str, event: str, t0: float) -> None:
        """Count the time blocked since ``t0`` (as ``stat``) and record it as a timeline ``event``."""
        t1 = time.perf_counter()
        self.stats.blocked_s += t1 - t0
        self.stats.add(self.name, stat, t1 - t0)
        rec = self.recorder
        if rec is not None and rec.active:
            rec.add(event, self.name, t0, t1)

    def free(self) -> None:
        if self._posted:
            self.wait_all()
        self._finish_sends()
        for r in self._send_reqs + self._recv_reqs:
            r.Free()
        self._send_reqs, self._recv_reqs = [], []


class HaloExchange:
    """The exchange of one (part, message width, layer): forward owners -> halo, backward halo grads -> owners.

    Buffers (numpy, shared with torch through ``torch.from_numpy`` by the caller):
      ``halo`` [n_halo, width]: forward receive target, slice i from ``plan.recv_parts[i]``;
      ``send_bufs[i]`` [len(send_idx[i]), width]: forward send buffers;
      ``halo_grad`` [n_halo, width]: backward send source (slice i goes back to its owner);
      ``grad_bufs[i]`` [len(send_idx[i]), width]: backward receive buffers, to be summed into ``send_idx[i]``.
    The backward buffers and transfer are made on first use (``backward``, ``halo_grad``, ``grad_bufs``).
    """

    def __init__(self, comm, plan: HaloPlan, width: int, tag: int, stats: CommStats, simnet: SimNet | None = None,
                 dtype=np.float32, name: str = "", recorder=None):
        self.plan, self.width, self.name = plan, int(width), name or f"x{tag}"
        self._comm, self._tag, self._stats, self._simnet, self._dtype = comm, tag, stats, simnet, dtype
        self._recorder = recorder
        self.halo = np.zeros(self._shape(plan.num_halo), dtype=dtype)
        self.send_bufs = [np.zeros(self._shape(len(ix)), dtype=dtype) for ix in plan.send_idx]
        k = len(plan.recv_parts)
        halo_slices = [self.halo[plan.recv_slice(i)] for i in range(k)]
        self.forward = Transfer(comm, plan.send_parts, self.send_bufs, plan.recv_parts, halo_slices, 4 * tag, stats,
                                simnet, name=self.name + ".fwd", recorder=recorder)
        self._backward = None
        self._halo_grad = None
        self._grad_bufs = None
        self._ranges = None

    def _shape(self, n: int) -> tuple:
        return (n, self.width)

    # The backward direction is planned on first use: no gradient flows back through an exchange of raw input
    # features (layer 0), so its gradient buffers would only take memory. Planning is local (persistent
    # requests), so ranks need not agree on when it happens.
    @property
    def backward(self) -> Transfer:
        if self._backward is None:
            plan, dtype = self.plan, self._dtype
            self._halo_grad = np.zeros(self._shape(plan.num_halo), dtype=dtype)
            self._grad_bufs = [np.zeros(self._shape(len(ix)), dtype=dtype) for ix in plan.send_idx]
            grad_slices = [self._halo_grad[plan.recv_slice(i)] for i in range(len(plan.recv_parts))]
            self._backward = Transfer(self._comm, plan.recv_parts, grad_slices, plan.send_parts, self._grad_bufs,
                                      4 * self._tag + 2, self._stats, self._simnet, name=self.name + ".bwd",
                                      recorder=self._recorder)
            self._backward.watchdog = self.forward.watchdog
        return self._backward

    @property
    def halo_grad(self) -> np.ndarray:
        self.backward
        return self._halo_grad

    @property
    def grad_bufs(self) -> list:
        self.backward
        return self._grad_bufs

    @property
    def backward_planned(self) -> bool:
        return self._backward is not None

    def buffer_bytes(self) -> int:
        """Bytes of the buffers allocated so far (the backward ones only once backward has run)."""
        n = self.halo.nbytes + sum(b.nbytes for b in self.send_bufs)
        if self._backward is not None:
            n += self._halo_grad.nbytes + sum(b.nbytes for b in self._grad_bufs)
        return int(n)

    def start_forward(self, h: np.ndarray) -> None:
        """Post the halo receives and send every neighbour its rows of ``h`` (row i = owned row i; rows past the
        last send row may be missing): a contiguous range as a view of ``h``, other lists gathered into their
        send buffer."""
        self.forward.post_recvs()
        if self._ranges is None:
            self._ranges = self.plan.send_ranges
        for i, r in enumerate(self._ranges):
            if r is not None and h.flags.c_contiguous:
                self.forward.send(i, h[r[0]:r[1]])
            else:
                np.take(h, self.plan.send_idx[i], axis=0, out=self.send_bufs[i])
                self.forward.send(i)

    def halo_slice(self, i: int) -> np.ndarray:
        return self.halo[self.plan.recv_slice(i)]

    def free(self) -> None:
        self.forward.free()
        if self._backward is not None:
            self._backward.free()


class CommContext:
    """Per-rank communication state injected into the model: communicator, counters, simulated network,
    and the allocator of exchange tags (every rank builds its exchanges in the same order). Construction
    duplicates ``comm`` (collective); ``free`` releases everything (collective). ``recorder``: a
    :class:`~g3mpi.comm.timeline.Recorder` that every exchange's transfers report to (None: nothing recorded)."""

    def __init__(self, comm, simnet: SimNet | None = None, watchdog=None, recorder=None):
        # a private communicator: no tag of ours can meet a message of another context or library
        self.comm = comm.Dup()
        self.simnet = simnet
        self.watchdog = watchdog
        self.recorder = recorder
        self.stats = CommStats()
        self._next = 1
        self._exchanges = []

    def exchange(self, plan: HaloPlan, width: int, dtype=np.float32, name: str = "") -> HaloExchange:
        tag = self._next
        self._next += 1
        if 4 * tag + 3 > self.comm.Get_attr(MPI.TAG_UB):
            raise RuntimeError("too many halo exchanges for this MPI's tag range")
        ex = HaloExchange(self.comm, plan, width, tag, self.stats, self.simnet, dtype, name, self.recorder)
        ex.forward.watchdog = self.watchdog   # the backward transfer takes it over when it is planned
        self._exchanges.append(ex)
        return ex

    @property
    def exchanges(self) -> tuple:
        """The exchanges made on this context so far (read-only)."""
        return tuple(self._exchanges)

    def progress(self) -> None:
        """Drive MPI progress of every exchange in flight (called between chunks of computation)."""
        for ex in self._exchanges:
            ex.forward.progress()
            if ex.backward_planned:
                ex.backward.progress()

    def free(self) -> None:
        for ex in self._exchanges:
            ex.free()
        self._exchanges = []
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
