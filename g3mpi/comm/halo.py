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
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .codec import codec_for
from .simnet import DirectNet, SimNet

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
    def send_ranges(self) -> list:
        """Per send neighbour, (lo, hi) when its rows are the owned rows lo .. hi-1 (increasing: the part
        format's boundary-first order makes most lists so), else None."""
        return [(int(ix[0]), int(ix[-1]) + 1) if len(ix) and int(ix[-1]) - int(ix[0]) + 1 == len(ix) else None
                for ix in self.send_idx]


class SendQueue:
    """Sends waiting for their buffer: a GPU rank's staged rows leave once the copy that writes them into host memory
    has completed (its ``event``: ``query()`` without blocking, ``synchronize()`` blocking; ``g3mpi.ops.staging``).
    Sends leave in the order they were queued, whichever transfer they belong to: ``flush`` (every poll) sends the
    prefix whose events have completed, ``drain`` (before every blocking wait) all of them, so a rank never blocks
    while a message that another rank may need is still queued, and sends and waits come in the unstaged order.
    One queue per ``CommContext``, shared by its transfers; empty on a CPU rank, which sends at once."""

    def __init__(self):
        self._q = deque()   # (transfer, message, event)

    def __len__(self) -> int:
        return len(self._q)

    def put(self, transfer: "Transfer", j: int, event) -> None:
        self._q.append((transfer, j, event))

    def flush(self) -> None:
        """Send the queued messages whose events have completed, in order, up to the first one still copying."""
        q = self._q
        while q and q[0][2].query():
            transfer, j, _ = q.popleft()
            transfer.send(j)

    def drain(self) -> None:
        """Send every queued message, waiting for each one's copy."""
        q = self._q
        while q:
            transfer, j, event = q.popleft()
            event.synchronize()
            transfer.send(j)


