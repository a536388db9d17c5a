"""The plan of a pair exchange: which embedding rows the pairs a rank scores need from which owner.

A pair (src, dst) of new global node IDs is scored on the rank that owns src; dst's row may be owned by another
rank. Planning (collective, once per set of pairs): each rank lists the distinct dst rows it does not own, grouped
by owner (the contiguous new-ID ranges make the sorted list grouped already), tells each owner how many it wants
(``Alltoall``) and which (``Alltoallv``). The result is a :class:`~g3mpi.comm.halo.HaloPlan` whose "halo" is the
fetched rows, so the halo exchange's transfers, pieces, byte counters and autograd round (``g3mpi.ops.exchange``)
move them: every needed row once, nothing else (the bytes are the lower bound).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from ..sorting import sorted_unique
from .halo import HaloPlan

#: edges of the local CSR keyed at once when held-out pairs are looked up in it
CHUNK = 1 << 22
#: a plan marks the rows its pairs need in a table over every node ID (one pass, no sort) where the graph has at
#: most this many nodes per pair needing a remote row (the table is then O(pairs)); else it sorts those IDs
DENSE_IDS = 4


#: the tag of :func:`exchange_ids`' messages
IDS_TAG = 7411


def exchange_ids(wd, send: np.ndarray, sc: np.ndarray, recv: np.ndarray, rc: np.ndarray, what: str) -> None:
    """``Alltoallv`` of int64 ``send`` (``sc`` [P] entries to each rank, in rank order) into ``recv`` (``rc`` [P]
    from each), as one ``Isend`` / ``Irecv`` per peer waited for by the watchdog: its polled non-blocking
    ``Ialltoallv`` hardly progresses between polls for large payloads (MPICH: 25-39 s against 1.5 s blocking for
    6.2M IDs between 2 ranks here). Collective in effect (every rank calls it, in the same order)."""
    comm, rank = wd.comm, wd.comm.rank
    sd, rd = np.r_[0, np.cumsum(sc)], np.r_[0, np.cumsum(rc)]
    send = np.ascontiguousarray(send, dtype=np.int64)
    recv[rd[rank]:rd[rank + 1]] = send[sd[rank]:sd[rank + 1]]
    reqs, peers = [], []
    for q in range(comm.size):
        if q != rank and rc[q]:
            reqs.append(comm.Irecv([recv[rd[q]:rd[q + 1]], MPI.INT64_T], source=q, tag=IDS_TAG))
            peers.append(q)
    for q in range(comm.size):
        if q != rank and sc[q]:
            reqs.append(comm.Isend([send[sd[q]:sd[q + 1]], MPI.INT64_T], dest=q, tag=IDS_TAG))
            peers.append(q)
    if reqs:
        wd.waitall(reqs, peers, what)


def by_rank(dest: np.ndarray, size: int) -> np.ndarray:
    """The stable order of entries by destination rank ``dest`` [m] (values < ``size``): NumPy's stable sort of
    16-bit keys is a radix sort (one pass), 9x faster than of the int64 ones here."""
    if size <= 1 << 16:
        dest = np.asarray(dest).astype(np.uint16)
    return np.argsort(dest, kind="stable")


def distinct_rows(ids: np.ndarray, num_ids: int):
    """(the sorted distinct values of ``ids`` [m] in [0, ``num_ids``), each value's position among them [m])."""
    if len(ids) and num_ids <= DENSE_IDS * len(ids):
        seen = np.zeros(num_ids, dtype=bool)
        seen[ids] = True
        need = np.flatnonzero(seen)
        at = np.empty(num_ids, dtype=np.int64)
        at[need] = np.arange(len(need), dtype=np.int64)
        return need, at[ids]
    need = sorted_unique(ids) if len(ids) else np.zeros(0, dtype=np.int64)
    return need, np.searchsorted(need, ids)


@dataclass
class PairPlan:
    """``halo``: the :class:`HaloPlan` of the fetched rows; ``dst_rows`` int64 [m]: each pair's dst as a row of
    ``[owned rows | fetched rows]``; ``src_rows`` int64 [m]: each pair's src as an owned row."""

    halo: HaloPlan
    src_rows: np.ndarray
    dst_rows: np.ndarray

    @property
    def num_fetched(self) -> int:
        return self.halo.num_halo

    @property
    def num_pairs(self) -> int:
        return len(self.src_rows)

    def groups(self) -> list:
        """Pair indices by where their dst row lives: [owned, fetched from recv neighbour 0, 1, ...]; each
        increasing."""
        n = self.halo.num_owned
        cuts = n + np.asarray(self.halo.recv_offsets, dtype=np.int64)   # fetched slice i: cuts[i] .. cuts[i+1]
        which = np.searchsorted(cuts, self.dst_rows, side="right")     # 0: owned, i + 1: slice i
        order = np.argsort(which, kind="stable")
        counts = np.bincount(which, minlength=len(self.halo.recv_parts) + 1)
        return np.split(order, np.cumsum(counts)[:-1])


def plan_pairs(wd, owned_start: int, owned_end: int, src, dst, what: str = "pair exchange plan") -> PairPlan:
    """The :class:`PairPlan` of the pairs (``src``, ``dst``: new global IDs, int [m], every src owned here).
    Collective: every rank calls it (with its own pairs, maybe none). ``wd``: the watchdog whose collectives it
    uses."""
    size = wd.comm.size
    src = np.asarray(src, dtype=np.int64).ravel()
    dst = np.asarray(dst, dtype=np.int64).ravel()
    if len(src) != len(dst):
        raise ValueError(f"pairs: {len(src)} sources but {len(dst)} destinations")
    n = owned_end - owned_start
    # rows of [owned | fetched]: a destination outside the owned range wraps to >= n as unsigned (one pass each)
    src_rows, dst_rows = src - owned_start, dst - owned_start
    bad_src = len(src) and (int(src_rows.view(np.uint64).max()) >= n)
    ranges = np.array([owned_start, owned_end], dtype=np.int64)
    allr = np.empty(2 * size, dtype=np.int64)
    wd.allgather(ranges, allr, what=what)
    offsets = np.r_[allr[0::2], allr[-1]]
    num_nodes = int(allr[-1])
    bad_dst = len(dst) and (int(dst.min()) < 0 or int(dst.max()) >= num_nodes)
    # every rank learns whether any rank's pairs are bad, so all raise together instead of some waiting
    flags = np.array([int(bad_src), int(bad_dst)], dtype=np.int64)
    wd.allreduce(flags, what=what)
    if flags.any():
        here = ""
        if bad_src:
            first = src[(src < owned_start) | (src >= owned_end)][0]
            here = f" (here: source {int(first)} outside the owned range [{owned_start}, {owned_end}))"
        elif bad_dst:
            here = f" (here: destination {int(dst[(dst < 0) | (dst >= num_nodes)][0])} outside [0, {num_nodes}))"
        raise ValueError("pairs must be scored on the rank owning their source, with destinations in the graph"
                         + here)
    far = dst_rows.view(np.uint64) >= np.uint64(n)
    need, at = distinct_rows(dst[far], num_nodes)
    owner = np.searchsorted(offsets, need, side="right") - 1
    want = np.bincount(owner, minlength=size).astype(np.int64)
    asked = np.empty(size, dtype=np.int64)
    wd.alltoall(want, asked, what=what)
    got = np.empty(int(asked.sum()), dtype=np.int64)
    rd = np.r_[0, np.cumsum(asked)[:-1]]
    exchange_ids(wd, need, want, got, asked, what=what)
    rank = wd.comm.rank
    recv_parts = [int(p) for p in np.flatnonzero(want)]
    send_parts = [int(p) for p in np.flatnonzero(asked)]
    recv_offsets = np.r_[0, np.cumsum(want[recv_parts])].astype(np.int64)
    send_idx = [np.ascontiguousarray(got[rd[p]:rd[p] + asked[p]] - owned_start) for p in send_parts]
    assert rank not in recv_parts and rank not in send_parts
    halo = HaloPlan(num_owned=n, num_halo=len(need), recv_parts=recv_parts, recv_offsets=recv_offsets,
                    send_parts=send_parts, send_idx=send_idx)
    dst_rows[far] = n + at
    return PairPlan(halo=halo, src_rows=src_rows, dst_rows=dst_rows)


class IdDirectory:
    """Original node ID -> new global ID over all ranks without any rank holding the whole map: rank r keeps the
    new IDs of the original IDs ``[r * B, (r + 1) * B)`` (B = ceil(N / P)), sent there once by their owners; a
    lookup sends each query to the rank keeping it and gets the answer back (two ``Alltoallv``). Memory O(N / P +
    queries). ``replicate``: every rank keeps the whole map instead (8 N bytes; a lookup is one gather, no
    messages), for callers whose lookups per epoch are O(N) anyway (a link task's sampled negatives). Collective:
    every rank builds it and calls every lookup (maybe with none)."""

    def __init__(self, wd, num_nodes: int, owned_start: int, orig_ids, what: str = "node ID directory",
                 replicate: bool = False):
        self.wd, self.num_nodes = wd, int(num_nodes)
        size = wd.comm.size
        self.block = max(1, -(-self.num_nodes // size))
        orig = np.asarray(orig_ids, dtype=np.int64).ravel()
        self.full = None
        if replicate:
            counts = np.full(size, len(orig), dtype=np.int64)
            got = np.empty(size, dtype=np.int64)
            wd.alltoall(counts, got, what=what)
            starts = np.r_[0, np.cumsum(got)]
            assert starts[wd.comm.rank] == owned_start and starts[-1] == self.num_nodes
            every = np.empty(self.num_nodes, dtype=np.int64)
            exchange_ids(wd, np.tile(orig, size), counts, every, got, what=what)
            self.full = np.empty(self.num_nodes, dtype=np.int64)
            self.full[every] = np.arange(self.num_nodes, dtype=np.int64)    # (new IDs: the ranks' ranges in order)
            return
        new = owned_start + np.arange(len(orig), dtype=np.int64)
        got_o, _ = self._route(orig, orig // self.block, what)
        got_n, _ = self._route(new, orig // self.block, what)
        lo = wd.comm.rank * self.block
        self.new_of = np.full(max(0, min(self.num_nodes, lo + self.block) - lo), -1, dtype=np.int64)
        self.new_of[got_o - lo] = got_n

    def _route(self, values: np.ndarray, dest: np.ndarray, what: str):
        """``values`` sent to the ranks ``dest`` (stable within each rank); returns (what arrived here, in rank
        order, and the per-rank send order used, to route answers back)."""
        size = self.wd.comm.size
        order = by_rank(dest, size)
        sc = np.bincount(dest, minlength=size).astype(np.int64)
        rc = np.empty(size, dtype=np.int64)
        self.wd.alltoall(sc, rc, what=what)
        out = np.empty(int(rc.sum()), dtype=np.int64)
        exchange_ids(self.wd, values[order], sc, out, rc, what=what)
        self._last = (order, sc, rc)
        return out, order

    def to_new(self, orig, what: str = "node ID lookup") -> np.ndarray:
        """New global IDs of the original IDs ``orig`` (int [m], each in [0, N))."""
        orig = np.asarray(orig, dtype=np.int64).ravel()
        if self.full is not None:
            return self.full[orig]
        q, order = self._route(orig, orig // self.block, what)
        _, sc, rc = self._last
        ans = self.new_of[q - self.wd.comm.rank * self.block]
        back = np.empty(len(orig), dtype=np.int64)
        exchange_ids(self.wd, ans, rc, back, sc, what=what)
        out = np.empty(len(orig), dtype=np.int64)
        out[order] = back
        return out


def route_rows(wd, rows: np.ndarray, dest: np.ndarray, what: str) -> np.ndarray:
    """int64 rows [m, c] sent to the ranks ``dest`` [m]: the rows that arrived here [k, c], in rank order (one
    ``Alltoall`` of counts, one ``Alltoallv``). Collective."""
    size = wd.comm.size
    rows = np.asarray(rows, dtype=np.int64)
    c = rows.shape[1]
    order = by_rank(dest, size)
    sc = c * np.bincount(dest, minlength=size).astype(np.int64)
    rc = np.empty(size, dtype=np.int64)
    wd.alltoall(sc, rc, what=what)
    out = np.empty(int(rc.sum()), dtype=np.int64)
    exchange_ids(wd, rows[order].ravel(), sc, out, rc, what=what)
    return out.reshape(-1, c)


def owner_of(wd, owned_start: int, owned_end: int, what: str):
    """(offsets [P + 1] of the ranks' owned ranges, a function new global IDs -> owning rank). Collective."""
    allr = np.empty(2 * wd.comm.size, dtype=np.int64)
    wd.allgather(np.array([owned_start, owned_end], dtype=np.int64), allr, what=what)
    offsets = np.r_[allr[0::2], allr[-1]]
    return offsets, lambda ids: np.searchsorted(offsets, ids, side="right") - 1


def first_edge_of_graph(wd, owned_start: int, indptr, indices, halo_ids, edge_type, orig_ids, pairs: np.ndarray,
                        what: str = "held-out pairs against the graph"):
    """The first of the pairs of all ranks that is an edge of the message-passing graph, the same on every rank:
    ``pairs`` int64 [m, 5] (order key >= 0, source, target, relation or -1, a column carried along), sources and
    targets new global IDs; a pair is looked up in its target's row, on the target's owner (the local in-edge CSR
    ``indptr``, ``indices``: local columns, owned rows then ``halo_ids``; ``edge_type`` or None; ``orig_ids``: the
    original IDs of the owned rows). Returns (the pair's 5 values and its target's original ID, the rank that owns
    the source, the rank that owns the target) of the edge with the smallest order key, or None. Collective."""
    n = len(indptr) - 1
    _, owner = owner_of(wd, owned_start, owned_start + n, what)
    got = route_rows(wd, pairs, owner(pairs[:, 2]), what)
    hit = np.zeros(len(got), dtype=bool)
    if len(got) and len(indices):
        gid = np.r_[owned_start + np.arange(n, dtype=np.int64), np.asarray(halo_ids, dtype=np.int64)]
        indptr = np.asarray(indptr, dtype=np.int64)
        N = int(max(gid.max(initial=0), got[:, 1].max()) + 1)
        R = int(max(np.max(edge_type, initial=0), got[:, 3].max()) + 1) if edge_type is not None else 1
        rows = got[:, 2] - owned_start
        by_row = np.argsort(rows, kind="stable")
        # rows in runs of about CHUNK edges: keys (row, source's global ID, relation) of a run, sorted, searched
        cuts = np.searchsorted(indptr, np.arange(0, int(indptr[-1]) + CHUNK, CHUNK), side="right") - 1
        cuts = np.unique(np.r_[np.clip(cuts, 0, n), n])
        for r0, r1 in zip(cuts[:-1], cuts[1:]):
            lo, hi = np.searchsorted(rows[by_row], [r0, r1])
            if lo == hi:
                continue
            e0, e1 = int(indptr[r0]), int(indptr[r1])
            key = np.repeat(np.arange(r1 - r0, dtype=np.int64), np.diff(indptr[r0:r1 + 1])) * N + gid[indices[e0:e1]]
            typed = edge_type is not None
            if typed:
                key = key * R + np.asarray(edge_type[e0:e1], dtype=np.int64)
            key.sort()
            q = by_row[lo:hi]
            want = (rows[q] - r0) * N + got[q, 1]
            if typed:      # (an untyped pair of a typed graph: any relation)
                t = got[q, 3]
                want = want * R + np.maximum(t, 0)
                at = np.searchsorted(key, want)
                found = at < len(key)
                found[found] = (key[at[found]] == want[found]) | ((t[found] < 0) & (key[at[found]] // R ==
                                                                                     want[found] // R))
            else:
                at = np.minimum(np.searchsorted(key, want), len(key) - 1)
                found = key[at] == want
            hit[q] = found
    mine = np.full(6, -1, dtype=np.int64)
    if hit.any():
        first = got[hit][np.argmin(got[hit, 0])]
        mine[:5] = first
        mine[5] = np.asarray(orig_ids)[first[2] - owned_start]
    every = np.empty(6 * wd.comm.size, dtype=np.int64)
    wd.allgather(mine, every, what=what)
    every = every.reshape(-1, 6)
    found = np.flatnonzero(every[:, 0] >= 0)
    if not len(found):
        return None
    r = int(found[np.argmin(every[found, 0])])
    return every[r], int(owner(every[r, 1:2])[0]), r
