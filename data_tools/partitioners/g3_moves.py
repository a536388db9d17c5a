"""G3's moves: the refiner's graph and caps, and the exact evaluation every refinement step builds its batch with.

:class:`_Moves` (the base of :mod:`.g3`'s refiner) holds the graph (in-edge CSR, edge ends, in-degrees), the caps
and the cost model's per-edge and per-row costs. A step (:mod:`.g3_steps`, :mod:`.g3_descent`) shortlists
candidate nodes (:meth:`_Moves._shortlist`), gives each a destination (:meth:`_Moves._destinations`: the allowed
part holding most of its in- and out-neighbours) and evaluates all the proposed moves at once: the exact
single-move change of the halo and send rows of p and q is computed from the replica counts C[u, r] = #edges
from u into part r (:mod:`.g3_state`; for v itself and each in-neighbour of v, :meth:`_Moves._deltas`):
vectorised lookups, no Python loop over nodes. Moves are ranked (balance: load removed from p per load added to
q; communication: halo rows saved; max-communication: rows removed from a worst part per row added elsewhere)
and a prefix taken per source and per receiver within their budgets (per-group cumulative sums, filtered rule
after rule): sources shed down to the mean load, receivers grow up to it (one move may overshoot it but not the
maximum) and stay under both caps.

Budgets are per-group running totals (:func:`_fits`, :meth:`_Moves._within_budgets`); of two neighbours in one
batch only the better-ranked moves (:meth:`_Moves._no_clash`): their gains interact.
"""
from __future__ import annotations

import itertools

import numpy as np

from g3mpi.format.graph import first_unsorted_row

from . import g3_state
from .cost import CostModel
from .g3_state import PENALTY, _sorted_unique, _State

#: a step (phases 1-3) stops once its batch fraction, halved at each rejected batch, falls below this
MIN_STEP = 1 / 256


