"""``DistGraph``: one rank's view of the partitioned graph as the operators need it.

Built once from the rank's ``PartData``: the exchange plan, the aggregation blocks per edge weighting
(cached), the original IDs of owned and halo rows (halo IDs fetched once with the exchange itself), and the
schedule. Layers ask it for exchanges and blocks; they never touch MPI.
"""
from __future__ import annotations

from functools import partial

import numpy as np
import torch

from g3mpi.comm import CommContext, HaloPlan
from g3mpi.sched import Schedule

from .blocks import BlockMatrix, row_groups
from .heads import HeadPattern
from .scratch import ScratchPool

#: edge weightings a layer can ask for: the built-ins' (``gcn`` with self loops, SAGE's ``mean`` over the file's
#: edges, ``gat``) and those of ``propagate`` (``REDUCES``, ``+loops``: one self loop per node)
KINDS = ("gcn", "mean", "gat", "sum", "sum+loops", "avg", "avg+loops", "gcn-noloops", "rel-sum", "rel-mean")
#: the reductions of ``g3mpi.nn.propagate``
REDUCES = ("sum", "mean", "gcn")
#: those of a typed ``propagate`` (``relations=True``): per relation, summed (``rel-``)
TYPED_REDUCES = ("sum", "mean")


def propagate_kind(reduce: str, self_loops: bool) -> str:
    """The block kind of ``propagate(reduce, self_loops)``: the file's self loops are left out, ``self_loops`` adds
    one per node (so ``gcn`` with loops is the built-in GCN's kind, PyG's ``add_remaining_self_loops``)."""
    if reduce not in REDUCES:
        raise ValueError(f"reduce {reduce!r}: expected one of {', '.join(REDUCES)}")
    if reduce == "gcn":
        return "gcn" if self_loops else "gcn-noloops"
    return ("avg" if reduce == "mean" else "sum") + ("+loops" if self_loops else "")


#: edges per slice when edge weights are computed (bounds the float64 temporaries)
_EDGE_SLICE = 1 << 20


def _edge_weights(indptr, indices, fn) -> np.ndarray:
    """float32 weight of every CSR entry, ``fn(rows, cols)`` evaluated in float64 over slices of about
    _EDGE_SLICE edges (whole rows), so no edge-length float64 or int64 array is ever made."""
    indptr = np.asarray(indptr)
    out = np.empty(int(indptr[-1]), dtype=np.float32)
    n = len(indptr) - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(indptr, indptr[a] + _EDGE_SLICE, side="right")) - 1
        b = min(n, max(b, a + 1))
        e0, e1 = int(indptr[a]), int(indptr[b])
        rows = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a:b + 1]))
        out[e0:e1] = fn(rows, indices[e0:e1])
        a = b
    return out


def _gcn_dinv(part) -> np.ndarray:
    return (np.asarray(part.in_degree, np.float64) + 1.0) ** -0.5


def _mean_inv(part) -> np.ndarray:
    n = part.num_owned
    return 1.0 / np.maximum(np.asarray(part.in_degree[:n], np.float64) + np.asarray(part.self_loops, np.float64),
                            1.0)


def _gcn_dinv_noloops(part) -> np.ndarray:
    deg = np.asarray(part.in_degree, np.float64)
    return np.where(deg > 0, 1.0 / np.sqrt(np.maximum(deg, 1.0)), 0.0)


def _avg_inv(part, loops: bool) -> np.ndarray:
    return 1.0 / np.maximum(np.asarray(part.in_degree[:part.num_owned], np.float64) + float(loops), 1.0)


def typed_kind(reduce: str) -> str:
    """The block kind of a typed ``propagate(reduce)``: per relation, a sum or R-GCN's mean (1 / c_{i,r})."""
    if reduce not in TYPED_REDUCES:
        raise ValueError(f"reduce {reduce!r} per relation: expected one of {', '.join(TYPED_REDUCES)}")
    return "rel-" + reduce


def _relation_mean_weights(n: int, R: int, indptr, indices) -> np.ndarray:
    """1 / c_{i,r} for every entry of a typed block (columns j R + r): c_{i,r} the entries of row i of relation
    r, which are all of i's in-edges of relation r (the part holds every in-edge of an owned row)."""
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    rows *= R
    rows += np.asarray(indices) % R
    count = np.bincount(rows, minlength=n * R)
    return (1.0 / count[rows]).astype(np.float32)


def _gcn_weights(part, indptr, indices, dinv_of=_gcn_dinv) -> np.ndarray:
    dinv = dinv_of(part)
    return _edge_weights(indptr, indices, lambda r, c: dinv[r] * dinv[c])


def _mean_weights(part, indptr, indices) -> np.ndarray:
    inv = _mean_inv(part)
    return _edge_weights(indptr, indices, lambda r, c: inv[r])


