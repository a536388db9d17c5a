"""``stream``: a rank-parallel streaming partitioner (Fennel over batches, then balanced label propagation).

Every rank holds only its slice of the graph (:class:`LocalGraph`: its rows' neighbours in the symmetrised graph,
as local columns ``[own rows | ghosts]``) and the parts of its own nodes and of its ghosts; part sizes are
Allreduced, nothing of length N or E is ever on one rank.

Balance: every part holds at most ``imbalance`` x the mean nodes and ``edge_imbalance`` x the mean local edges
(the in-edges of its nodes, without self loops: what a training rank stores and aggregates), each cap at least the
mean rounded up, the edge cap at least the heaviest row (a row's in-edges all go to its part).

1. Streaming (Fennel, Tsourakakis et al., WSDM 2014): the rows of more than E / (64 P) in-edges (hubs) are placed
   first, heaviest first into the part with fewest edges, the same on every rank. The ranks then walk their other
   rows, most neighbours first, in ``batches`` synchronous steps. Before each step the ghosts' parts are pulled
   from their owners (Alltoallv); each rank then places its step's nodes, :data:`CHUNK` at a time, in the part
   maximising ``neighbours there - cost``, Fennel's marginal cost ``alpha * gamma * load^(gamma-1)`` of the part's
   node load and of its edge load (each over its total, weighted :data:`EDGE_SHARE`), counting the other ranks'
   placements of this step as equal to its own. Both caps grow with what is placed (a part filled with edges
   early could take no row with edges later) up to half their room above the mean (:data:`STREAM_ROOM`: the rest
   is the refinement's); a rank fills a part only up to its share of the part's room (split in proportion to
   what each rank places in the step). :data:`PASSES` passes: each after the first takes each step's rows out
   and places them again, knowing every other row's part (restreaming). Parts still above a cap then give rows
   to parts with room (edges first, heavy rows out; then nodes, light rows back).
2. Refinement: ``rounds`` of label propagation. Each node's best other part (most neighbours) and gain
   (neighbours there - neighbours in its own part) are computed; half of the nodes (a seeded coin per node and
   round, so that neighbours seldom swap together) with a positive gain ask to move. The room of each part under
   both caps is split among the ranks in proportion to their requests (Allreduce of [2, P]), and each rank moves
   its best requests within its share. Sizes never pass the caps.

Deterministic for a given seed and number of ranks R; the result depends on R (which rows stream together, and
the shares, do), see docs/PARTITION.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from g3mpi.format import index_dtype

from g3mpi.mpi.collectives import allgather_rows, allreduce, alltoallv, exchange_counts
from g3mpi.mpi.ghost import GhostPlan
from g3mpi.sorting import merge_unique, sorted_unique

#: Fennel's exponent (the paper's choice)
GAMMA = 1.5
#: nodes placed together (their counts of neighbours' parts are taken at once); bounds a chunk's k x P matrix too
CHUNK = 1024
#: rows x parts of one dense count matrix at most in the refinement
COUNT_CELLS = 1 << 22
#: Fennel's alpha times this: measured on R-MAT 16 (8 parts, 4 ranks) against 0.25 .. 4, the lowest cut
ALPHA_SCALE = 2.0
#: the share of a part's load that is its local edges (the rest: its nodes), each over its total: Fennel's penalty
#: on that load spreads the rows of many in-edges as it spreads nodes
EDGE_SHARE = 0.5
#: rows of more than total edges / (HUB_PARTS * P) in-edges are placed before the streaming (:func:`place_hubs`)
HUB_PARTS = 64
#: the share of the caps' room above the mean that streaming may fill (the rest is the refinement's)
STREAM_ROOM = 0.5
#: streaming passes: the first places the rows, each further one places them again knowing every part
PASSES = 3
#: refinement stops when a round moves at most this fraction of the nodes
MIN_MOVED = 1e-4
#: edges handled at once by a pass with per-edge temporaries (int64 positions, masks): bounds a rank's peak memory
BLOCK_EDGES = 1 << 20


@dataclass
class LocalGraph:
    """One rank's rows of the symmetrised graph without self loops: row i (global node ``lo + i``) lists its
    neighbours as local columns (``< num_own``: own rows; else ghost ``col - num_own``, global ID ``ghosts[j]``)."""

    num_nodes: int
    lo: int
    num_own: int
    indptr: np.ndarray
    cols: np.ndarray
    ghosts: np.ndarray
    plan: GhostPlan
    weight: np.ndarray       # int64 [num_own]: in-edges without self loops (the row's local edges in its part)


def row_blocks(indptr: np.ndarray, block_edges: int):
    """Row ranges ``(a, b)`` of a CSR covering every row in order, each with about ``block_edges`` edges (one row
    more than that only when a single row has more)."""
    n = len(indptr) - 1
    cuts = np.searchsorted(indptr, np.arange(block_edges, int(indptr[-1]), block_edges), side="left")
    edges = np.unique(np.concatenate([[0], cuts, [n]]))
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        yield a, b


def ranks_within(keys: np.ndarray, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """(stable order of ``keys``, each sorted entry's rank among the entries of its key); the keys' counts are
    ``np.bincount(keys, minlength=num_keys)``."""
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.zeros(num_keys + 1, dtype=np.int64)
    np.cumsum(np.bincount(k, minlength=num_keys), out=starts[1:])
    return order, np.arange(len(k), dtype=np.int64) - starts[k]


def local_graph(comm, bounds: np.ndarray, indptr: np.ndarray, indices: np.ndarray, symmetric: bool,
                block_edges: int = BLOCK_EDGES) -> LocalGraph:
    """The symmetrised neighbourhoods of this rank's rows (graph rows ``bounds[rank]:bounds[rank+1]``, an in-edge
    CSR ``indptr``/``indices`` of global sources). Unless the graph is ``symmetric``, each edge u->v is also sent to
    u's owner (Alltoallv), so that u sees v. Self loops are dropped; duplicate edges stay (they weigh more). A row
    lists its in-edges first (file order), then the edges received (by sending rank, in its file order).

    Built in blocks of ``block_edges`` edges (counting sorts into preallocated int32 arrays where IDs fit), so
    that the temporaries stay bounded: the result does not depend on the block size."""
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    n_own, n = hi - lo, int(bounds[-1])
    dt = index_dtype(n)
    own_deg = np.zeros(n_own, dtype=np.int64)       # in-edges without self loops
    for a, b in row_blocks(indptr, block_edges):
        r = np.repeat(np.arange(a, b, dtype=dt), np.diff(indptr[a:b + 1]))
        own_deg[a:b] = np.bincount(r[indices[indptr[a]:indptr[b]] != r + lo] - a, minlength=b - a)
    back_rows, back_nb = np.zeros(0, dtype=dt), np.zeros(0, dtype=dt)
    if not symmetric:
        back_rows, back_nb = send_reverse(comm, bounds, indptr, indices, block_edges)
    back_deg = np.bincount(back_rows - lo, minlength=n_own).astype(np.int64)
    ptr = np.zeros(n_own + 1, dtype=np.int64)
    np.cumsum(own_deg + back_deg, out=ptr[1:])
    nb = np.empty(int(ptr[-1]), dtype=dt)          # global neighbour IDs, then local columns (in place)
    for a, b in row_blocks(indptr, block_edges):
        r = np.repeat(np.arange(a, b, dtype=dt), np.diff(indptr[a:b + 1]))
        src = indices[indptr[a]:indptr[b]]
        keep = src != r + lo
        r, src = r[keep] - a, src[keep]
        first = np.zeros(b - a, dtype=np.int64)
        np.cumsum(own_deg[a:b - 1], out=first[1:])
        nb[ptr[a + r] + np.arange(len(r), dtype=np.int64) - first[r]] = src
    # the received edges after each row's own, in arrival order (a counting sort, block by block)
    filled = own_deg.copy()
    for a in range(0, len(back_rows), block_edges):
        r = (back_rows[a:a + block_edges] - lo).astype(np.int64)
        order, within = ranks_within(r, n_own)
        nb[ptr[r[order]] + filled[r[order]] + within] = back_nb[a:a + block_edges][order]
        filled += np.bincount(r, minlength=n_own)
    del back_rows, back_nb
    ghosts = np.zeros(0, dtype=np.int64)
    for g in blocks_of(nb, block_edges):
        ghosts = merge_unique(ghosts, sorted_unique(g[(g < lo) | (g >= hi)].astype(np.int64)))
    for g in blocks_of(nb, block_edges):
        out = (g < lo) | (g >= hi)
        g[out] = n_own + np.searchsorted(ghosts, g[out])
        g[~out] -= lo
    plan = GhostPlan(comm, bounds, ghosts)
    return LocalGraph(num_nodes=n, lo=lo, num_own=n_own, indptr=ptr, cols=nb, ghosts=ghosts, plan=plan,
                      weight=own_deg)


def blocks_of(a: np.ndarray, block: int):
    """Views of ``a`` of ``block`` entries (the last one shorter)."""
    for s in range(0, len(a), block):
        yield a[s:s + block]


def send_reverse(comm, bounds: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                 block_edges: int) -> tuple[np.ndarray, np.ndarray]:
    """Every in-edge u->v of this rank's rows (self loops aside) sent to u's owner as the pair (u, v); returns the
    pairs received (rows u of this rank, neighbours v), by sending rank, each in its file order."""
    lo, R = int(bounds[comm.rank]), comm.size
    dt = index_dtype(int(bounds[-1]))
    counts = np.zeros(R, dtype=np.int64)
    for a, b in row_blocks(indptr, block_edges):
        r = np.repeat(np.arange(lo + a, lo + b, dtype=dt), np.diff(indptr[a:b + 1]))
        src = indices[indptr[a]:indptr[b]]
        counts += np.bincount(np.searchsorted(bounds, src[src != r], side="right") - 1, minlength=R)
    us, vs = np.empty(int(counts.sum()), dtype=dt), np.empty(int(counts.sum()), dtype=dt)
    filled = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    for a, b in row_blocks(indptr, block_edges):
        r = np.repeat(np.arange(lo + a, lo + b, dtype=dt), np.diff(indptr[a:b + 1]))
        src = indices[indptr[a]:indptr[b]]
        keep = src != r
        r, src = r[keep], src[keep]
        owner = np.searchsorted(bounds, src, side="right") - 1
        order, within = ranks_within(owner, R)
        at = filled[owner[order]] + within
        us[at], vs[at] = src[order], r[order]
        filled += np.bincount(owner, minlength=R)
    recv = exchange_counts(comm, counts)
    us = alltoallv(comm, us, counts, recv)
    return us, alltoallv(comm, vs, counts, recv)


def neighbour_counts(lg: LocalGraph, parts: np.ndarray, rows: np.ndarray, P: int) -> np.ndarray:
    """[len(rows), P]: neighbours of the own ``rows`` in each part (``parts`` of own rows and ghosts; -1: not
    placed). Counted :data:`BLOCK_EDGES` edges at a time (a few high-degree rows may hold millions)."""
    d = lg.indptr[rows + 1] - lg.indptr[rows]
    out = np.zeros((len(rows), P), dtype=np.int64)
    cuts = np.searchsorted(np.cumsum(d), np.arange(BLOCK_EDGES, int(d.sum()), BLOCK_EDGES), side="left")
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)]):
        if a == b:
            continue
        db = d[a:b]
        pos = np.repeat(lg.indptr[rows[a:b]] - np.cumsum(db) + db, db) + np.arange(int(db.sum()), dtype=np.int64)
        p = parts[lg.cols[pos]]
        del pos
        r = np.repeat(np.arange(b - a, dtype=np.int64), db)
        ok = p >= 0
        out[a:b] = np.bincount(r[ok] * P + p[ok], minlength=(b - a) * P).reshape(b - a, P)
    return out


def row_chunks(rows: np.ndarray, P: int):
    """``rows`` in pieces whose count matrices hold at most :data:`COUNT_CELLS` cells."""
    step = max(1, COUNT_CELLS // P)
    for a in range(0, len(rows), step):
        yield rows[a:a + step]


def share(mine: np.ndarray, wanted: np.ndarray, room: np.ndarray) -> np.ndarray:
    """This rank's share of each part's ``room``: all it ``mine`` asks for where the ranks ask ``wanted`` <= room
    in total, else ``floor(room * mine / wanted)`` (never more than the room altogether)."""
    over = wanted > room
    out = mine.copy()
    out[over] = (np.maximum(room[over], 0) * mine[over]) // np.maximum(wanted[over], 1)
    return out


def coin(gid: np.ndarray, salt: int) -> np.ndarray:
    """A seeded pseudo-random bit per global node ID (splitmix64's finaliser)."""
    x = gid.astype(np.uint64) + np.uint64(salt & (2**64 - 1))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((x ^ (x >> np.uint64(31))) & np.uint64(1)).astype(bool)


def loads(parts: np.ndarray, weight: np.ndarray, P: int) -> np.ndarray:
    """[2, P]: the nodes (row 0) and their weights, local edges (row 1), in each part of ``parts``."""
    return np.stack([np.bincount(parts, minlength=P),
                     np.bincount(parts, weights=weight, minlength=P).astype(np.int64)]).astype(np.int64)


def place(score: np.ndarray, left: np.ndarray, weight: np.ndarray, strict: bool = False) -> np.ndarray:
    """Each row's best column (part) of ``score`` [k, P] such that column p takes at most ``left[0, p]`` rows of
    at most ``left[1, p]`` ``weight`` in all (the higher scores first); rows that fit nowhere take the column
    with most room left, relative to ``left`` at the start (``strict``: -1)."""
    k, P = score.shape
    choice = np.full(k, -1, dtype=np.int64)
    score = score.astype(np.float64, copy=True)
    start = np.maximum(left, 1).astype(np.float64)
    left = left.copy()
    todo = np.arange(k)
    for _ in range(P):
        if not len(todo) or not (left[0] > 0).any():
            break
        s = score[todo]
        s[(left[1][None, :] < weight[todo][:, None]) | (left[0] <= 0)[None, :]] = -np.inf
        best = np.argmax(s, axis=1)
        val = s[np.arange(len(todo)), best]
        order = np.lexsort((-val, best))
        best_o = best[order]
        starts = np.searchsorted(best_o, np.arange(P))
        rank_in = np.arange(len(todo)) - starts[best_o]
        w = weight[todo[order]]
        cum = np.cumsum(w)
        cum_in = cum - (cum - w)[starts[best_o]]           # the weight of a part's rows so far, this one's too
        ok = (rank_in < left[0, best_o]) & (cum_in <= left[1, best_o]) & np.isfinite(val[order])
        chosen = todo[order[ok]]
        choice[chosen] = best_o[ok]
        left -= loads(best_o[ok], w[ok], P)
        rejected = order[~ok]
        score[todo[rejected], best[rejected]] = -np.inf
        todo = todo[rejected]
    if len(todo) and not strict:
        choice[todo] = np.argmax((left / start).min(axis=0))
    return choice


def stream_partition(comm, lg: LocalGraph, P: int, *, seed: int = 0, imbalance: float = 1.10,
                     edge_imbalance: float = 1.10, batches: int = 16, rounds: int = 20, passes: int = PASSES,
                     alpha_scale: float = ALPHA_SCALE, order: str = "degree", log=None) -> tuple[np.ndarray, dict]:
    """Parts [num_own] of this rank's rows (see the module docstring), and meta entries (the same on every rank).
    ``imbalance`` / ``edge_imbalance``: the caps on each part's nodes and local edges over the mean (:func:`caps`);
    ``alpha_scale`` multiplies Fennel's alpha; ``order``: :func:`stream_order`; ``passes``: the streaming passes
    (each after the first re-places every row given the others' parts)."""
    n = lg.num_nodes
    n_own = lg.num_own
    w = lg.weight
    total_w = int(allreduce(comm, np.array([w.sum()], dtype=np.int64))[0])
    cap = caps(comm, n, total_w, w, P, imbalance, edge_imbalance)
    total = np.array([n, total_w], dtype=np.int64)
    # streaming stops short of the caps, which leaves the refinement room to move nodes
    stream_cap = np.maximum(-(-total // P), np.minimum(cap, total / P + STREAM_ROOM * (cap - total / P)))
    stream_cap = stream_cap.astype(np.int64)
    parts = np.full(n_own + len(lg.ghosts), -1, dtype=np.int32)
    edges = int(allreduce(comm, np.array([len(lg.cols)], dtype=np.int64))[0])
    alpha = alpha_scale * math.sqrt(P) * (edges / 2) / max(1.0, n ** GAMMA)
    place_hubs(comm, lg, parts, total_w / (P * HUB_PARTS), P)
    seq = stream_order(lg, order, seed)
    seq = seq[parts[seq] < 0]
    for t in range(passes):
        stream_pass(comm, lg, parts, seq, batches, stream_cap, total, alpha, P, again=t > 0)
    own = parts[:n_own]
    sizes = allreduce(comm, loads(own, w, P))
    cut0 = cut_edges(comm, lg, parts)
    sizes = rebalance(comm, lg, parts, sizes, cap, P)
    moved_total, done = 0, 0
    for done in range(1, rounds + 1):
        moved, sizes = refine_round(comm, lg, parts, sizes, cap, P, salt=seed * 1_000_003 + done)
        moved_total += moved
        if moved <= n * MIN_MOVED:
            break
    cut1 = cut_edges(comm, lg, parts)
    if log is not None:
        log(f"stream: {cut0} cut (symmetrised) edges after streaming, {cut1} after {done} refinement round(s) "
            f"moving {moved_total} nodes; largest part {int(sizes[0].max())} nodes (cap {int(cap[0])}), "
            f"{int(sizes[1].max())} local edges (cap {int(cap[1])})")
    return parts[:n_own].astype(np.int64), dict(stream_batches=batches, stream_rounds=done,
                                               stream_moved=moved_total, stream_cut_streamed=cut0,
                                               stream_cut_refined=cut1, stream_cap=int(cap[0]),
                                               stream_edge_cap=int(cap[1]))


def place_hubs(comm, lg: LocalGraph, parts: np.ndarray, heavier: float, P: int) -> None:
    """Place the rows of more than ``heavier`` in-edges (at most ``HUB_PARTS * P`` rows in all) before the
    streaming, the same way on every rank: heaviest first, each into the part with the fewest edges so far (a
    rank streaming a hub alone could not see the other ranks' hubs of the same step, nor fit it in its share)."""
    w = lg.weight
    mine = np.flatnonzero(w > heavier)
    k = int(allreduce(comm, np.array([len(mine)], dtype=np.int64), op=MPI.MAX)[0])
    if not k:
        return
    pad = np.full((k, 2), -1, dtype=np.int64)
    pad[:len(mine), 0], pad[:len(mine), 1] = lg.lo + mine, w[mine]
    hubs = allgather_rows(comm, pad).reshape(-1, 2)
    hubs = hubs[hubs[:, 0] >= 0]
    hubs = hubs[np.lexsort((hubs[:, 0], -hubs[:, 1]))]
    load = np.zeros(P, dtype=np.int64)
    to = np.empty(len(hubs), dtype=np.int64)
    for i, wt in enumerate(hubs[:, 1].tolist()):
        to[i] = int(np.argmin(load))
        load[to[i]] += wt
    own = (hubs[:, 0] >= lg.lo) & (hubs[:, 0] < lg.lo + lg.num_own)
    parts[hubs[own, 0] - lg.lo] = to[own]


def caps(comm, n: int, total_w: int, w: np.ndarray, P: int, imbalance: float, edge_imbalance: float) -> np.ndarray:
    """[nodes, local edges] a part may hold: ``floor(imbalance * mean)`` and at least the mean rounded up; the
    edge cap at least the largest row's weight (a row's in-edges all go to its part)."""
    heaviest = int(allreduce(comm, np.array([w.max() if len(w) else 0], dtype=np.int64), op=MPI.MAX)[0])
    node_cap = max(math.ceil(n / P), int(math.floor(imbalance * n / P)))
    edge_cap = max(math.ceil(total_w / P), int(math.floor(edge_imbalance * total_w / P)), heaviest)
    return np.array([node_cap, edge_cap], dtype=np.int64)


def stream_pass(comm, lg: LocalGraph, parts: np.ndarray, seq: np.ndarray, batches: int, stream_cap: np.ndarray,
                total: np.ndarray, alpha: float, P: int, again: bool) -> None:
    """One streaming pass over the rows ``seq`` in ``batches`` synchronous steps (module docstring, 1.) under the
    caps ``stream_cap`` [nodes, edges] of ``total`` [nodes, edges]; ``again``: the rows have parts, each step's
    are taken out and placed again."""
    R, n_own, w = comm.size, lg.num_own, lg.weight
    norm = np.array([1.0, total[0] / max(1, total[1])])      # loads in nodes: an edge counts mean nodes / edges
    unit = np.array([1.0 - EDGE_SHARE, EDGE_SHARE]) * norm   # a node's and an edge's weight in the objective
    steps = np.linspace(0, len(seq), batches + 1).astype(np.int64)
    for t in range(batches):
        batch = seq[steps[t]:steps[t + 1]]
        if again:
            parts[batch] = -1
        parts[n_own:] = lg.plan.pull(parts[:n_own])
        own = parts[:n_own]
        placed = own >= 0
        sizes = allreduce(comm, loads(own[placed], w[placed], P))
        # the caps grow with what is placed (both loads stay balanced all along: a part full of edges early
        # could take no row with edges later); the room split in proportion to what each rank places now
        need = allgather_rows(comm, np.array([len(batch), w[batch].sum()], dtype=np.int64))
        done = sizes.sum(axis=1) + need.sum(axis=0)
        now = np.minimum(stream_cap, -(-stream_cap * done) // np.maximum(total, 1))
        left = np.stack([split(now[k] - sizes[k], need[:, k], comm.rank) for k in range(2)])
        added = np.zeros((2, P), dtype=np.int64)
        for c0 in range(0, len(batch), CHUNK):
            rows = batch[c0:c0 + CHUNK]
            counts = neighbour_counts(lg, parts, rows, P)
            # Fennel's marginal cost of each part's node load and edge load, each over its total (module docstring)
            pen = alpha * GAMMA * ((sizes + R * added) * norm[:, None]) ** (GAMMA - 1)     # [2, P]
            cost = np.outer(unit[0] * np.ones(len(rows)), pen[0]) + np.outer(unit[1] * w[rows], pen[1])
            choice = place(counts - cost, left - added, w[rows])
            parts[rows] = choice
            added += loads(choice, w[rows], P)


def stream_order(lg: LocalGraph, order: str, seed: int) -> np.ndarray:
    """The order in which a rank streams its rows: ``natural`` (row order), ``degree`` (most neighbours first,
    ties in row order) or ``random`` (seeded by the seed and the rows' first global ID)."""
    if order == "degree":
        return np.argsort(-np.diff(lg.indptr), kind="stable")
    if order == "random":
        return np.random.default_rng([seed, lg.lo]).permutation(lg.num_own)
    return np.arange(lg.num_own)


def cut_edges(comm, lg: LocalGraph, parts: np.ndarray) -> int:
    """Edges of the symmetrised graph between parts, each counted once per direction (ghosts pulled first)."""
    parts[lg.num_own:] = lg.plan.pull(parts[:lg.num_own])
    cut = 0
    for a, b in row_blocks(lg.indptr, BLOCK_EDGES):
        r = np.repeat(np.arange(a, b), np.diff(lg.indptr[a:b + 1]))
        cut += int((parts[r] != parts[lg.cols[lg.indptr[a]:lg.indptr[b]]]).sum())
    return int(allreduce(comm, np.array([cut], dtype=np.int64))[0])


def best_moves(lg: LocalGraph, parts: np.ndarray, P: int, rows: np.ndarray,
               allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(best other part, gain) of the own ``rows``: the part (among ``allowed`` [P] bool, if given) with most
    neighbours outside the row's own, and that count minus its neighbours inside (ghosts' parts current)."""
    best = np.zeros(len(rows), dtype=np.int64)
    gain = np.zeros(len(rows), dtype=np.int64)
    done = 0
    for chunk in row_chunks(rows, P):
        c = neighbour_counts(lg, parts, chunk, P)
        i = np.arange(len(chunk))
        here = c[i, parts[chunk]].copy()
        c[i, parts[chunk]] = -1
        if allowed is not None:
            c[:, ~allowed] = -2
        b = np.argmax(c, axis=1)
        best[done:done + len(chunk)] = b
        gain[done:done + len(chunk)] = c[i, b] - here
        done += len(chunk)
    return best, gain


def take(want: np.ndarray, key: np.ndarray, candidates: np.ndarray, quota: np.ndarray, weight: np.ndarray,
         P: int, cover: bool = False) -> np.ndarray:
    """The candidates (indices) to move: per target part ``want[c]``, those of highest ``key`` within ``quota``
    [2, P] (nodes, weight). ``cover``: instead, the fewest of highest key that reach either quota."""
    order = np.lexsort((-key[candidates], want[candidates]))
    c = candidates[order]
    tgt = want[c]
    starts = np.searchsorted(tgt, np.arange(P))
    rank_in = np.arange(len(c)) - starts[tgt]
    wc = weight[c]
    cum = np.cumsum(wc)
    before = cum - wc - (cum - wc)[starts[tgt]]          # the weight of the part's candidates before this one
    if cover:
        return c[((rank_in < quota[0, tgt]) & (quota[0, tgt] > 0)) | ((before < quota[1, tgt]) & (quota[1, tgt] > 0))]
    return c[(rank_in < quota[0, tgt]) & (before + wc <= quota[1, tgt])]


def split(room: np.ndarray, need: np.ndarray, rank: int) -> np.ndarray:
    """This rank's share of each part's ``room`` [P] when the ranks need ``need`` [R] in all: in proportion
    (rounded down; the parts left over go to the ranks in turn), the same split on every rank."""
    room = np.maximum(room, 0)
    total = max(1, int(need.sum()))
    shares = (room[None, :] * need[:, None]) // total                    # [R, P]
    rest = room - shares.sum(axis=0)
    order = np.argsort(-need, kind="stable")
    pos = np.empty(len(need), dtype=np.int64)
    pos[order] = np.arange(len(need))
    return shares[rank] + (pos[rank] < rest)


def refine_round(comm, lg: LocalGraph, parts: np.ndarray, sizes: np.ndarray, cap: np.ndarray, P: int,
                 salt: int) -> tuple[int, np.ndarray]:
    """One round of balanced label propagation (module docstring, 2.); returns (nodes moved, new sizes [2, P])."""
    n_own, w = lg.num_own, lg.weight
    parts[n_own:] = lg.plan.pull(parts[:n_own])
    best, gain = best_moves(lg, parts, P, np.arange(n_own))
    gids = lg.lo + np.arange(n_own, dtype=np.int64)
    cand = np.flatnonzero((gain > 0) & coin(gids, salt))
    mine = loads(best[cand], w[cand], P)
    go = take(best, gain, cand, share(mine, allreduce(comm, mine), cap[:, None] - sizes), w, P)
    delta = loads(best[go], w[go], P) - loads(parts[go], w[go], P)
    parts[go] = best[go]
    moved = allreduce(comm, np.array([len(go)], dtype=np.int64))[0]
    return int(moved), sizes + allreduce(comm, delta)


def rebalance(comm, lg: LocalGraph, parts: np.ndarray, sizes: np.ndarray, cap: np.ndarray, P: int) -> np.ndarray:
    """Move nodes out of parts above a cap (streaming may overfill one when no part had room for a row) into parts
    with room, fewest neighbours lost first; returns the new sizes [2, P]. Edges first, into parts with room for
    the edges (their node cap may pass), then nodes, the lightest first, into parts with room for both: a part
    full of nodes takes a heavy row and gives light ones back. Each rank moves its share of a part's excess, in
    proportion to its own there (its share of the room in proportion to its movers)."""
    n_own, w = lg.num_own, lg.weight
    for _ in range(2 * P):
        for k in (1, 0):
            excess = np.maximum(sizes - cap[:, None], 0)
            excess[1 - k] = 0
            if not excess.any():
                continue
            parts[n_own:] = lg.plan.pull(parts[:n_own])
            own = parts[:n_own]
            mine = allgather_rows(comm, loads(own, w, P))                               # [R, 2, P]
            quota = -((-excess[None] * mine) // np.maximum(sizes, 1)[None])[comm.rank]   # (rounded up)
            cand = np.flatnonzero((excess[k, own] > 0) & ((w > 0) if k else True))
            _, gain = best_moves(lg, parts, P, cand)
            key = np.zeros(n_own, dtype=np.float64)
            # edges: least loss per edge moved; nodes: the lightest first (they fit where edges are short), then
            # the least loss
            key[cand] = gain / np.maximum(w[cand], 1) if k else np.clip(gain, -2**20, 2**20) - w[cand] * 2.0**21
            go = take(own.astype(np.int64), key, cand, quota, w, P, cover=True)
            room = np.maximum(cap[:, None] - sizes, 0)
            movers = allgather_rows(comm, np.array([len(go), w[go].sum()], dtype=np.int64))
            left = np.stack([split(room[j], movers[:, j], comm.rank) for j in range(2)])
            for rows in row_chunks(go, P):
                score = neighbour_counts(lg, parts, rows, P).astype(np.float64)
                score[np.arange(len(rows)), parts[rows]] = -np.inf
                dest = place(score, left, w[rows], strict=True)
                # rows with no part of room for both go where there is room of the kind in excess: the other
                # kind's excess so made is the next phase's (a heavy row out, light ones back)
                rest = dest < 0
                loose = left.copy()
                loose[1 - k] = np.iinfo(np.int64).max // 4
                loose -= loads(dest[~rest], w[rows][~rest], P)
                dest[rest] = place(score[rest], loose, w[rows][rest], strict=True)
                ok = dest >= 0        # (a row that fits nowhere stays)
                left -= loads(dest[ok], w[rows][ok], P)
                parts[rows[ok]] = dest[ok]
            sizes = allreduce(comm, loads(parts[:n_own], w, P))
        if not (sizes > cap[:, None]).any():
            break
    return sizes
