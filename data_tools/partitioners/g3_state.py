"""G3's refinement state: the exact bookkeeping of one assignment as batches of nodes move (:mod:`.g3`).

:class:`_State` keeps the replica counts C[u, r] = #edges from u into part r, and from them every per-part
figure the refinement ranks partitions by: owned nodes n_p, local in-edges e_p, halo_p (the nodes of other
parts with an edge into p) and send_p (per node of p, the other parts it has an out-edge into), the caps, and
the load

    load_p = compute_p + comm_p + PENALTY * mean_cost * (excess_nodes_p / node_cap + excess_edges_p / edge_cap)

(the model of :mod:`.g3`'s docstring). C is dense (N x P int32) when N x P <= ``DENSE_LIMIT``: a move updates
it incrementally, O(moved in-edges x P), and no full pass over the graph; else a sparse matrix rebuilt after
each move (O(E) per evaluation, any P). Every figure is an integer count: incremental updates are exact in any
order. :meth:`_State.apply` moves a batch and keeps an undo record (the changed rows of C, up to
``UNDO_LIMIT`` entries; larger batches are undone by moving back), :meth:`_State.undo` takes the latest one
back (at most the last two: a chained step). A batch is kept if it lowers :meth:`_State.key`, (cap violation,
max cost, max communication rows, total halo rows), lexicographically (:func:`_better`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from g3mpi.sorting import sorted_unique as _sorted_unique

from .caps import part_edge_caps
from .cost import replica_matrix

if TYPE_CHECKING:
    from .g3 import _Refiner

#: weight of the cap penalty in a part's load, in mean part costs per cap's worth of excess
PENALTY = 10.0
#: largest N x P for which the replica counts are kept dense (int32: 1 GiB); :mod:`.g3_moves` reads it from here
DENSE_LIMIT = 1 << 28
#: edges counted at a time into a symmetric graph's dense C (at least E / 64)
COUNT_BLOCK_EDGES = 1 << 22
#: most entries of C an undo record keeps (int32: 64 MiB); larger moves are undone by moving back
UNDO_LIMIT = 1 << 24


class _State:
    """Per-part figures of one assignment, updated incrementally as nodes move.

    ``C[u, r]`` = number of edges from u into part r, kept dense (N x P int32) when that fits in
    ``DENSE_LIMIT`` entries, so that a move costs O(its in-edges x P) and no full pass over the graph;
    otherwise a sparse matrix rebuilt after each move (O(E) per evaluation, any P). ``ext[u]`` = number of
    other parts u has an out-edge into (u's send rows; u is a boundary node when it is > 0).
    """

    def __init__(self, ref: _Refiner, a: np.ndarray):
        self.ref = ref
        self.a = a.copy()
        self._undo = []
        self.version = next(self.ref.versions)
        P, N = ref.P, ref.N
        self.dense = N * P <= DENSE_LIMIT
        self.n = np.bincount(a, minlength=P).astype(float)
        self.e = np.bincount(a, weights=ref.in_deg, minlength=P)
        if self.dense:
            if ref.symmetric:
                self.C = self._counts_by_rows(a)
            else:
                self.C = np.bincount(ref.src * P + a[ref.dst], minlength=N * P).astype(np.int32).reshape(N, P)
            self.flat = self.C.reshape(-1)   # views: C is only ever updated in place
            self._row_items = self.C.view(np.dtype((np.void, self.C.itemsize * P))).reshape(N)   # a row per item
            self.halo = np.zeros(P)
            self.send = np.zeros(P)
            self.ext = np.zeros(N, dtype=np.int64)
            chunk = max(1, (1 << 21) // P)   # rows per block: its float copy in _replicas stays within 16 MiB
            for s0 in range(0, N, chunk):
                s1 = min(N, s0 + chunk)
                halo, send, self.ext[s0:s1] = self._replicas(self.C[s0:s1], a[s0:s1])
                self.halo += halo
                self.send += send
        else:
            self._rebuild()
        self._summarise()

    # ---- the replica counts
    def _counts_by_rows(self, a: np.ndarray) -> np.ndarray:
        """Dense C of a symmetric graph: u's edges into part r are its row's neighbours in r, so C is counted
        row block by row block, each block's keys in order (4x faster than counting the scattered sources, on
        R-MAT 20; temporaries of one block, not of every edge)."""
        ref, P = self.ref, self.ref.P
        from ..build import row_blocks
        C = np.zeros((ref.N, P), dtype=np.int32)
        cuts = row_blocks(ref.deg, max(COUNT_BLOCK_EDGES, len(ref.src) // 64))
        narrow = a.astype(np.int32)   # (a smaller array to gather from: fewer cache misses)
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            e0, e1 = int(ref.indptr[lo]), int(ref.indptr[hi])
            key = (ref.dst[e0:e1] - lo) * P
            key += narrow.take(ref.src[e0:e1])
            C[lo:hi] = np.bincount(key, minlength=(hi - lo) * P).reshape(hi - lo, P)
        return C

    def _rebuild(self):
        ref, P, a = self.ref, self.ref.P, self.a
        m = replica_matrix(ref.src, ref.dst, a, P)
        self.m = m
        rows = np.repeat(np.arange(ref.N, dtype=np.int64), np.diff(m.indptr))
        cols = m.indices.astype(np.int64)
        self.keys = rows * P + cols
        remote = cols != a[rows]
        self.ext = np.bincount(rows[remote], minlength=ref.N)
        self.halo = np.bincount(cols[remote], minlength=P).astype(float)
        self.send = np.bincount(a[rows[remote]], minlength=P).astype(float)
        self.n = np.bincount(a, minlength=P).astype(float)
        self.e = np.bincount(a, weights=ref.in_deg, minlength=P)

    def _replicas(self, block, parts):
        """(halo rows per part, send rows per part, ext of each row) contributed by the rows ``block`` of C, owned
        by ``parts``. The row and column counts are products with 0/1 float matrices (exact below 2^53; numpy's
        integer reductions along short rows or down columns are several times slower)."""
        b = block > 0
        b[np.arange(len(parts)), parts] = False
        f = b.astype(float)
        ext = (f @ np.ones(self.ref.P)).astype(np.int64)
        return np.ones(len(f)) @ f, np.bincount(parts, weights=ext, minlength=self.ref.P), ext

    def c_rows(self, v: np.ndarray) -> np.ndarray:
        """C[v] (a copy) for an array of nodes v (dense counts): numpy 2.4's fancy indexing of short rows is 5-10x
        slower than take."""
        return self.C.take(v, axis=0)

    def _put_rows(self, rows: np.ndarray, block: np.ndarray):
        """C[rows] = block, a row as one item (2-8x faster than assigning short rows by fancy indexing)."""
        self._row_items[rows] = np.ascontiguousarray(block).view(self._row_items.dtype).reshape(-1)

    def get(self, u: np.ndarray, q: np.ndarray) -> np.ndarray:
        """C[u, q] for arrays of (u, q) pairs."""
        if self.dense:
            return self.flat.take(u * self.ref.P + q)   # flat lookups: cheaper than C[u, q]
        k = u * self.ref.P + q
        i = np.minimum(np.searchsorted(self.keys, k), max(0, len(self.keys) - 1))
        hit = self.keys[i] == k if len(self.keys) else np.zeros(len(k), dtype=bool)
        return np.where(hit, self.m.data[i], 0)

    def out_pairs(self, v: np.ndarray, weights: bool = True):
        """(index into v, part r, C[v, r]) for the non-zero entries of the rows v, row by row, parts ascending.
        ``weights=False``: (index into v, part r) only."""
        if self.dense:
            rows = self.c_rows(v)
            ci, r = np.nonzero(rows)
            return (ci, r, rows[ci, r].astype(float)) if weights else (ci, r)
        cnt = np.diff(self.m.indptr)[v]
        ci = np.repeat(np.arange(len(v), dtype=np.int64), cnt)
        pos = np.repeat(self.m.indptr[v] - np.concatenate([[0], np.cumsum(cnt)[:-1]]), cnt) + np.arange(int(cnt.sum()))
        r = self.m.indices[pos].astype(np.int64)
        return (ci, r, self.m.data[pos].astype(float)) if weights else (ci, r)

    # ---- moves
    def apply(self, nodes: np.ndarray, dest: np.ndarray) -> np.ndarray:
        """Move nodes to dest; returns their previous parts (for :meth:`apply` back, or :meth:`undo`)."""
        ref, P = self.ref, self.ref.P
        old = self.a[nodes].copy()
        if not len(nodes):  # nothing moves (a chained step whose balance half proposes nothing): an undo record only
            self._undo = self._undo[-1:] + [(nodes, old, self.version, (None, None, None, (), []))]
            return old
        if not self.dense:  # the sparse counts are rebuilt, never mutated: undo can keep the previous ones
            keys = self._FIGURES + ("m", "keys", "ext")
            saved = (None, None, None, keys, [getattr(self, k) for k in keys]) if len(self.keys) <= UNDO_LIMIT else None
            self._undo = self._undo[-1:] + [(nodes, old, self.version, saved)]
            self.version = next(self.ref.versions)
            self.a[nodes] = dest
            self._rebuild()
            self._summarise()
            return old
        ci, u = ref.in_edges(nodes)
        # the rows of C that change and the moved nodes (sorted), and where each u is among them
        if ref.N <= 32 * (len(nodes) + len(u)):
            mark = np.zeros(ref.N, dtype=bool)
            mark[nodes] = True
            mark[u] = True
            rows = np.flatnonzero(mark)
            where = np.empty(ref.N, dtype=np.int64)
            where[rows] = np.arange(len(rows))
            at = where[u] * P
        else:
            rows = _sorted_unique(np.concatenate([nodes, u]))
            at = rows.searchsorted(u) * P
        block = self.c_rows(rows)
        # what undo restores: the rows of C (small enough to keep), the per-part figures (replaced, never mutated)
        ext0 = self.ext[rows]
        saved = ((rows, block.copy(), ext0, self._FIGURES, [getattr(self, k) for k in self._FIGURES])
                 if block.size <= UNDO_LIMIT else None)
        self._undo = self._undo[-1:] + [(nodes, old, self.version, saved)]
        self.version = next(self.ref.versions)
        halo0, send0, _ = self._replicas(block, self.a[rows])
        nb = len(rows) * P
        if nb <= 16 * len(u) + 4096:
            block += (np.bincount(at + dest[ci], minlength=nb) - np.bincount(at + old[ci], minlength=nb)).reshape(-1, P)
        else:
            flat = block.reshape(-1)
            np.subtract.at(flat, at + old[ci], 1)
            np.add.at(flat, at + dest[ci], 1)
        self._put_rows(rows, block)
        self.a[nodes] = dest
        halo1, send1, self.ext[rows] = self._replicas(block, self.a[rows])
        self.halo = self.halo + (halo1 - halo0)   # integer counts: exact in any order
        self.send = self.send + (send1 - send0)
        d_e = ref.in_deg[nodes]
        self.n = self.n + (np.bincount(dest, minlength=P) - np.bincount(old, minlength=P))
        self.e = self.e + (np.bincount(dest, weights=d_e, minlength=P) - np.bincount(old, weights=d_e, minlength=P))
        self._summarise()
        return old

    def undo(self):
        """Take back the latest :meth:`apply` not yet undone (at most the last two can be)."""
        nodes, old, version, saved = self._undo.pop()
        if saved is None:  # too much to keep: move back (exact integer counts, the same figures)
            self.apply(nodes, old)
            self._undo.pop()
            self.version = version
            return
        self.version = version
        rows, block, ext, keys, values = saved
        if rows is not None:
            self._put_rows(rows, block)
            self.ext[rows] = ext
        self.a[nodes] = old
        for k, v in zip(keys, values):
            setattr(self, k, v)

    #: every per-part figure that apply and _summarise replace
    _FIGURES = ("halo", "send", "n", "e", "edge_cap", "cost", "excess_n", "excess_e", "violation", "mean_cost", "load",
                "max_cost", "total_comm", "comm", "max_comm")

    def _summarise(self):
        ref = self.ref
        self.comm = self.halo + self.send
        comp, comm = ref.model.layer_costs(self.e, self.comm)
        self.cost = comp + comm
        self.excess_n = np.maximum(0.0, self.n - ref.node_cap) / ref.node_cap
        self.edge_cap = part_edge_caps(self.a, ref.hubs, ref.in_deg, ref.edge_cap, ref.edge_slack, len(self.e))
        self.excess_e = np.maximum(0.0, self.e - self.edge_cap) / np.maximum(1.0, self.edge_cap)
        self.violation = float(self.excess_n.sum() + self.excess_e.sum())
        self.mean_cost = float(self.cost.sum() / len(self.cost))   # = cost.mean(), without its Python overhead
        self.load = self.cost + PENALTY * self.mean_cost * (self.excess_n + self.excess_e)
        self.max_cost = float(self.cost.max())
        self.total_comm = float(self.halo.sum())
        self.max_comm = float(self.comm.max())

    def comm_spread(self) -> float:
        """Max / mean communication rows of the parts."""
        return float(self.comm.max() / max(1e-300, self.comm.mean()))

    def key(self, bound: float = 0.0) -> tuple:
        """(cap violation, max cost (any value up to ``bound`` counts as ``bound``), max comm rows, total halo)."""
        return (self.violation, max(self.max_cost, bound), self.max_comm, self.total_comm)


def _better(new: tuple, old: tuple) -> bool:
    """Lexicographic on (violation, max cost, max comm rows, total halo): less cap violation; else a lower
    maximum cost; else as high a maximum with a lower maximum of communication rows; else less traffic."""
    (v1, c1, m1, t1), (v0, c0, m0, t0) = new, old
    if v1 < v0 * (1 - 1e-9) - 1e-12:
        return True
    if v1 > v0 + 1e-12:
        return False
    if c1 < c0 * (1 - 1e-9):
        return True
    if c1 > c0 * (1 + 1e-12):
        return False
    if m1 < m0:
        return True
    return m1 <= m0 and t1 < t0