class Transfer:
    """One direction of an exchange: fixed messages and buffers, persistent requests, open / send / test / wait.

    Message j carries ``send_bufs[j]`` to ``send_peers[j]``; receive j fills ``recv_bufs[j]`` from
    ``recv_peers[j]``. A peer may have several messages (the pieces of one neighbour's rows): they match in list
    order (MPI's non-overtaking rule on one tag), so each peer's messages are sent in that order. A round:
    ``begin`` posts every receive (and completes the previous round's sends, long finished by then); sends leave
    one by one (``send(j)``) or together (``send_all``) as soon as their buffer is ready; ``test`` and
    ``wait_some`` return the receive indices that have newly landed. The round is over once every message has
    been sent and every receive has landed; ``begin`` refuses to open the next one before.

    ``net`` (``g3mpi.comm.simnet``: ``DirectNet`` or ``SimNet``) decides when a delivered message becomes visible;
    ``watchdog`` (``g3mpi.mpi.watchdog``, or None) puts a deadline on every blocking wait; ``recorder``
    (``g3mpi.comm.timeline``, or None) records posts, sends, landings and blocked spans while it is active.
    ``queue``: the :class:`SendQueue` of ``send_after`` (None: every send leaves at once). ``codec``
    (``g3mpi.comm.codec``, or None: the buffers travel as they are): each message travels in its own 16-bit wire
    buffer, encoded as it is sent and decoded into its receive buffer as it lands.
    """

    def __init__(self, comm, send_peers, send_bufs, recv_peers, recv_bufs, tag: int, stats: CommStats, *,
                 net=None, watchdog=None, name: str = "", recorder=None, queue: SendQueue | None = None,
                 codec=None):
        self.comm, self.stats, self.name = comm, stats, name
        self.codec = codec
        self.queue = queue
        self.net = net if net is not None else DirectNet()
        self.watchdog = watchdog if watchdog is not None and watchdog.active else None
        self.recorder = recorder
        self.send_peers, self.recv_peers = list(send_peers), list(recv_peers)
        self.send_bufs, self.recv_bufs = send_bufs, recv_bufs
        for b in list(send_bufs) + list(recv_bufs):
            if not b.flags.c_contiguous:
                raise ValueError("exchange buffers must be contiguous")
        self._tag = tag
        # the previous message to the same peer (-1: none): it must leave first
        last = {}
        self._before = []
        for j, p in enumerate(self.send_peers):
            self._before.append(last.get(p, -1))
            last[p] = j
        # this round's started sends: (request, peer, the caller's array for a view send, else None); only these
        # are tested (MPICH's Testall over inactive persistent requests has been seen to report them complete)
        self._active = []
        # arrival stamps travel beside the data on the next tag (none without a simulated network)
        self._stamp_out = self.net.stamps(len(self.send_peers))
        self._stamp_in = self.net.stamps(len(self.recv_peers))
        # what travels: the buffers, or their 16-bit encodings
        self._wire_out = [codec.wire(b) for b in send_bufs] if codec else list(send_bufs)
        self._wire_in = [codec.wire(b) for b in recv_bufs] if codec else list(recv_bufs)
        self._data_sends = [comm.Send_init(b, p, tag) for b, p in zip(self._wire_out, self.send_peers)]
        self._stamp_sends = [comm.Send_init(s, p, tag + 1) for s, p in zip(self._stamp_out, self.send_peers)]
        self._recv_reqs = [comm.Recv_init(b, p, tag) for b, p in zip(self._wire_in, self.recv_peers)]
        self._recv_reqs += [comm.Recv_init(s, p, tag + 1) for s, p in zip(self._stamp_in, self.recv_peers)]
        self._req_peers = self.recv_peers * (len(self._recv_reqs) // max(1, self.num_recvs))
        self._mpi_done = np.zeros(len(self._recv_reqs), dtype=bool)
        self._t_data = np.zeros(self.num_recvs)
        self._landed = np.ones(self.num_recvs, dtype=bool)
        self._sent = np.ones(len(self.send_peers), dtype=bool)
        self._queued = np.zeros(len(self.send_peers), dtype=bool)   # in the queue (send_after), not yet sent
        self._t0 = 0.0
        self._t_last = 0.0
        self.send_bytes = [int(b.nbytes) for b in self._wire_out]
        self.recv_bytes = [int(b.nbytes) for b in self._wire_in]

    @property
    def num_recvs(self) -> int:
        return len(self.recv_peers)

    # -- a round ------------------------------------------------------------------------------------------------
    @property
    def round_over(self) -> bool:
        return bool(self._landed.all() and self._sent.all())

    def begin(self) -> None:
        """Open a round: post every receive (the one way a round starts)."""
        self._drain()
        if not self.round_over:
            raise RuntimeError(f"exchange {self.name}: a round opened before the previous one was over")
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

    def send(self, j: int, view: np.ndarray | None = None) -> None:
        """Start sending buffer j (its content must be final and stay untouched until the next round), or
        ``view`` in its place: rows of the caller's own array, shaped like buffer j, sent without a copy (kept
        referenced, and untouched by the caller, until the sends complete; with a codec, encoded at once, and it may
        be a torch tensor of any float dtype)."""
        if self._sent[j]:
            raise RuntimeError(f"exchange {self.name}: message {j} sent twice in one round")
        if self._before[j] >= 0 and not self._sent[self._before[j]]:
            raise RuntimeError(f"exchange {self.name}: message {j} sent before the one ahead of it to its peer")
        peer = self.send_peers[j]
        t = time.perf_counter()
        if self.codec is not None:
            self.codec.encode(self.send_bufs[j] if view is None else view, self._wire_out[j])
            view = None
        if view is not None:
            self._active.append((self.comm.Isend(view, peer, self._tag), peer, view))
        else:
            self._data_sends[j].Start()
            self._active.append((self._data_sends[j], peer, None))
        self.net.stamp(self._stamp_out, j, self.send_bytes[j], t)
        if self._stamp_sends:   # under a simulated network the arrival stamp follows the data
            self._stamp_sends[j].Start()
            self._active.append((self._stamp_sends[j], peer, None))
        rec = self.recorder
        if rec is not None and rec.active:
            rec.add("send", self.name, t, peer=peer)
        self._sent[j] = True
        self._queued[j] = False
        self.stats.bytes_sent += self.send_bytes[j]
        self.stats.messages_sent += 1
        self.stats.add(self.name, "bytes_sent", self.send_bytes[j])

    def send_after(self, j: int, event) -> None:
        """Send buffer j once ``event`` (the copy that fills it) has completed: queued behind the sends queued
        before it (``SendQueue``), then sent by the polls and waits that follow."""
        if self.queue is None:
            raise RuntimeError(f"exchange {self.name}: a send after an event needs a send queue")
        if self._sent[j] or self._queued[j]:
            raise RuntimeError(f"exchange {self.name}: message {j} sent twice in one round")
        self._queued[j] = True
        self.queue.put(self, j, event)

    def _drain(self) -> None:
        if self.queue:
            self.queue.drain()

    def send_all(self) -> None:
        for j in range(len(self.send_peers)):
            if not self._sent[j]:
                self.send(j)

    @property
    def all_sent(self) -> bool:
        return bool(self._sent.all())

    @property
    def all_started(self) -> bool:
        """Every message of the round sent, or queued behind its copy (``send_after``)."""
        return bool((self._sent | self._queued).all())

    # -- completion ---------------------------------------------------------------------------------------------
    def _complete(self) -> np.ndarray:
        """Per receive: its data and its stamp (if any) have been delivered by MPI."""
        return self._mpi_done.reshape(-1, max(1, self.num_recvs)).all(axis=0)

    def _deliverable(self, now: float) -> list:
        out = []
        complete = self._complete()
        for i in np.nonzero(~self._landed & complete)[0]:
            t_land = self.net.visible(self._stamp_in, i, self._t_data[i])
            if now < t_land:
                continue
            self._landed[i] = True
            if self.codec is not None:
                self.codec.decode(self._wire_in[i], self.recv_bufs[i])
            rec = self.recorder
            if rec is not None and rec.active:
                rec.add("land", self.name, t_land, peer=self.recv_peers[i])
            self.stats.bytes_recv += self.recv_bytes[i]
            self._t_last = max(self._t_last, t_land)
            out.append(int(i))
        if out and self._landed.all():
            self.stats.comm_s += self._t_last - self._t0
            self.stats.add(self.name, "comm_s", self._t_last - self._t0)
        return out

    def _poll_recvs(self) -> None:
        """Testsome over the receives MPI has not completed yet; marks completions and their times."""
        pending = np.nonzero(~self._mpi_done)[0]
        if len(pending):
            self._mark(pending, MPI.Request.Testsome([self._recv_reqs[j] for j in pending]))

    def _mark(self, pending: np.ndarray, idx) -> None:
        if idx is None:
            # Testsome's None: no active request left among them (completed in error, e.g. a message of another
            # size): nothing more will come, so a wait for them must end, not spin at 100 % of a core forever
            idx = list(range(len(pending)))
        if idx:
            done = pending[idx]
            self._mpi_done[done] = True
            data = done[done < self.num_recvs]
            self._t_data[data] = time.perf_counter()

    def progress(self) -> None:
        """Let MPI progress this transfer's messages (marks completions; landing is decided by ``test``) and send
        the queued messages whose copies have completed."""
        if self.queue:
            self.queue.flush()
        if not self._landed.all():
            self._poll_recvs()
        elif self._active:
            MPI.Request.Testall([a[0] for a in self._active])

    def test(self) -> list:
        """Receive indices that have landed since the last call (never blocks); sends the queued messages whose
        copies have completed first."""
        if self.queue:
            self.queue.flush()
        if self._landed.all():
            return []
        self._poll_recvs()
        return self._deliverable(time.perf_counter())

    def wait_some(self) -> list:
        """Block until at least one more receive has landed (every queued send out first); returns the newly
        landed indices."""
        self._drain()
        if self._landed.all():
            return []
        t0 = time.perf_counter()
        try:
            while True:
                got = self.test()
                if got or self._landed.all():
                    return got
                pending = np.nonzero(~self._mpi_done)[0]
                # delivered, not yet visible (simulated network): sleep until the first becomes visible
                waiting = [self.net.visible(self._stamp_in, i, self._t_data[i])
                           for i in np.nonzero(~self._landed & self._complete())[0]]
                if waiting:
                    delay = min(waiting) - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay if len(pending) == 0 else min(delay, 20e-6))
                    continue
                if self.watchdog is not None:
                    # a deadline-bounded wait (it polls and sleeps too): a stalled neighbour ends the job
                    reqs = [self._recv_reqs[j] for j in pending]
                    self._mark(pending, self.watchdog.waitsome(reqs, [self._req_peers[j] for j in pending],
                                                               self.name))
                    continue
                # poll, then sleep briefly: a busy-waiting rank would steal the core of a rank still
                # computing what we wait for (ranks often share cores)
                time.sleep(POLL_SLEEP_S)
        finally:
            self._blocked("blocked_s", "wait", t0)

    def wait_all(self) -> list:
        """Block until every receive has landed; returns the indices that landed during this call."""
        out = []
        while not self._landed.all():
            out += self.wait_some()
        return out

    @property
    def landed(self) -> np.ndarray:
        return self._landed

    def _finish_sends(self) -> None:
        self._drain()
        if self._active:
            t0 = time.perf_counter()
            reqs = [a[0] for a in self._active]
            if self.watchdog is not None:
                self.watchdog.waitall(reqs, [a[1] for a in self._active], self.name)
            else:
                while not MPI.Request.Testall(reqs):
                    time.sleep(POLL_SLEEP_S)
            self._active = []
            self._blocked("send_blocked_s", "send_wait", t0)

    def _blocked(self, stat: str, event: str, t0: float) -> None:
        """Count the time blocked since ``t0`` (as ``stat``) and record it as a timeline ``event``."""
        t1 = time.perf_counter()
        self.stats.blocked_s += t1 - t0
        self.stats.add(self.name, stat, t1 - t0)
        rec = self.recorder
        if rec is not None and rec.active:
            rec.add(event, self.name, t0, t1)

    def free(self) -> None:
        self.wait_all()
        self._finish_sends()
        for r in self._data_sends + self._stamp_sends + self._recv_reqs:
            r.Free()
        self._data_sends, self._stamp_sends, self._recv_reqs = [], [], []


