"""Boundary-first order of a part's rows: where the relabelling puts each node inside its part's range.

Every writer (``data_tools.build``, ``data_tools.parallel_build``) numbers a part's nodes by the key of
:func:`order_keys`, then by original ID: first the boundary rows (some other part has an in-edge from them, so
they are in a send list), sorted by the first and then the last part that needs them, then the interior rows.
So the rows of every send list lie before the interior ones, and with up to two neighbours per part each send
list is one contiguous range, which the runtime sends as a view and whose gradients it adds in place; with more,
the rows of the first neighbour still are. Ties (and the interior rows) keep the original order.
docs/FORMAT.md, "part-NNNNN.h5".
"""
from __future__ import annotations

import numpy as np


def no_needs(n: int, num_parts: int) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) part needing each of ``n`` nodes, before any edge is seen: (num_parts, -1) = none."""
    return np.full(n, num_parts, dtype=np.int64), np.full(n, -1, dtype=np.int64)


def note_needs(first: np.ndarray, last: np.ndarray, src: np.ndarray, src_part: np.ndarray,
               dst_part: np.ndarray) -> None:
    """Account edges src -> dst (``src`` indexes ``first``/``last``): the part of dst needs src when it is not
    src's own part."""
    cross = src_part != dst_part
    np.minimum.at(first, src[cross], dst_part[cross])
    np.maximum.at(last, src[cross], dst_part[cross])


def order_keys(first: np.ndarray, last: np.ndarray, num_parts: int) -> np.ndarray:
    """Sort key of each node inside its part: ``first * P + last`` for a boundary node, ``P * P`` (after every
    boundary key) for an interior one."""
    P = int(num_parts)
    return np.where(last >= 0, first * P + last, P * P).astype(np.int64)


def graph_order_keys(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, num_parts: int,
                     blocks, symmetric: bool = False) -> np.ndarray:
    """:func:`order_keys` of every node of a whole in-edge CSR (row = destination), ``blocks`` the row range
    boundaries to go through it by (bounded temporaries). ``symmetric``: every edge's reverse is there too, so
    the parts needing u are those of u's own row (:func:`row_needs`)."""
    if symmetric:
        return order_keys(*row_needs(indptr, indices, assignment, num_parts, blocks), num_parts)
    first, last = no_needs(len(assignment), num_parts)
    for lo, hi in zip(blocks[:-1], blocks[1:]):
        src = np.asarray(indices[indptr[lo]:indptr[hi]], dtype=np.int64)
        dst = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
        note_needs(first, last, src, assignment[src], assignment[dst])
    return order_keys(first, last, num_parts)


def row_needs(indptr: np.ndarray, indices: np.ndarray, assignment: np.ndarray, num_parts: int,
              blocks) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) part needing each node of a symmetric graph: the least and the greatest other part among
    its row's neighbours, by reductions along the rows (on R-MAT 22, 4x faster than :func:`note_needs`'s
    scattered updates)."""
    P = int(num_parts)
    first, last = no_needs(len(assignment), P)
    assignment = np.asarray(assignment).astype(np.int32)   # (P <= 2^31 - 2: half the memory traffic of int64)
    for lo, hi in zip(blocks[:-1], blocks[1:]):
        e0, e1 = int(indptr[lo]), int(indptr[hi])
        if e1 == e0:
            continue
        pv = assignment.take(np.asarray(indices[e0:e1]))
        d = np.diff(np.asarray(indptr[lo:hi + 1], dtype=np.int64))
        cross = pv != np.repeat(assignment[lo:hi], d)
        rows = np.flatnonzero(d) + lo
        starts = np.asarray(indptr[rows], dtype=np.int64) - e0
        first[rows] = np.minimum.reduceat(np.where(cross, pv, P), starts)
        last[rows] = np.maximum.reduceat(np.where(cross, pv, -1), starts)
    return first, last


def boundary_first_order(assignment: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """new_to_orig: nodes by part, then by key, then by original ID (``np.lexsort`` is stable)."""
    return np.lexsort((keys, assignment)).astype(np.int64)


def ranks_of_groups(comm, groups: np.ndarray) -> np.ndarray:
    """Position of each of this rank's nodes in the order (group, rank, original order) over every rank, where
    ``groups`` are its nodes' sort groups (part * K + key) in original order and the ranks hold consecutive
    original ranges: the parallel :func:`boundary_first_order`. Only the distinct groups travel (Allgatherv)."""
    from g3mpi.mpi.collectives import allgatherv, displacements
    from g3mpi.sorting import sorted_unique
    uniq, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    all_g, sizes = allgatherv(comm, uniq.astype(np.int64), "relabelling (the parts' sort groups)")
    displ = displacements(sizes)
    all_c, _ = allgatherv(comm, counts.astype(np.int64), "relabelling (the parts' sort groups)")
    glob = sorted_unique(all_g)
    at = np.searchsorted(glob, all_g)
    total = np.bincount(at, weights=all_c, minlength=len(glob)).astype(np.int64)
    start = np.concatenate([[0], np.cumsum(total)[:-1]])
    before_rank = np.arange(len(all_g)) < displ[comm.rank]
    before = np.bincount(at[before_rank], weights=all_c[before_rank], minlength=len(glob)).astype(np.int64)
    mine = np.searchsorted(glob, uniq)
    order = np.argsort(inverse, kind="stable")
    within = np.empty(len(groups), dtype=np.int64)
    group_start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    within[order] = np.arange(len(groups)) - group_start[inverse[order]]
    return start[mine][inverse] + before[mine][inverse] + within


def slice_order_keys(sl, lg, own_parts: np.ndarray, num_parts: int, block_edges: int) -> np.ndarray:
    """:func:`order_keys` of this rank's rows of the graph (``sl``: a ``GraphSlice`` of in-edges with global
    sources, ``own_parts`` their parts) when the ranks hold slices: ``lg``'s ghosts hold every source outside the
    slice; their parts come from their owners, and what a ghost's needs are is reduced at its owner."""
    n_own = sl.num_rows
    parts = np.concatenate([own_parts, lg.plan.pull(own_parts)]).astype(np.int64)
    first, last = no_needs(n_own + len(lg.ghosts), num_parts)
    ends = np.asarray(sl.indptr[1:])
    cuts = np.searchsorted(ends, np.arange(block_edges, int(sl.indptr[-1]), block_edges), side="left")
    bounds = np.unique(np.concatenate([[0], cuts, [n_own]]).astype(np.int64))
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        dst = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(sl.indptr[a:b + 1]))
        gid = np.asarray(sl.indices[sl.indptr[a]:sl.indptr[b]], dtype=np.int64)
        inside = (gid >= sl.lo) & (gid < sl.hi)
        src = np.where(inside, gid - sl.lo, 0)
        src[~inside] = n_own + np.searchsorted(lg.ghosts, gid[~inside])
        note_needs(first, last, src, parts[src], parts[dst])
    lg.plan.push_reduce(first[n_own:], first[:n_own], np.minimum)
    lg.plan.push_reduce(last[n_own:], last[:n_own], np.maximum)
    return order_keys(first[:n_own], last[:n_own], num_parts)
