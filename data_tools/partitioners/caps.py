"""The balance constraints of a partition, and the repairs that enforce them.

A part may own at most ``node_limit`` nodes (memory) and hold at most its edge cap of local in-edges (compute):
``edge_imbalance`` x the mean part, raised for a part owning a hub (a node with more in-edges than the mean
part) to that hub's in-degree + the cap's slack (:func:`part_edge_caps`). The refinement (:mod:`.g3`) keeps
them; :func:`repair_nodes` and :func:`repair_edges` enforce them afterwards where it could not (usually they
move nothing), and :func:`fill_isolated` places the nodes without edges, which cost nothing anywhere.
"""
from __future__ import annotations

import numpy as np


def fill_isolated(a: np.ndarray, isolated: np.ndarray, num_parts: int) -> np.ndarray:
    """Re-place the nodes without any edge (they cost nothing anywhere) so owned counts are as equal as possible.

    Water-filling: with k_p connected nodes in part p and I isolated ones, part p receives
    max(0, L - k_p) of them for the level L that uses all I (ties by part ID); isolated nodes go, in ID
    order, to the parts in ID order. Moves no edge and no communication row.
    """
    a = a.copy()
    iso = np.nonzero(isolated)[0]
    if not len(iso):
        return a
    k = np.bincount(a[~isolated], minlength=num_parts)
    total = len(iso)
    lo, hi = 0, int(k.max()) + total
    while lo < hi:  # smallest level L with sum(max(0, L - k)) >= total (log2(N) steps)
        mid = (lo + hi) // 2
        if np.maximum(0, mid - k).sum() >= total:
            hi = mid
        else:
            lo = mid + 1
    quota = np.maximum(0, lo - 1 - k)
    rest = total - int(quota.sum())
    short = np.nonzero(k + quota < lo)[0][:rest]  # the remainder: one more each, lowest part IDs first
    quota[short] += 1
    a[iso] = np.repeat(np.arange(num_parts, dtype=np.int64), quota)
    return a


def repair_nodes(a: np.ndarray, cap: float, num_parts: int, degree: np.ndarray) -> np.ndarray:
    """Enforce owned nodes <= cap: parts over it give their lowest-degree nodes (ties by ID) to the parts with
    most room (water-filling, part IDs break ties). A last resort after refinement; usually moves nothing."""
    a = a.copy()
    limit = node_limit(cap, len(a), num_parts)
    n = np.bincount(a, minlength=num_parts)
    over = np.maximum(0, n - limit)
    if not over.any():
        return a
    order = np.lexsort((np.arange(len(a)), degree, a))            # by part, then degree, then ID
    first = np.searchsorted(a[order], np.arange(num_parts))
    movers = np.concatenate([order[first[p]:first[p] + over[p]] for p in np.nonzero(over)[0]])
    room = np.maximum(0, limit - n)
    need = len(movers)
    if room.sum() < need:
        raise ValueError(f"cannot meet a node cap of {limit} with {len(a)} nodes in {num_parts} parts")
    level, k = 0, room.copy()
    quota = np.zeros(num_parts, dtype=np.int64)
    while need > 0:  # give one node at a time to the parts with most room left, at most P rounds per level
        level = k.max()
        take = np.nonzero(k == level)[0][:need]
        quota[take] += 1
        k[take] -= 1
        need -= len(take)
    a[np.sort(movers)] = np.repeat(np.arange(num_parts, dtype=np.int64), quota)
    return a


def node_limit(cap: float, num_nodes: int, num_parts: int) -> int:
    """The most nodes a part may own under the node cap ``cap``: its integer part, never below ceil(N / P)."""
    return max(int(np.floor(cap + 1e-9)), -(-num_nodes // num_parts))


def part_edge_caps(a: np.ndarray, hubs: np.ndarray, in_deg: np.ndarray, edge_cap: float, slack: float,
                   num_parts: int) -> np.ndarray:
    """Each part's edge cap: ``edge_cap``, or for a part owning a hub (a node with more in-edges than the mean
    part; ``hubs``, their IDs) that hub's in-degree + ``slack`` (the cap's slack above the mean) when higher: a
    hub's in-edges stay together, so the plain cap could never be met."""
    cap = np.full(num_parts, float(edge_cap))
    if len(hubs):
        np.maximum.at(cap, a[hubs], in_deg[hubs] + slack)
    return cap


def repair_edges(a: np.ndarray, node_cap: float, edge_cap: float, num_parts: int, in_deg: np.ndarray) -> np.ndarray:
    """Enforce local edges <= the part's edge cap (``edge_cap``, raised by d - mean when the part owns a node with
    d > mean in-edges, as in the refinement) without breaking owned nodes <= cap. A last resort after refinement,
    like :func:`repair_nodes`; usually moves nothing.

    Each part over its cap sheds, while over: the node (not its largest) with the fewest in-edges that still
    covers the excess, else the one with most in-edges, to the part with most edge room that has room for it
    under both caps (ties by part ID). Parts in ID order; a node that fits nowhere stays."""
    a = a.copy()
    in_deg = np.asarray(in_deg)
    limit = node_limit(node_cap, len(a), num_parts)
    e = np.bincount(a, weights=in_deg, minlength=num_parts)
    n = np.bincount(a, minlength=num_parts)
    mean = float(in_deg.sum()) / num_parts
    cap = part_edge_caps(a, np.flatnonzero(in_deg > mean), in_deg, edge_cap, edge_cap - mean, num_parts)
    for p in np.flatnonzero(e > cap + 1e-9):
        mem = np.flatnonzero(a == p)
        mem = mem[np.lexsort((mem, in_deg[mem]))]   # by in-degree, then ID
        mem = mem[in_deg[mem] > 0][:-1]             # the largest stays (it may raise the cap)
        while e[p] > cap[p] + 1e-9 and len(mem):
            excess = e[p] - cap[p]
            d = in_deg[mem]
            i = int(np.searchsorted(d, excess - 1e-9)) if d[-1] >= excess - 1e-9 else len(mem) - 1
            v, dv = int(mem[i]), float(d[i])
            mem = np.delete(mem, i)
            room = np.where((n < limit) & (e + dv <= cap + 1e-9), cap - e, -np.inf)
            room[p] = -np.inf
            q = int(np.argmax(room))
            if not np.isfinite(room[q]):
                continue
            a[v] = q
            e[p] -= dv
            e[q] += dv
            n[p] -= 1
            n[q] += 1
    return a
