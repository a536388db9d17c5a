"""G3's locality-aware partitioning, generalised: METIS, then batched refinement of the slowest rank's epoch.

G3 (SIGMOD 2023) refines a METIS partition greedily: take the part with the most halo dependencies, pick the
boundary node whose move removes most of them, swap it with a node of the lightest part that adds the fewest
new dependencies. Here the same step runs on many nodes at once, on a cost model of the whole epoch
(:mod:`.cost`): each part p has a load

    load_p = compute_p + comm_p + penalty * mean_cost * (excess_nodes_p / node_cap + excess_edges_p / edge_cap)

where compute_p = edge_seconds * local_edges_p * width, comm_p = (halo_p + send_p) * width * 4 / bandwidth,
node_cap = node_imbalance * mean owned nodes and edge_cap = edge_imbalance * mean local edges. One iteration:

1. parts above the mean load are *sources*, parts below it with room under both caps are *receivers*;
2. every node v of a source part p gets a destination q: the receiver holding most of its neighbours (in- and
   out-edges), or the least-loaded receiver when it has none there (isolated and low-degree nodes: these are
   what balances node counts cheaply, G3's "swap partner from the lightest part");
3. for all these moves at once, the exact single-move change of load_p and load_q is computed from the
   replica matrix M[u, r] = #edges from u into part r (halo and send rows that appear or vanish when v moves,
   for v itself and for each in-neighbour of v) -- sparse lookups, no Python loop over nodes;
4. moves are ranked by (load removed from p) / (load added to q) (moves that lower both come first), and a
   prefix is taken per source and per receiver so that no source sheds below, and no receiver grows above,
   the mean load, and no receiver crosses a cap (a per-group cumulative sum);
5. a fraction ``step`` of that batch is applied and the partition re-evaluated exactly. It is kept if it
   lowers the total cap violation, or keeps it and lowers the maximum cost; otherwise ``step`` is halved.

It stops when no move is left, ``step`` falls below 1/256, or after ``max_iters`` evaluations. Everything is
deterministic for a given seed (the METIS seed; ties are broken by node ID).
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .cost import CostModel, replica_matrix
from .metis import metis_partition, symmetrize

PENALTY = 10.0
MIN_STEP = 1 / 256


class _State:
    """Exact per-part figures of one assignment, and the replica matrix for move deltas."""

    def __init__(self, ref: "_Refiner", a: np.ndarray):
        self.a = a
        P = ref.P
        self.n = np.bincount(a, minlength=P).astype(float)
        self.e = np.bincount(a, weights=ref.in_deg, minlength=P)
        m = replica_matrix(ref.src, ref.dst, a, P)
        self.m = m
        rows = np.repeat(np.arange(ref.N, dtype=np.int64), np.diff(m.indptr))
        cols = m.indices.astype(np.int64)
        self.keys = rows * P + cols
        remote = cols != a[rows]
        self.halo = np.bincount(cols[remote], minlength=P).astype(float)
        self.send = np.bincount(a[rows[remote]], minlength=P).astype(float)
        self.rowcount = np.diff(m.indptr)  # |T(v)|: parts v has an out-edge into
        comp, comm = ref.model.layer_costs(self.e, self.halo + self.send)
        self.cost = comp + comm
        self.excess_n = np.maximum(0.0, self.n - ref.node_cap) / ref.node_cap
        self.excess_e = np.maximum(0.0, self.e - ref.edge_cap) / max(1.0, ref.edge_cap)
        self.violation = float(self.excess_n.sum() + self.excess_e.sum())
        self.mean_cost = float(self.cost.mean())
        self.load = self.cost + PENALTY * self.mean_cost * (self.excess_n + self.excess_e)
        self.max_cost = float(self.cost.max())
        self.total_comm = float(self.halo.sum())

    def get(self, u: np.ndarray, q: np.ndarray, P: int) -> np.ndarray:
        """M[u, q] for arrays of (u, q) pairs."""
        k = u * P + q
        i = np.searchsorted(self.keys, k)
        i = np.minimum(i, len(self.keys) - 1)
        hit = self.keys[i] == k if len(self.keys) else np.zeros(len(k), dtype=bool)
        return np.where(hit, self.m.data[i], 0)

    def better_than(self, other: "_State") -> bool:
        """Lexicographic: less cap violation; else a lower maximum cost; else as high a maximum, less traffic."""
        if self.violation < other.violation * (1 - 1e-9) - 1e-12:
            return True
        if self.violation > other.violation + 1e-12:
            return False
        if self.max_cost < other.max_cost * (1 - 1e-9):
            return True
        return self.max_cost <= other.max_cost * (1 + 1e-12) and self.total_comm < other.total_comm


class _Refiner:
    def __init__(self, indptr, indices, num_parts, model: CostModel, node_imbalance, edge_imbalance):
        self.N = len(indptr) - 1
        self.P = num_parts
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        self.dst = np.repeat(np.arange(self.N, dtype=np.int64), np.diff(self.indptr))
        self.src = self.indices
        self.in_deg = np.diff(self.indptr).astype(float)
        self.model = model
        self.node_cap = node_imbalance * self.N / num_parts
        self.edge_cap = edge_imbalance * len(self.src) / num_parts
        comp, comm = model.layer_costs([1.0], [1.0])
        self.c_edge, self.c_row = float(comp[0]), float(comm[0])

    def _in_edges(self, cand: np.ndarray):
        """(candidate index, source u) of every in-edge u -> v of the candidates v."""
        deg = np.diff(self.indptr)[cand]
        ci = np.repeat(np.arange(len(cand), dtype=np.int64), deg)
        pos = np.repeat(self.indptr[cand] - np.concatenate([[0], np.cumsum(deg)[:-1]]), deg) + np.arange(int(deg.sum()))
        return ci, self.indices[pos]

    def _destinations(self, s: _State, cand, ci, u, allowed: np.ndarray, fallback: int | None):
        """Per candidate: the allowed part (not its own) holding most of its in- and out-neighbours.

        Candidates with no neighbour in an allowed part get ``fallback`` (or -1 when None)."""
        P, a = self.P, s.a
        nc = len(cand)
        mcnt = np.diff(s.m.indptr)[cand]
        mci = np.repeat(np.arange(nc, dtype=np.int64), mcnt)
        mpos = np.repeat(s.m.indptr[cand] - np.concatenate([[0], np.cumsum(mcnt)[:-1]]), mcnt) + np.arange(int(mcnt.sum()))
        pair_c = np.concatenate([ci, mci])
        pair_r = np.concatenate([a[u], s.m.indices[mpos].astype(np.int64)])
        pair_w = np.concatenate([np.ones(len(ci)), s.m.data[mpos].astype(float)])
        ok = allowed[pair_r] & (pair_r != a[cand][pair_c])
        key, inv = np.unique(pair_c[ok] * P + pair_r[ok], return_inverse=True)
        w = np.bincount(inv, weights=pair_w[ok], minlength=len(key))
        kc, kr = key // P, key % P
        order = np.lexsort((kr, -w, kc))
        first = order[np.concatenate([[True], kc[order][1:] != kc[order][:-1]])] if len(order) else order
        q = np.full(nc, -1 if fallback is None else fallback, dtype=np.int64)
        q[kc[first]] = kr[first]
        return q

    def _deltas(self, s: _State, cand, q, ci, u):
        """Exact single-move changes (comm rows of p, comm rows of q, total halo rows) of moving cand to q."""
        P, a = self.P, s.a
        nc = len(cand)
        p = a[cand]
        au, qe, pe = a[u], q[ci], p[ci]
        g_up = s.get(u, pe, P)
        g_uq = s.get(u, qe, P)
        m_vp = (s.get(cand, p, P) > 0).astype(float)
        m_vq = (s.get(cand, q, P) > 0).astype(float)
        t = s.rowcount[cand].astype(float)
        lost_p = (au != pe) & (g_up == 1)      # p no longer needs u
        new_q = (au != qe) & (g_uq == 0)       # q now needs u
        d_comm_p = m_vp - (t - m_vp) + np.bincount(
            ci, weights=((au == pe) & (g_uq == 0)) * 1.0 - lost_p, minlength=nc)
        d_comm_q = -m_vq + (t - m_vq) + np.bincount(
            ci, weights=new_q * 1.0 - ((au == qe) & (g_up == 1)), minlength=nc)
        d_halo = m_vp - m_vq + np.bincount(ci, weights=new_q * 1.0 - lost_p, minlength=nc)
        return d_comm_p, d_comm_q, d_halo

    @staticmethod
    def _within_budgets(idx, rules) -> np.ndarray:
        rank = np.arange(len(idx))
        ok = np.ones(len(idx), dtype=bool)
        for group, val, budget in rules:
            ok &= _group_cumsum(group, rank, val) <= budget[group] + 1e-12
        return ok

    def propose_balance(self, s: _State) -> tuple[np.ndarray, np.ndarray]:
        """Moves from parts above the mean load to parts below it, best ratio first (G3's step, batched)."""
        a = s.a
        target = float(s.load.mean())
        sources = s.load > target * (1 + 1e-9)
        receivers = (s.load < target) & (s.n < self.node_cap - 1) & (s.e < self.edge_cap)
        if not sources.any() or not receivers.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cand = np.nonzero(sources[a])[0]
        ci, u = self._in_edges(cand)
        rec = np.nonzero(receivers)[0]
        q = self._destinations(s, cand, ci, u, receivers, int(rec[np.argmin(s.load[rec])]))
        p = a[cand]
        d_comm_p, d_comm_q, _ = self._deltas(s, cand, q, ci, u)
        d_e = self.in_deg[cand]
        d_cost_q = self.c_edge * d_e + self.c_row * d_comm_q
        pen = PENALTY * s.mean_cost
        gain = self.c_edge * d_e - self.c_row * d_comm_p + pen * (
            (s.n[p] > self.node_cap) / self.node_cap + (s.e[p] > self.edge_cap) * d_e / max(1.0, self.edge_cap))
        score = np.where(d_cost_q <= 0, 1e30 + gain, gain / np.maximum(d_cost_q, 1e-300))
        idx = np.nonzero(gain > 0)[0]
        idx = idx[np.lexsort((cand[idx], -score[idx]))]
        ok = self._within_budgets(idx, (
            (p[idx], gain[idx], s.load - target),                 # sources shed down to the mean
            (p[idx], np.ones(len(idx)), s.n - 1),                  # ... and never empty
            (q[idx], d_cost_q[idx], target - s.load),              # receivers grow up to the mean
            (q[idx], np.ones(len(idx)), self.node_cap - s.n),      # ... within the node cap
            (q[idx], d_e[idx], self.edge_cap - s.e)))              # ... and the edge cap
        idx = idx[ok]
        return cand[idx], q[idx]

    def propose_comm(self, s: _State) -> tuple[np.ndarray, np.ndarray]:
        """Boundary moves that lower the total halo rows without raising any load to the maximum or a cap."""
        a = s.a
        cross = a[self.src] != a[self.dst]
        boundary = np.zeros(self.N, dtype=bool)
        boundary[self.src[cross]] = True
        boundary[self.dst[cross]] = True
        cand = np.nonzero(boundary)[0]
        if not len(cand):
            return cand, cand
        top = float(s.load.max()) * (1 - 1e-6)
        allowed = (s.n < self.node_cap - 1) & (s.e < self.edge_cap) & (s.load < top)
        ci, u = self._in_edges(cand)
        q = self._destinations(s, cand, ci, u, allowed, None)
        has = q >= 0
        cand, q = cand[has], q[has]
        ci, u = self._in_edges(cand)
        p = a[cand]
        d_comm_p, d_comm_q, d_halo = self._deltas(s, cand, q, ci, u)
        d_e = self.in_deg[cand]
        d_cost_p = -self.c_edge * d_e + self.c_row * d_comm_p
        d_cost_q = self.c_edge * d_e + self.c_row * d_comm_q
        idx = np.nonzero(d_halo < 0)[0]
        idx = idx[np.lexsort((cand[idx], d_halo[idx]))]
        slack = top - s.load
        ok = self._within_budgets(idx, (
            (p[idx], d_cost_p[idx], slack), (q[idx], d_cost_q[idx], slack),
            (p[idx], np.ones(len(idx)), s.n - 1),
            (q[idx], np.ones(len(idx)), self.node_cap - s.n), (q[idx], d_e[idx], self.edge_cap - s.e)))
        idx = idx[ok]
        # neighbours moving in the same batch invalidate each other's gains: keep the better-ranked one
        rank = np.full(self.N, np.iinfo(np.int64).max, dtype=np.int64)
        rank[cand[idx]] = np.arange(len(idx))
        both = (rank[self.src] < len(idx)) & (rank[self.dst] < len(idx))
        drop = np.zeros(self.N, dtype=bool)
        drop[np.maximum(rank[self.src][both], rank[self.dst][both])] = True
        idx = idx[~drop[:len(idx)]]
        return cand[idx], q[idx]

    def refine(self, a: np.ndarray, max_iters: int, progress=None) -> tuple[np.ndarray, dict]:
        s = _State(self, a)
        first = s
        steps = {"balance": 1.0, "comm": 1.0}
        idle = {"balance": False, "comm": False}
        iters, accepted = 0, 0
        bar = progress(total=max_iters) if progress else None
        mode = "balance"
        while iters < max_iters and not all(idle.values()):
            nodes, dest = (self.propose_balance if mode == "balance" else self.propose_comm)(s)
            if not len(nodes) or steps[mode] < MIN_STEP:
                idle[mode] = True
                mode = "comm" if mode == "balance" else "balance"
                continue
            k = max(1, int(np.ceil(steps[mode] * len(nodes))))
            b = s.a.copy()
            b[nodes[:k]] = dest[:k]
            t = _State(self, b)
            iters += 1
            if bar:
                bar.update(1)
                bar.set_postfix(max_ms=f"{1e3 * t.max_cost:.3g}", viol=f"{t.violation:.3g}", mode=mode)
            if t.better_than(s):
                s, accepted = t, accepted + 1
                steps[mode] = min(1.0, steps[mode] * 1.5)
                idle = {"balance": False, "comm": False}
            else:
                steps[mode] /= 2
            mode = "comm" if mode == "balance" else "balance"
        if bar:
            bar.close()
        return s.a, dict(first=first, last=s, iterations=iters, accepted=accepted)


def _group_cumsum(group: np.ndarray, rank: np.ndarray, val: np.ndarray) -> np.ndarray:
    """Cumulative sum of val within each group, in rank order (returned in the input order)."""
    order = np.lexsort((rank, group))
    v = np.asarray(val, dtype=float)[order]
    cs = np.cumsum(v)
    g = group[order]
    starts = np.concatenate([[True], g[1:] != g[:-1]])
    base = np.maximum.accumulate(np.where(starts, np.arange(len(g)), 0))
    before = np.concatenate([[0.0], cs])[base]
    out = np.empty_like(cs)
    out[order] = cs - before
    return out


def g3_partition(indptr, indices, num_parts: int, *, model: CostModel, node_imbalance: float = 1.10,
                 edge_imbalance: float = 1.10, max_iters: int = 100, seed: int = 0, progress: bool = False,
                 log=None, start: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """METIS start (node-balanced) refined for the slowest rank's estimated epoch. Returns (assignment, info).

    ``indptr``/``indices``: in-edge CSR without self loops.
    """
    n = len(indptr) - 1
    epoch = 2 * model.layers
    limits = dict(node_imbalance_limit=node_imbalance, edge_imbalance_limit=edge_imbalance)
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64), dict(objective_before=0.0, objective_after=0.0, iterations=0, **limits)
    t0 = time.time()
    if start is None:
        sym = symmetrize(indptr, indices)
        start, info = metis_partition(indptr, indices, num_parts, balance="nodes", seed=seed, sym=sym)
    t_metis = time.time() - t0
    ref = _Refiner(indptr, indices, num_parts, model, node_imbalance, edge_imbalance)
    bar = None
    if progress:
        import sys
        from tqdm import tqdm

        def bar(total):
            return tqdm(total=total, desc="g3 refinement", unit="iter", file=sys.stderr, leave=False)
    a, r = ref.refine(np.asarray(start, dtype=np.int64), max_iters, bar)
    first, last = r["first"], r["last"]
    out = dict(objective="max over parts of the estimated epoch seconds (cost_model)",
               objective_before=epoch * first.max_cost, objective_after=epoch * last.max_cost,
               violation_before=first.violation, violation_after=last.violation,
               node_imbalance_after=float(last.n.max() / last.n.mean()),
               edge_imbalance_after=float(last.e.max() / max(1e-300, last.e.mean())),
               iterations=r["iterations"], accepted_iterations=r["accepted"], start="metis balance=nodes",
               metis_seconds=round(t_metis, 3), refine_seconds=round(time.time() - t0 - t_metis, 3), **limits)
    if log:
        log(f"g3: objective {out['objective_before']:.6g}s -> {out['objective_after']:.6g}s, cap violation "
            f"{first.violation:.3g} -> {last.violation:.3g}, {r['iterations']} iterations ({r['accepted']} kept)")
        if last.violation > 0:
            log(f"g3: warning: node/edge caps not met (node imbalance {out['node_imbalance_after']:.3f}, "
                f"edge imbalance {out['edge_imbalance_after']:.3f})")
    return a, out
