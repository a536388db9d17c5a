"""Per-rank timeline of one epoch: the halo exchanges' events and the trainer's phases, recorded on request.

A :class:`Recorder` is handed to :class:`~g3mpi.comm.CommContext` at construction; every ``Transfer`` of the
context then appends, while the recorder is active, these events (times from ``time.perf_counter``):

  ``post``        the receives of a round are posted (the round of one layer and direction starts)
  ``send``        a message (a piece of one neighbour's rows) to ``peer`` leaves (its buffer is final)
  ``land``        a message from ``peer`` has landed (simulated network: its simulated arrival)
  ``wait``        span blocked on receives that had not landed (the time ``CommStats.blocked_s`` counts)
  ``send_wait``   span blocked completing the previous round's sends (counted in ``blocked_s`` too)

and the trainer marks its phases (``phase`` events: forward, loss, backward, allreduce, step, end). Without a
recorder a transfer pays one attribute test per call; recording adds no communication during the epoch.

Clock: each rank's ``perf_counter`` minus its offset to rank 0's, estimated once when the recorder is made
(:func:`clock_offset`: every rank reads its clock right after the same allreduce, median of several rounds), so
that the ranks' times share one origin (rank 0's clock). On one host the clocks agree already and the estimate
is the allreduce's exit skew (microseconds); the spread of the rounds is kept with the offset.

Compute per layer (:func:`segments`): the epoch minus the blocked spans, split at the phase marks and at every
``post``; a part between the posts of two rounds belongs to the round posted first, labelled by its exchange
(``gcn1 fwd``). In the blocking schedule that is the layer's own computation; in the pipelined one layers
interleave by design, and a part is labelled by the latest round it follows.
"""
from __future__ import annotations

import time

import numpy as np

#: the events a transfer records, and the spans of them that are time blocked
KINDS = ("post", "send", "land", "wait", "send_wait")
BLOCKED = ("wait", "send_wait")
#: the trainer's phase marks, in the order of an epoch
PHASES = ("forward", "loss", "backward", "allreduce", "step", "end")
#: labels of the phases themselves (the parts of the epoch before any round of the phase is posted)
PHASE_LABELS = {"forward": "forward", "loss": "loss", "backward": "backward", "allreduce": "allreduce (idle)",
                "step": "optimizer step"}


def clock_offset(watchdog, rounds: int = 5) -> tuple[float, float]:
    """(offset, spread) of this rank's ``perf_counter`` to rank 0's, seconds (every rank calls it): each round
    one allreduce lines the ranks up and a second gathers the clock each read right after it; offset = median
    over the rounds of (own reading - rank 0's), spread = max - min of them."""
    comm = watchdog.comm
    est = []
    for _ in range(rounds):
        watchdog.allreduce(np.zeros(1), what="timeline clock alignment")
        t = np.zeros(comm.size)
        t[comm.rank] = time.perf_counter()
        watchdog.allreduce(t, what="timeline clock alignment")
        est.append(t[comm.rank] - t[0])
    return float(np.median(est)), float(max(est) - min(est))


class Recorder:
    """One rank's events while :attr:`active` (:meth:`start` clears and starts, :meth:`stop` ends)."""

    def __init__(self, rank: int, offset_s: float = 0.0, offset_spread_s: float = 0.0):
        self.rank, self.offset_s, self.offset_spread_s = int(rank), float(offset_s), float(offset_spread_s)
        self.active = False
        self.epoch = None
        self.events = []    # (kind, name, t0, t1, peer) in this rank's perf_counter time

    def start(self, epoch: int) -> None:
        self.events = []
        self.epoch = int(epoch)
        self.active = True

    def stop(self) -> None:
        self.active = False

    def add(self, kind: str, name: str, t0: float, t1: float | None = None, peer: int = -1) -> None:
        self.events.append((kind, name, t0, t0 if t1 is None else t1, int(peer)))

    def mark(self, phase: str) -> None:
        if self.active:
            self.add("phase", phase, time.perf_counter())

    def as_dict(self) -> dict:
        """This rank's record: events in rank 0's clock (seconds), sorted by start."""
        off = self.offset_s
        ev = sorted(([k, n, t0 - off, t1 - off, p] for k, n, t0, t1, p in self.events), key=lambda e: e[2])
        return dict(rank=self.rank, epoch=self.epoch, offset_s=off, offset_spread_s=self.offset_spread_s, events=ev)


def layer_of(name: str) -> str:
    """'gcn1.fwd' -> 'gcn1 fwd' (a transfer's exchange and direction)."""
    ex, _, d = name.rpartition(".")
    return f"{ex} {d}" if ex else name


def segments(events: list) -> list:
    """[label, t0, t1] compute parts of one rank's epoch (see the module docstring), in time order: from the
    ``forward`` mark to the ``end`` mark, split at every phase mark and ``post``, the blocked spans cut out."""
    cuts = []
    for kind, name, t0, _, _ in events:
        if kind == "phase":
            cuts.append((t0, PHASE_LABELS.get(name)))
        elif kind == "post":
            cuts.append((t0, layer_of(name)))
    cuts.sort(key=lambda c: c[0])
    blocked = sorted((e[2], e[3]) for e in events if e[0] in BLOCKED)
    out = []
    for (a, label), (b, _) in zip(cuts, cuts[1:]):
        if label is None or b <= a:
            continue
        t = a
        for w0, w1 in blocked:
            if w1 <= t or w0 >= b:
                continue
            if w0 > t:
                out.append([label, t, w0])
            t = max(t, w1)
        if t < b:
            out.append([label, t, b])
    return out


def summarize(rank_doc: dict) -> dict:
    """Seconds per label of compute, blocked per transfer, and the epoch span of one rank's record."""
    ev = rank_doc["events"]
    comp, blocked = {}, {}
    for label, a, b in rank_doc["segments"]:
        comp[label] = comp.get(label, 0.0) + (b - a)
    for kind, name, a, b, _ in ev:
        if kind in BLOCKED:
            blocked[layer_of(name)] = blocked.get(layer_of(name), 0.0) + (b - a)
    marks = {n: t for k, n, t, _, _ in ev if k == "phase"}
    span = marks["end"] - marks["forward"] if "end" in marks and "forward" in marks else None
    return dict(epoch_s=span, compute_s=comp, blocked_s=blocked, blocked_total_s=sum(blocked.values()))


def combine(rank_docs: list, **about) -> dict:
    """The timeline of one epoch of every rank (``rank_docs``: :meth:`Recorder.as_dict` in rank order): times
    from the earliest ``forward`` mark, each rank's compute parts and totals added; ``about``: what was run."""
    starts = [e[2] for d in rank_docs for e in d["events"] if e[0] == "phase" and e[1] == "forward"]
    origin = min(starts) if starts else 0.0
    ranks = []
    for d in rank_docs:
        # 0.1 microsecond resolution: finer digits of perf_counter differences carry no information here
        ev = [[k, n, round(t0 - origin, 7), round(t1 - origin, 7), p] for k, n, t0, t1, p in d["events"]]
        r = dict(d, events=ev)
        r["segments"] = segments(ev)
        r["summary"] = summarize(r)
        ranks.append(r)
    return dict(about, clock="perf_counter of each rank minus its offset to rank 0's (median of 5 allreduce exits "
                              "at start), seconds from the earliest forward mark", ranks=ranks)
