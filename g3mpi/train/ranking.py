"""Filtered ranking of knowledge-graph completion, exact over ranks: each query triple against every entity.

A test triple (h, r, t) asks two queries: the tail ``(h, r, ?)`` and the head ``(?, r, t)``. With a bilinear
decoder (DistMult: ``score(a, r, b) = <a * w_r, b>``) a query is one vector ``q`` (``h * w_r``, resp. ``w_r * t``)
and candidate e scores ``<q, x_e>``. Its answer (t, resp. h) is ranked among the entities that do not make a known
true triple (train, valid or test: the *filtered* setting of Bordes et al.), with OGB's tie rule::

    rank = 1 + #{e filtered out not, s(e) > s*} + #{e filtered out not, s(e) = s*} / 2          (s*: the answer's)
    MRR = mean over queries of 1 / rank;  Hits@K = fraction of queries with rank <= K

Distributed: every rank scores the candidates it owns (its rows of the embeddings) and never sees another rank's
scores. Queries travel in rounds: each rank contributes up to ``c`` of its own (their vectors, anchor keys and
answers: ``Allgatherv``), every rank scores all of them against its candidates (float64), the answer's owner puts
the answer's score into an ``Allreduce`` (the others add zeros: the sum is the score, bit for bit), and each rank's
counts above and equal go into one more ``Allreduce``. Every rank then has each query's rank and adds it in the
same order. Memory per rank: ``c * P`` query vectors and a ``[c * P, owned]`` block of scores, with ``c`` chosen so
the block stays under ``budget`` bytes: O(owned + P), never every score on one rank.

Filtering: ``known`` holds, per direction, the sorted keys ``(anchor * R + r) * N + e`` of the known triples whose
candidate e this rank owns (anchor: h for tail queries, t for head queries); a query excludes its key's range
within this rank's IDs. NumPy and the watchdog's buffer collectives only.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

#: bytes of one round's block of scores on a rank (queries x owned candidates, float64)
BLOCK_BYTES = 64 << 20


def triple_keys(anchor: np.ndarray, rel: np.ndarray, cand: np.ndarray, num_nodes: int,
                num_relations: int) -> np.ndarray:
    """int64 keys ``(anchor * R + rel) * N + cand`` (ValueError where N^2 R does not fit below 2^62)."""
    N, R = int(num_nodes), int(num_relations)
    if N and N * N * R >= 1 << 62:
        raise ValueError(f"filtered ranking: {N} entities and {R} relations are too many for 64-bit triple keys")
    return (np.asarray(anchor, np.int64) * R + np.asarray(rel, np.int64)) * N + np.asarray(cand, np.int64)


def filtered_ranks(wd, owned_start: int, cand: np.ndarray, directions, num_nodes: int, num_relations: int,
                   ks=(1, 3, 10), budget: int = BLOCK_BYTES, what: str = "evaluation (filtered ranking)") -> dict:
    """``{"mrr": .., "hits@K": .., "queries": n}`` over the queries of every direction of every rank (module
    docstring; NaN without queries or with a non-finite score), the same on every rank. ``cand`` [n_owned, d]: the
    embeddings of this rank's entities (new IDs ``owned_start + i``); ``directions``: a list, the same length on
    every rank, of ``(q [m, d], anchor key [m] (anchor * R + r), answer [m] new IDs, known sorted keys [k])``.
    Collective."""
    size = wd.comm.size
    cand = np.ascontiguousarray(cand, dtype=np.float64)
    n, d = cand.shape
    N = int(num_nodes)
    lo_id, hi_id = int(owned_start), int(owned_start) + n
    top = np.array([n, d], dtype=np.int64)
    wd.allreduce(top, op=MPI.MAX, what=what)
    c = max(1, int(budget) // (8 * max(int(top[0]), 1) * size))
    inv_sum, hits, count, bad = 0.0, np.zeros(len(ks), dtype=np.int64), 0, 0
    ks_arr = np.asarray(ks, dtype=np.float64)
    for q, anchor, answer, known in directions:
        q = np.ascontiguousarray(q, dtype=np.float64).reshape(-1, d)
        anchor, answer = np.asarray(anchor, np.int64), np.asarray(answer, np.int64)
        known = np.asarray(known, np.int64)
        rounds = np.array([-(-len(q) // c)], dtype=np.int64)
        wd.allreduce(rounds, op=MPI.MAX, what=what)
        for i in range(int(rounds[0])):
            mine = slice(i * c, min((i + 1) * c, len(q)))
            Q, keys = _gather(wd, q[mine], np.stack([anchor[mine], answer[mine]], axis=1), d, what)
            S = Q @ cand.T                                   # [queries, owned]
            ans = keys[:, 1]
            here = (ans >= lo_id) & (ans < hi_id)
            true = np.zeros(len(Q), dtype=np.float64)
            rows = np.flatnonzero(here)
            true[rows] = S[rows, ans[rows] - lo_id]
            S[rows, ans[rows] - lo_id] = -np.inf             # (the answer is not its own competitor)
            flags = np.array([(~np.isfinite(true[rows])).sum()], dtype=np.float64)
            wd.allreduce(true, what=what)
            # the known triples of each query among this rank's candidates
            base = keys[:, 0] * N
            a, b = np.searchsorted(known, base + lo_id), np.searchsorted(known, base + hi_id)
            lens = b - a
            if lens.sum():
                r = np.repeat(np.arange(len(Q)), lens)
                at = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(a, lens)
                S[r, known[at] - base[r] - lo_id] = -np.inf
            flags[0] += np.isnan(S).sum() + np.isposinf(S).sum()
            cnt = np.concatenate([(S > true[:, None]).sum(axis=1), (S == true[:, None]).sum(axis=1)]).astype(np.int64)
            wd.allreduce(cnt, what=what)
            wd.allreduce(flags, what=what)
            bad += int(flags[0])
            rank = 1.0 + cnt[:len(Q)] + 0.5 * cnt[len(Q):]
            inv_sum += float((1.0 / rank).sum())
            hits += (rank[:, None] <= ks_arr[None, :]).sum(axis=0)
            count += len(Q)
    out = {"queries": count}
    ok = count > 0 and bad == 0
    out["mrr"] = inv_sum / count if ok else float("nan")
    for k, h in zip(ks, hits):
        out[f"hits@{k}"] = float(h) / count if ok else float("nan")
    return out


def _gather(wd, q: np.ndarray, keys: np.ndarray, d: int, what: str):
    """Every rank's queries of this round, in rank order: (vectors [total, d] float64, keys [total, 2] int64)."""
    size = wd.comm.size
    counts = np.empty(size, dtype=np.int64)
    wd.allgather(np.array([len(q)], dtype=np.int64), counts, what=what)
    total = int(counts.sum())
    Q = np.empty((total, d), dtype=np.float64)
    K = np.empty((total, 2), dtype=np.int64)
    off = np.r_[0, np.cumsum(counts)[:-1]]
    wd.allgatherv(np.ascontiguousarray(q), [Q, (counts * d, off * d), MPI.DOUBLE], what=what)
    wd.allgatherv(np.ascontiguousarray(keys), [K, (counts * 2, off * 2), MPI.INT64_T], what=what)
    return Q, K