class DistGraph:
    def __init__(self, part, ctx: CommContext, schedule: Schedule | None = None, stager=None, reload_edges=None):
        """``stager``: a :class:`~g3mpi.ops.staging.Stager` when the layers compute on device tensors (every
        layer's exchange is then staged through host buffers); None: on the exchanges' own buffers.
        ``reload_edges``: a function returning the part's local CSR ``(indptr, indices)`` read again from its file
        (``g3mpi.format.read_part_edges``), which lets :meth:`release_edges` drop it; None: kept for the run."""
        self.part = part
        self._reload_edges = reload_edges
        self.ctx = ctx
        self.stager = stager
        self.schedule = schedule or Schedule()
        self.plan = HaloPlan.from_part(part)
        self.num_owned = part.num_owned
        self.num_halo = part.num_halo
        self.orig_ids = torch.from_numpy(np.asarray(part.orig_ids, dtype=np.int64))
        self.num_boundary = int(part.num_boundary)   # owned rows 0 .. num_boundary-1 are the send rows
        self._blocks = {}
        self.scratch = ScratchPool()    # the typed aggregations' wide rows, reused epoch to epoch
        self._sites = 0     # dropout sites handed to user modules (``new_site``)
        # original IDs of halo rows: needed by randomness keyed on source nodes (GAT attention dropout)
        self.halo_orig_ids = torch.from_numpy(self.halo_rows(np.asarray(part.orig_ids, dtype=np.int64), "orig_ids"))

    def halo_rows(self, rows: np.ndarray, name: str = "rows") -> np.ndarray:
        """The halo's rows of a per-node array (``rows`` [n_owned, ...]: this rank's owned rows, any fixed-size
        dtype, 16-bit floats and bfloat16's uint16 included), fetched from their owners once: a new array
        [n_halo, ...] of the same dtype, bit for bit. Every rank calls it, in the same order."""
        rows = np.asarray(rows)
        if rows.shape[0] < self.num_owned:
            raise ValueError(f"halo_rows: expected [{self.num_owned}, ...] rows, got {rows.shape}")
        tail = rows.shape[1:]
        width = int(np.prod(tail, dtype=np.int64)) * rows.dtype.itemsize
        # moved as bytes (an MPI type for every dtype); the exchange and its buffers end with the call
        ex = self.ctx.exchange(self.plan, width, dtype=np.uint8, name=name)
        try:
            ex.start_forward(np.ascontiguousarray(rows[:self.num_owned]).view(np.uint8).reshape(self.num_owned,
                                                                                                  width))
            ex.forward.wait_all()
            return ex.halo.copy().view(rows.dtype).reshape((self.num_halo, *tail))
        finally:
            self.ctx.release(ex)

    # -- the graph handle of user models (g3mpi.nn): owned and halo rows, their original IDs, global degrees -----
    @property
    def num_relations(self) -> int:
        """Edge types of the graph (R; 0: untyped)."""
        return int(getattr(self.part, "num_relations", 0) or 0)

    @property
    def num_nodes(self) -> int:
        """Nodes of the whole graph (all ranks)."""
        return int(self.part.num_nodes)

    @property
    def owned_start(self) -> int:
        """The first new global ID this rank owns (its owned rows are ``owned_start .. owned_end - 1``)."""
        return int(self.part.owned_start)

    @property
    def owned_end(self) -> int:
        return int(self.part.owned_end)

    @property
    def owned_ids(self) -> torch.Tensor:
        """Original node IDs of the owned rows, int64 [n_owned] (increasing; boundary rows first in row order)."""
        return self.orig_ids

    @property
    def halo_ids(self) -> torch.Tensor:
        """Original node IDs of the halo rows, int64 [n_halo]."""
        return self.halo_orig_ids

    @property
    def in_degree(self) -> torch.Tensor:
        """In-degree over the whole graph (self loops not counted) of the owned rows, int64 [n_owned]."""
        return torch.from_numpy(np.asarray(self.part.in_degree[:self.num_owned], dtype=np.int64))

    @property
    def out_degree(self) -> torch.Tensor:
        """Out-degree over the whole graph (self loops not counted) of the owned rows, int64 [n_owned]: edges to
        nodes of every rank, counted when the graph was partitioned."""
        return torch.from_numpy(np.asarray(self.part.out_degree[:self.num_owned], dtype=np.int64))

    def new_site(self) -> int:
        """The next dropout site (0, 1, ...): ``g3mpi.nn``'s modules take theirs in construction order, the same on
        every rank, so their masks are keyed alike whatever the partition."""
        self._sites += 1
        return self._sites - 1

    def blocks(self, kind: str) -> BlockMatrix:
        """Aggregation blocks for an edge weighting (cached):
        ``gcn``: D^-1/2 (A + I) D^-1/2 with D the global in-degree + 1 (PyG ``gcn_norm``);
        ``mean``: 1 / (in-degree + self loops) per row, a node's own row weighted by its self loops in the
        graph file (PyG ``SAGEConv``'s mean over the edges as given, loops and duplicates included);
        ``gat``: unit weights with self loops (the attention supplies the weights);
        ``propagate``'s kinds (:func:`propagate_kind`), over the edges without the file's self loops, ``+loops``
        adding one per node: ``sum`` unit weights; ``avg`` 1 / (in-degree [+ 1]) per row; ``gcn-noloops``
        D^-1/2 A D^-1/2 with D the global in-degree (0 for a node without in-edges, as PyG);
        typed (``rel-sum``, ``rel-mean``: :func:`typed_kind`), over the file's edges without its self loops, one
        column per (source, relation) (``BlockMatrix.fold`` = R): unit weights, or 1 / c_{i,r} with c_{i,r} the
        in-edges of i of relation r (R-GCN's normalisation, PyG ``RGCNConv``'s mean)."""
        if kind not in self._blocks:
            p = self.part
            n = self.num_owned
            # per-edge weights as a function of the part, called while the blocks build their forms (neither
            # they nor the float64 degree arrays they come from outlive that); a mean is the pattern and a row
            # scaling (w_ij = r_i), but for a node's repeated self loops
            vals, diag, row, types, fold = None, None, None, None, 1
            if kind in ("rel-sum", "rel-mean"):
                if not p.num_relations:
                    raise ValueError(f"aggregation {kind!r} needs edge types, and this graph has none "
                                     f"(num_relations 0)")
                types, fold = p.edge_type, int(p.num_relations)
                if kind == "rel-mean":
                    vals = partial(_relation_mean_weights, n, fold)
            elif kind == "gcn":
                vals = partial(_gcn_weights, p)
                diag = (_gcn_dinv(p)[:n] ** 2).astype(np.float32)
            elif kind == "mean":
                loops = np.asarray(p.self_loops, np.float64)
                if loops.max(initial=0) > 1:
                    vals = partial(_mean_weights, p)
                    diag = (loops * _mean_inv(p)).astype(np.float32)
                else:       # 0 or 1 self loop: a pattern entry where there is one
                    row = _mean_inv(p)
                    diag = loops.astype(np.float32) if loops.any() else None
            elif kind in ("gat", "sum+loops"):
                diag = np.ones(n, dtype=np.float32)
            elif kind in ("avg", "avg+loops"):
                loops = kind == "avg+loops"
                row = _avg_inv(p, loops)
                diag = np.ones(n, dtype=np.float32) if loops else None
            elif kind == "gcn-noloops":
                vals = partial(_gcn_weights, p, dinv_of=_gcn_dinv_noloops)
            elif kind != "sum":
                raise ValueError(f"unknown aggregation kind {kind!r}")
            released = p.indptr is None
            indptr, indices = self._reload_edges() if released else (p.indptr, p.indices)
            bm = BlockMatrix(indptr, indices, n, self.plan.recv_offsets, self.num_boundary, vals, diag,
                             None if row is None else row[:n], types=types, fold=fold)
            if released:
                bm.release_edges(self._reload_edges)
            self._blocks[kind] = bm
        return self._blocks[kind]

    def release_edges(self) -> bool:
        """Drop the part's local CSR (4 bytes an edge and 8 a row) once the forms the layers use are built, the
        blocks reading it again from the part file for a form made later (a new schedule's chunks, a kind first
        asked for now). Whether it was dropped: not without ``reload_edges``."""
        if self._reload_edges is None:
            return False
        for bm in self._blocks.values():
            if isinstance(bm, BlockMatrix):
                bm.release_edges(self._reload_edges)
        self.part.release_edges()
        return True

    def matrices(self) -> list[BlockMatrix]:
        """The aggregation blocks built so far, one per edge weighting a layer asked for (read-only; the caches
        derived from them, head patterns and row groups, index the same matrices)."""
        return [b for b in self._blocks.values() if isinstance(b, BlockMatrix)]

    def built_head_patterns(self) -> list:
        """Every ``HeadPattern`` :meth:`head_patterns` built so far, local and neighbour ones (read-only)."""
        return [p for k, v in self._blocks.items() if isinstance(k, tuple) and k[0] == "heads" for p in (v[0], *v[1])]

    def head_patterns(self, heads: int):
        """(local, [one per receive neighbour]) ``HeadPattern`` of the ``gat`` blocks for ``heads`` heads (cached:
        GAT layers with the same head count share them)."""
        key = ("heads", int(heads))
        if key not in self._blocks:
            blk = self.blocks("gat")
            local = HeadPattern(blk.local.crow_indices(), blk.local.col_indices(), self.num_owned, heads)
            nbs = [HeadPattern(nb.mat.crow_indices(), nb.mat.col_indices(), nb.mat.shape[1], heads)
                   for nb in blk.neighbours]
            self._blocks[key] = (local, nbs)
        return self._blocks[key]

    def row_groups(self, kind: str):
        """(boundary, interior) row groups of the blocks of ``kind`` (cached)."""
        key = ("groups", kind)
        if key not in self._blocks:
            self._blocks[key] = row_groups(self.blocks(kind))
        return self._blocks[key]

    def exchange(self, width: int, name: str = ""):
        """A layer's exchange of ``width`` floats a row, its messages in pieces by the schedule's piece rule (staged
        by the graph's ``stager``, if any)."""
        st = self.stager
        ex = self.ctx.exchange(self.plan, width, name=name, piece_rows=self.schedule.rows_per_piece(width),
                               alloc=st.alloc if st is not None else None)
        if st is not None:
            st.stage(ex)
        return ex