def piece_bounds(rows: int, piece_rows: int) -> np.ndarray:
    """Row bounds [0, .., rows] of a message of ``rows`` rows sent in pieces of about ``piece_rows`` rows (equal
    sizes; 0 or ``rows`` <= ``piece_rows``: one piece). Both ends of a message compute the same bounds."""
    k = 1 if piece_rows <= 0 or rows <= piece_rows else -(-rows // piece_rows)
    return (np.arange(k + 1, dtype=np.int64) * rows) // k


class HaloExchange:
    """The exchange of one (part, message width, layer): forward owners -> halo, backward halo grads -> owners.

    Buffers (numpy, shared with torch through ``torch.from_numpy`` by the caller):
      ``halo`` [n_halo, width]: forward receive target, slice i from ``plan.recv_parts[i]``;
      ``send_bufs[i]`` [len(send_idx[i]), width]: forward send buffers;
      ``halo_grad`` [n_halo, width]: backward send source (slice i goes back to its owner);
      ``grad_bufs[i]`` [len(send_idx[i]), width]: backward receive buffers, to be summed into ``send_idx[i]``.
    The backward buffers and transfer are made on first use (``backward``, ``halo_grad``, ``grad_bufs``).

    Pieces: each neighbour's message travels as pieces of about ``piece_rows`` rows (``piece_bounds``), so a
    receiver can use a piece while the next ones are on the wire. ``recv_pieces[i]`` / ``send_pieces[q]``: the
    row bounds within receive neighbour i's halo slice / send neighbour q's rows; ``recv_msgs[i]`` /
    ``send_msgs[q]``: the indices of their pieces among the forward transfer's receives / sends (the backward
    transfer's sends / receives have the same indices: piece j of the gradient of a halo slice is the reverse of
    forward receive j).

    ``alloc(shape, dtype)``: makes every buffer (default zeros in ordinary memory; a GPU rank's are pinned host
    memory, ``g3mpi.ops.staging``); ``queue``: the transfers' :class:`SendQueue`. ``staging``: the device side of
    the exchange when the rank's tensors live on a device (set by the graph; None: they are these buffers).
    """

    def __init__(self, comm, plan: HaloPlan, width: int, tag: int, stats: CommStats, net=None, watchdog=None,
                 dtype=np.float32, name: str = "", recorder=None, piece_rows: int = 0, alloc=None,
                 queue: SendQueue | None = None, codec=None):
        self.plan, self.width, self.name = plan, int(width), name or f"x{tag}"
        self.codec = codec
        self._comm, self._tag, self._stats, self._dtype = comm, tag, stats, dtype
        self._net, self._watchdog, self._recorder = net, watchdog, recorder
        self._alloc = alloc or _zeros
        self._queue = queue
        self.staging = None
        k = len(plan.recv_parts)
        self.recv_pieces = [piece_bounds(plan.recv_slice(i).stop - plan.recv_slice(i).start, piece_rows)
                            for i in range(k)]
        self.send_pieces = [piece_bounds(len(ix), piece_rows) for ix in plan.send_idx]
        self.recv_msgs = _numbered(self.recv_pieces)
        self.send_msgs = _numbered(self.send_pieces)
        self._forward = None
        self._halo = None
        self._send_bufs = None
        self._backward = None
        self._halo_grad = None
        self._grad_bufs = None
        self._ranges = None

    def _shape(self, n: int) -> tuple:
        return (n, self.width)

    def _transfer(self, send_peers, send_bufs, send_pieces, recv_peers, recv_bufs, recv_pieces, tag, suffix):
        def flat(peers, bufs, pieces):
            return ([p for p, b in zip(peers, pieces) for _ in range(len(b) - 1)],
                    [buf[a:z] for buf, b in zip(bufs, pieces) for a, z in zip(b[:-1], b[1:])])
        sends, recvs = flat(send_peers, send_bufs, send_pieces), flat(recv_peers, recv_bufs, recv_pieces)
        return Transfer(self._comm, *sends, *recvs, tag, self._stats, net=self._net, watchdog=self._watchdog,
                        name=self.name + suffix, recorder=self._recorder, queue=self._queue, codec=self.codec)

    # Each direction is planned on first use: no gradient flows back through an exchange of raw input features
    # (layer 0), and a model that keeps its input's halo (``GNN``'s input cache) never sends that layer's input,
    # so those buffers would only take memory. Planning is local (persistent requests), so ranks need not agree
    # on when it happens.
    @property
    def forward(self) -> Transfer:
        if self._forward is None:
            plan = self.plan
            self._halo, self._send_bufs, halo_slices = self._buffers()
            self._forward = self._transfer(plan.send_parts, self._send_bufs, self.send_pieces, plan.recv_parts,
                                           halo_slices, self.recv_pieces, 4 * self._tag, ".fwd")
        return self._forward

    def _buffers(self) -> tuple:
        """One direction's buffers: [n_halo, width], its slices per receive neighbour, one per send neighbour."""
        plan = self.plan
        halo = self._alloc(self._shape(plan.num_halo), self._dtype)
        per_send = [self._alloc(self._shape(len(ix)), self._dtype) for ix in plan.send_idx]
        return halo, per_send, [halo[plan.recv_slice(i)] for i in range(len(plan.recv_parts))]

    @property
    def halo(self) -> np.ndarray:
        self.forward
        return self._halo

    @property
    def send_bufs(self) -> list:
        self.forward
        return self._send_bufs

    @property
    def forward_planned(self) -> bool:
        return self._forward is not None

    @property
    def backward(self) -> Transfer:
        if self._backward is None:
            plan = self.plan
            self._halo_grad, self._grad_bufs, grad_slices = self._buffers()
            self._backward = self._transfer(plan.recv_parts, grad_slices, self.recv_pieces, plan.send_parts,
                                            self._grad_bufs, self.send_pieces, 4 * self._tag + 2, ".bwd")
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
        """Bytes of the buffers allocated so far (each direction's once it has run)."""
        return int(sum(halo.nbytes + sum(b.nbytes for b in send) for halo, send in self.buffers()))

    def buffers(self) -> list[tuple[np.ndarray, list]]:
        """The buffers allocated so far, per direction planned (forward, then backward): (the halo-sized one
        [n_halo, width], the send-sized ones [len(send_idx[i]), width], one per send neighbour)."""
        out = []
        if self._forward is not None:
            out.append((self._halo, self._send_bufs))
        if self._backward is not None:
            out.append((self._halo_grad, self._grad_bufs))
        return out

    def start_forward(self, h) -> None:
        """Open a forward round and send every neighbour its rows of ``h`` (row i = owned row i; rows past the
        last send row may be missing), piece by piece: a contiguous range as views of ``h``, other lists
        gathered into their send buffer. ``h``: numpy float32, or (bf16-mixed) a contiguous torch tensor, whose
        rows are views only for a codec to encode, else converted into the send buffers."""
        self.forward.begin()
        torch_rows = not isinstance(h, np.ndarray)
        for q, r in enumerate(self.send_ranges):
            bounds, msgs = self.send_pieces[q], self.send_msgs[q]
            if r is not None and (self.codec is not None if torch_rows else h.flags.c_contiguous):
                for j, a, b in zip(msgs, bounds[:-1], bounds[1:]):
                    self.forward.send(j, h[r[0] + a:r[0] + b])
                continue
            if torch_rows:
                import torch
                rows = h[r[0]:r[1]] if r is not None else h[torch.from_numpy(self.plan.send_idx[q])]
                torch.from_numpy(self.send_bufs[q]).copy_(rows)
            else:
                np.take(h, self.plan.send_idx[q], axis=0, out=self.send_bufs[q])
            for j in msgs:
                self.forward.send(j)

    @property
    def send_ranges(self) -> list:
        """``plan.send_ranges``, computed once."""
        if self._ranges is None:
            self._ranges = self.plan.send_ranges
        return self._ranges

    def halo_slice(self, i: int) -> np.ndarray:
        return self.halo[self.plan.recv_slice(i)]

    def free(self) -> None:
        if self._forward is not None:
            self._forward.free()
        if self._backward is not None:
            self._backward.free()


def _zeros(shape: tuple, dtype) -> np.ndarray:
    return np.zeros(shape, dtype=dtype)


def _numbered(pieces: list) -> list:
    """Per neighbour, the indices of its pieces among all neighbours' pieces in order."""
    out, j = [], 0
    for b in pieces:
        out.append(range(j, j + len(b) - 1))
        j += len(b) - 1
    return out


class CommContext:
    """Per-rank communication state injected into the model: communicator, counters, network model (``net``:
    a ``SimNet``, or None for the real one), watchdog, and the allocator of exchange tags (every rank builds its
    exchanges in the same order). Construction duplicates ``comm`` (collective); ``free`` releases everything
    (collective). ``recorder``: a :class:`~g3mpi.comm.timeline.Recorder` that every exchange's transfers report
    to (None: nothing recorded). ``halo_dtype``: what every exchange's messages travel as (``g3mpi.comm.codec``)."""

    def __init__(self, comm, net: SimNet | None = None, watchdog=None, recorder=None, halo_dtype: str = "float32"):
        self.codec = codec_for(halo_dtype)   # (before the Dup: a bad name leaves nothing to free)
        # a private communicator: no tag of ours can meet a message of another context or library
        self.comm = comm.Dup()
        self.net = net if net is not None else DirectNet()
        self.watchdog = watchdog
        self.recorder = recorder
        self.stats = CommStats()
        self.sends = SendQueue()   # sends waiting for a device-to-host copy (none on a CPU rank)
        self._next = 1
        self._exchanges = []

    def exchange(self, plan: HaloPlan, width: int, dtype=np.float32, name: str = "", piece_rows: int = 0,
                 alloc=None) -> HaloExchange:
        """A new exchange; ``piece_rows``: rows per piece of each neighbour's message (0: one piece); ``alloc``:
        how its buffers are made (``HaloExchange``)."""
        tag = self._next
        self._next += 1
        if 4 * tag + 3 > self.comm.Get_attr(MPI.TAG_UB):
            raise RuntimeError("too many halo exchanges for this MPI's tag range")
        ex = HaloExchange(self.comm, plan, width, tag, self.stats, self.net, self.watchdog, dtype, name,
                          self.recorder, piece_rows, alloc, self.sends,
                          self.codec if np.dtype(dtype) == np.float32 else None)   # (raw bytes travel as they are)
        self._exchanges.append(ex)
        return ex

    @property
    def exchanges(self) -> tuple:
        """The exchanges made on this context so far (read-only)."""
        return tuple(self._exchanges)

    def progress(self) -> None:
        """Drive MPI progress of every exchange in flight (called between chunks of computation)."""
        for ex in self._exchanges:
            if ex.forward_planned:
                ex.forward.progress()
            if ex.backward_planned:
                ex.backward.progress()

    def release(self, ex: HaloExchange) -> None:
        """Free one exchange made here, whose rounds are complete (a one-off, such as a fetch of halo rows)."""
        ex.free()
        self._exchanges.remove(ex)

    def free(self) -> None:
        for ex in self._exchanges:
            ex.free()
        self._exchanges = []
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