class _Moves:
    """The graph, the caps and the batch machinery the refinement steps share (see the module docstring)."""

    def __init__(self, indptr, indices, num_parts, model: CostModel, node_imbalance, edge_imbalance,
                 symmetric: bool = False):
        self.N = len(indptr) - 1
        self.P = num_parts
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)
        # every edge's reverse is there too, once: the replica counts are then taken row by row (_State)
        self.symmetric = symmetric and not _has_repeats(self.indptr, self.indices)
        self.deg = np.diff(self.indptr)
        self.dst = np.repeat(np.arange(self.N, dtype=np.int64), self.deg)
        self.src = self.indices
        self.in_deg = self.deg.astype(float)
        self.model = model
        # state versions: every assignment a _State of this refiner takes gets a new one (undo returns to the
        # previous one); a proposal is remembered per version
        self.versions = itertools.count()
        self.k = max(4096, self.N // 16)  # candidates examined exactly per proposal
        # ... and their in-edges at most (the exact evaluation costs O(in-edges)): on R-MAT 22 the communication
        # step's 262144 best candidates had 26M in-edges, 4.6 s for a 0.07 % gain
        self.k_edges = max(1 << 20, len(self.indices) // 32)
        # a cap below what any assignment reaches could never be met, and the later phases need none violated:
        # the node cap is at least ceil(N / P); a part owning a hub (more in-edges than the mean part) may hold
        # the hub's in-edges plus the edge cap's slack above the mean (_State.edge_cap, per part)
        self.node_cap = max(node_imbalance * self.N / num_parts, float(-(-self.N // num_parts)))
        mean_e = len(self.src) / num_parts
        self.edge_cap = edge_imbalance * mean_e
        self.edge_slack = self.edge_cap - mean_e
        self.hubs = np.flatnonzero(self.in_deg > mean_e)
        comp, comm = model.layer_costs([1.0], [1.0])
        self.c_edge, self.c_row = float(comp[0]), float(comm[0])

    def in_edges(self, cand: np.ndarray):
        """(candidate index, source u) of every in-edge u -> v of the candidates v. (Gathers by take: about twice
        as fast as fancy indexing in numpy 2.4.)"""
        deg = self.deg.take(cand)
        ends = deg.cumsum()
        ci = np.arange(len(cand), dtype=np.int64).repeat(deg)
        pos = (self.indptr.take(cand) - (ends - deg)).repeat(deg) + np.arange(int(ends[-1]) if len(ends) else 0)
        return ci, self.indices.take(pos)

    @staticmethod
    def _edges_of(has, ci, u):
        """The in-edges (ci, u) of the candidates ``has`` selects, as ``in_edges(cand[has])`` gives them."""
        e = has[ci]
        return (np.cumsum(has) - 1)[ci[e]], u[e]

    def _destinations(self, s: _State, cand, ci, u, allowed: np.ndarray, fallback: int | None, rows=None):
        """Per candidate: the allowed part (not its own) holding most of its in- and out-neighbours.

        Candidates with no neighbour in an allowed part get ``fallback`` (or -1 when None). ``rows``: C[cand]
        when the caller has it (dense counts)."""
        P, a = self.P, s.a
        nc = len(cand)
        fallback = -1 if fallback is None else fallback
        # counts C[v, r] of out-neighbours plus in-neighbours, as integers
        if s.dense and nc * P <= g3_state.DENSE_LIMIT // 4:
            w = np.bincount(ci * P + a[u], minlength=nc * P).reshape(nc, P)
            w += s.c_rows(cand) if rows is None else rows
            if not allowed.all():
                w[:, ~allowed] = 0
            at = np.arange(nc)
            w[at, a[cand]] = 0
            best = w.argmax(axis=1)
            return np.where(w[at, best] > 0, best, fallback)
        q = np.full(nc, fallback, dtype=np.int64)
        oc, orr, ow = s.out_pairs(cand)
        pair_c = np.concatenate([ci, oc])
        pair_r = np.concatenate([a[u], orr])
        pair_w = np.concatenate([np.ones(len(ci)), ow])
        ok = allowed[pair_r] & (pair_r != a[cand][pair_c])
        if nc * P <= g3_state.DENSE_LIMIT // 4:
            w = np.bincount(pair_c[ok] * P + pair_r[ok], weights=pair_w[ok], minlength=nc * P).reshape(nc, P)
            best = np.argmax(w, axis=1)
            has = w[np.arange(nc), best] > 0
            q[has] = best[has]
            return q
        key, inv = np.unique(pair_c[ok] * P + pair_r[ok], return_inverse=True)
        w = np.bincount(inv, weights=pair_w[ok], minlength=len(key))
        kc, kr = key // P, key % P
        order = np.lexsort((kr, -w, kc))
        first = _run_starts(order, kc)
        q[kc[first]] = kr[first]
        return q

    @staticmethod
    def _edge_terms(s: _State, p, q, ci, u):
        """Per in-edge u -> v of the candidates (v moving from p to q): (part of u, x = (C[u, q] == 0),
        y = -(C[u, p] == 1), u in p, u in q); x and y as int8."""
        au, qe, pe = s.a.take(u), q.take(ci), p.take(ci)
        x = (s.get(u, qe) == 0).view(np.int8)
        y = -(s.get(u, pe) == 1).view(np.int8)
        return au, x, y, au == pe, au == qe

    def _deltas(self, s: _State, cand, q, ci, u, halo: bool = True, terms=None):
        """Exact single-move changes (comm rows of p, comm rows of q, total halo rows) of moving cand to q.
        ``halo=False``: the halo change is not needed (None). ``terms``: :meth:`_edge_terms`, when the caller
        has them."""
        nc = len(cand)
        p = s.a[cand]
        au, x, y, in_p, in_q = self._edge_terms(s, p, q, ci, u) if terms is None else terms
        m_vp, m_vq = (s.get(cand, p) > 0).view(np.int8), (s.get(cand, q) > 0).view(np.int8)
        t = s.ext[cand] + m_vp                      # parts v has an out-edge into
        # per in-edge u -> v, with lost_p = u not in p and C[u, p] == 1 (p no longer needs u), new_q = u not in q
        # and C[u, q] == 0 (q now needs u): the terms of p's rows (u in p: x, else -lost_p), of q's rows (u in
        # q: -(C[u, p] == 1), else new_q) and of the halo (new_q - lost_p: p's term if u is in p or q, else both).
        # Integer figures: exact as floats in any order.
        w_p = np.where(in_p, x, y)
        w_q = np.where(in_q, y, x)
        d_comm_p = (2 * m_vp - t) + np.bincount(ci, weights=w_p, minlength=nc)
        d_comm_q = (t - 2 * m_vq) + np.bincount(ci, weights=w_q, minlength=nc)
        if not halo:
            return d_comm_p, d_comm_q, None
        w_h = np.where(in_p | in_q, w_p, w_p + w_q)
        d_halo = (m_vp - m_vq) + np.bincount(ci, weights=w_h, minlength=nc)
        return d_comm_p, d_comm_q, d_halo

    @staticmethod
    def _within_budgets(idx, rules, shed=()) -> np.ndarray:
        """Moves (in rank order) whose per-group running total stays within the group's budget. ``rules``: the
        total including the move (a receiver never passes its budget); ``shed``: the total before it (a source
        sheds while it is still above its target, so one move larger than the excess is allowed). The rules
        filter one after another, so a move dropped by one no longer uses up budget in the next. A rule may carry
        a fourth entry, True when its values are non-negative integers: then a rule that every group's total
        meets (exact) cannot drop a move and is skipped."""
        keep = None  # the moves still kept (None: all)
        sorts = {}   # id of a rule's group array -> its grouping of the moves still kept (rules share p's and q's)
        for rule, shedding in [(r, False) for r in rules] + [(r, True) for r in shed]:
            group, val, budget = rule[0], np.asarray(rule[1], dtype=float), rule[2]
            if keep is not None:
                if not len(keep):
                    break
                group, val = group[keep], val[keep]
            if len(rule) > 3 and rule[3] and not shedding and (
                    np.bincount(group, weights=val, minlength=len(budget)) <= budget + 1e-12).all():
                continue
            grouping = sorts.get(id(rule[0]))
            if grouping is None:
                grouping = sorts[id(rule[0])] = _grouping(group, len(budget))
            fits = _fits(group, val, budget, shedding, grouping)
            if not fits.all():
                keep = np.flatnonzero(fits) if keep is None else keep[fits]
                sorts = {}
        if keep is None:
            return np.ones(len(idx), dtype=bool)
        ok = np.zeros(len(idx), dtype=bool)
        ok[keep] = True
        return ok

    def _shortlist(self, s: _State, cand: np.ndarray, allowed: np.ndarray, require_gain: bool = False,
                   per_part: bool = False):
        """At most ``self.k`` candidates, those with most neighbours in an allowed other part relative to their own
        (a proxy of the communication a move saves; exact deltas follow for the shortlist only). ``per_part``
        (shedding in-edges): at most ``self.k`` / (number of parts among them) from each part, most in-edges
        per neighbour left behind in their part first, so that a part whose heavy nodes are all inside it still
        sheds."""
        if not s.dense or (not require_gain and len(cand) <= self.k):
            return cand
        rows = s.C.copy() if len(cand) == self.N else s.c_rows(cand)  # (all N candidates: cand is arange(N))
        at = np.arange(len(cand)), s.a[cand]
        own = rows[at]
        if not allowed.all():
            rows[:, ~allowed] = -1
        rows[at] = -1
        ext = _row_max(rows)
        score = self.in_deg[cand] / (1.0 + np.maximum(0, own - ext)) if per_part else ext - own
        if require_gain:
            keep = (ext > 0) & (score >= 0)
            cand, score = cand[keep], score[keep]
        if len(cand) <= self.k:
            return cand
        if per_part:  # the best of each part: by part, then score; a rank within the part under its quota
            pc = s.a[cand]
            order = np.lexsort((-score, pc))
            pc = pc[order]
            rank = np.arange(len(order)) - np.searchsorted(pc, pc)
            return np.sort(cand[order[rank < self.k // len(_sorted_unique(pc))]])
        order = np.argsort(-score, kind="stable")[:self.k]
        within = np.cumsum(self.deg.take(cand[order])) <= self.k_edges
        return np.sort(cand[order[:max(1, int(within.sum()))]])

    def _source_gain(self, s: _State, p, d_e, d_comm_p, nodes: bool = True) -> np.ndarray:
        """What moving nodes out of their parts ``p`` takes off those parts' load (:attr:`_State.load`): their
        ``d_e`` in-edges of compute, the ``d_comm_p`` communication rows the parts lose (negative: gain), and the
        cap penalty, ``PENALTY`` x the mean cost per part's worth of excess, for a part over its edge cap (the
        share ``d_e`` of its cap) and, with ``nodes``, for a part over the node cap (one node's share)."""
        gain = self.c_edge * d_e - self.c_row * d_comm_p
        over_n = (s.n[p] > self.node_cap) / self.node_cap if nodes else 0.0
        over_e = s.e[p] > s.edge_cap[p]
        if not (np.any(over_n) or over_e.any()):  # the penalty term would be +0.0 everywhere
            return gain
        return gain + PENALTY * s.mean_cost * (over_n + over_e * d_e / np.maximum(1.0, s.edge_cap[p]))

    def _no_clash(self, cand, idx):
        """Of two neighbours in one batch only the better-ranked (earlier) one moves: their gains interact."""
        sel = cand[idx]
        rank = np.full(self.N, len(idx), dtype=np.int64)
        rank[sel] = np.arange(len(idx))
        ci, u = self.in_edges(sel)
        drop = np.zeros(len(idx), dtype=bool)
        drop[ci[rank[u] < ci]] = True
        return idx[~drop]


def _has_repeats(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether a row of the CSR (sorted rows) lists a source twice: a repeated edge, whose copies in the two
    directions a symmetric graph need not hold equally often."""
    return len(indices) > 1 and first_unsorted_row(indptr, indices[1:] == indices[:-1]) is not None


def _run_starts(order: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The entries of ``order`` (an ordering grouping equal ``keys``) that start a run of equal keys: the first
    of each group."""
    if not len(order):
        return order
    k = keys[order]
    return order[np.concatenate([[True], k[1:] != k[:-1]])]


def _row_max(x: np.ndarray) -> np.ndarray:
    """x.max(axis=1) of an (n, P) array, column by column for few parts (numpy's reduce along short rows is slow)."""
    if x.shape[1] > 32 or not x.shape[1]:
        return x.max(axis=1)
    out = x[:, 0].copy()
    for j in range(1, x.shape[1]):
        np.maximum(out, x[:, j], out=out)
    return out


def _grouping(group: np.ndarray, num_groups: int) -> tuple:
    """(order, group[order], where each sorted entry's group starts): the moves sorted by group, stably."""
    # group IDs < num_groups: as int16 the stable sort is a radix sort
    order = (group.astype(np.int16) if num_groups <= 1 << 15 else group).argsort(kind="stable")
    g = group[order]
    return order, g, g.searchsorted(g)


def _fits(group: np.ndarray, val: np.ndarray, budget: np.ndarray, shed: bool, grouping: tuple | None = None
          ) -> np.ndarray:
    """Per move (in rank order = input order): whether the running total of val within its group, including the
    move (``shed``: before it), stays within budget[group]. The running total is the cumulative sum over all
    moves sorted by group, less its value at the group's start. ``grouping``: :func:`_grouping` of group, when
    the caller has it."""
    order, g, start = _grouping(group, len(budget)) if grouping is None else grouping
    v = val[order]
    cs = v.cumsum()
    within = cs - np.concatenate(([0.0], cs))[start]
    ok = np.empty(len(g), dtype=bool)
    ok[order] = within - v < budget[g] - 1e-12 if shed else within <= budget[g] + 1e-12
    return ok
