"""G3's descent (phase 3 of :mod:`.g3`'s refinement): evens out the parts' communication rows.

A zero-temperature threshold descent on the energy E = sum over parts of max(0, comm_p - level), the level
``DESCENT_BAND`` (10 %) below the max communication rows (at least one row), lowered as the maximum falls.
Boundary nodes in or next to a part above the level each draw (seeded) one destination among the parts their
out-edges reach; the exact row changes of p, q (as in :mod:`.g3_moves`) and of the in-neighbours' parts (send
rows: u loses its last edge into p, gains its first into q) give each move's dE. Moves with dE < 0 (best
first), then a random ``DESCENT_PLATEAU`` fraction with dE = 0 (plateau moves), are taken within per-part
budgets: no part reaches the current maximum rows, every changed part stays under the cost bound, both caps
hold; never two neighbours (as in the communication step). A batch is kept if the max rows, the energy and
(beyond the bound) the max cost do not rise, else undone and halved. Unlike the max-communication step of
phase 2 (:mod:`.g3_steps`) it acts on every part above the level and keeps moves that gain nothing at once:
on Cora the comm imbalance (max / mean rows) falls from 1.2-1.4 to 1.13-1.25 and the max rows by 7-16 %.
"""
from __future__ import annotations

import numpy as np

from .g3_moves import MIN_STEP, _fits, _Moves
from .g3_state import _sorted_unique, _State

#: the descent (phase 3) stops after this many kept batches in a row without an energy drop
DESCENT_PATIENCE = 30
#: at most this fraction of the descent's candidates is proposed as plateau moves (energy unchanged) per batch
DESCENT_PLATEAU = 0.1
#: the most candidates the descent examines per evaluation (a random subset beyond): on 10^5-10^6-node graphs
#: an evaluation then costs about as much as a phase-2 one
DESCENT_K = 4096
#: the descent's level: this fraction below the max communication rows (at least one row below it). On Cora
#: (4-16 parts) 10 % reached the rows of a 3 % level in about half the evaluations
DESCENT_BAND = 0.10
#: the descent stops when its max communication rows fell by less than DESCENT_TOL over DESCENT_WINDOW evaluations
DESCENT_WINDOW = 4
DESCENT_TOL = 0.01
#: by default the descent runs only when the parts' rows are further apart than this (max / mean): on the SBM and
#: R-MAT graphs of the benchmark, where phase 2 leaves them within 1-9 %, it lowered the max rows by at most 3 %
#: for 10-50 % more refinement time; on Cora (20-43 % apart) by 7-16 %. When phase 1 leaves them further apart
#: than this, the descent replaces phase 2 (which works only on the parts within COMM_BAND of the maximum): on Cora
#: phase 2 then took 8-14 evaluations for what the descent does in 1-3; forced on the SBM and R-MAT 16/18 graphs at
#: 16 parts (phase 1 leaves them 8-10 % apart), the descent in place of phase 2 left the max rows 2 % lower to
#: 0.3 % higher at the same est. epoch
DESCENT_MIN_IMBALANCE = 1.10


class _Descent(_Moves):
    """Phase 3: the descent's proposal (:meth:`propose_descent`) and loop (:meth:`_descend`)."""

    def propose_descent(self, s: _State, cost_top: float, level: float, rng: np.random.Generator,
                        plateau: float) -> tuple[np.ndarray, np.ndarray]:
        """Threshold descent (phase 3): single-node moves to a neighbour's part that do not raise the energy
        E = sum over parts of max(0, comm_p - level). Returns (nodes, destinations): the moves with dE < 0
        first (lowest dE first), then at most ``plateau`` x candidates moves with dE = 0 in random order.

        Candidates: boundary nodes (an out-edge into another part) in, or next to, a part above ``level`` (at most
        ``DESCENT_K``, a random subset beyond), each with one destination drawn at random among the parts its
        out-edges reach. The exact change of every part's rows is computed (p and q by :meth:`_deltas`, the
        send rows of the in-neighbours' parts from C); a move qualifies when it keeps both caps, keeps the cost
        of every part it changes under ``cost_top`` and raises no part to the current maximum rows. The batch
        keeps, per part, the running total of its row changes within that room (:meth:`_within_budgets`)
        and never moves two neighbours (:meth:`_no_clash`)."""
        comm = s.comm
        none = np.zeros(0, np.int64)
        top = float(comm.max())
        cand = self._descent_candidates(s, level, rng)
        if not len(cand):
            return none, none
        cand, p, q = self._descent_destinations(s, cand, rng)
        nc = len(cand)
        ci, u = self.in_edges(cand)
        terms = self._edge_terms(s, p, q, ci, u)
        d_p, d_q, _ = self._deltas(s, cand, q, ci, u, halo=False, terms=terms)
        c3, r3, d3 = self._third_part_rows(ci, terms)

        def excess(c):
            return np.maximum(0.0, c - level)
        d_e = self.in_deg[cand]
        dE = excess(comm[p] + d_p) - excess(comm[p]) + excess(comm[q] + d_q) - excess(comm[q])
        dE += np.bincount(c3, weights=excess(comm[r3] + d3) - excess(comm[r3]), minlength=nc)
        # rows: no part reaches the current maximum (one at it does not rise); cost: every changed part under
        # cost_top; caps
        room = np.where(comm >= top, 0.0, top - 1 - comm)
        cost_room = cost_top * (1 + 1e-12) - s.cost
        ok = ((d_p <= room[p]) & (d_q <= room[q])
              & (-self.c_edge * d_e + self.c_row * d_p <= cost_room[p])
              & (self.c_edge * d_e + self.c_row * d_q <= cost_room[q])
              & (s.n[q] + 1 <= self.node_cap) & (s.e[q] + d_e <= s.edge_cap[q]) & (s.n[p] > 1))
        bad3 = (d3 > room[r3]) | (self.c_row * d3 > cost_room[r3])
        ok[c3[bad3]] = False
        better = np.flatnonzero(ok & (dE < -1e-9))
        flat = np.flatnonzero(ok & (np.abs(dE) <= 1e-9))
        better = better[np.lexsort((rng.random(len(better)), dE[better]))]
        flat = flat[rng.permutation(len(flat))[:int(np.ceil(plateau * nc))]]
        idx = np.concatenate([better, flat])
        if not len(idx):
            return none, none
        fit = self._descent_budgets(s, idx, p, q, d_p, d_q, d_e, (c3, r3, d3), room, cost_room)
        kept = self._no_clash(cand, idx[fit])
        return cand[kept], q[kept]

    def _descent_candidates(self, s: _State, level: float, rng: np.random.Generator) -> np.ndarray:
        """The descent's candidates: boundary nodes in, or next to, a part above ``level``; at most
        ``DESCENT_K``, a random subset beyond."""
        a, P = s.a, self.P
        hot = s.comm > level
        if s.dense:
            if hot.sum() < P:
                near = hot[a]
                for h in np.flatnonzero(hot):   # the few parts above the level: one column each
                    near |= s.C[:, h] > 0
                cand = np.flatnonzero(near)
            else:
                cand = np.arange(self.N)
            cand = cand[s.ext[cand] > 0]   # boundary nodes
        else:
            cross = a[self.src] != a[self.dst]
            touch = cross & (hot[a[self.src]] | hot[a[self.dst]])
            mark = np.zeros(self.N, dtype=bool)
            mark[self.src[touch]] = True   # u -> v across parts: u has an out-edge into another part
            cand = np.flatnonzero(mark)
        if len(cand) > DESCENT_K:   # a random subset (random keys, O(len(cand)))
            cand = np.sort(cand[np.argpartition(rng.random(len(cand)), DESCENT_K)[:DESCENT_K]])
        return cand

    def _descent_destinations(self, s: _State, cand: np.ndarray,
                              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidates, their parts, their destinations): per candidate the out-part other than its own with the
        lowest random key (ties: the lowest part), from nc <= DESCENT_K rows; a candidate without one is
        dropped."""
        nc, P = len(cand), self.P
        p = s.a[cand]
        oc, orr = s.out_pairs(cand, weights=False)
        other = orr != p[oc]
        oc, orr = oc[other], orr[other]
        key = np.full((nc, P), np.inf)
        key[oc, orr] = rng.random(len(oc))
        q = key.argmin(axis=1)
        has = key[np.arange(nc), q] < np.inf
        if not has.all():
            cand, q, p = cand[has], q[has], p[has]
        return cand, p, q

    def _third_part_rows(self, ci: np.ndarray, terms) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidate, part, row change) of the send rows of the in-neighbours' parts r (neither p nor q) that a
        move changes: -1 when u loses its last edge into p (y), +1 when u gets its first edge into q (x)."""
        P = self.P
        au, x, y, in_p, in_q = terms
        w = x + y
        third = np.flatnonzero(~(in_p | in_q) & (w != 0))
        k3, w3 = ci[third] * P + au[third], w[third]
        key3 = _sorted_unique(k3)
        d3 = np.bincount(np.searchsorted(key3, k3), weights=w3, minlength=len(key3))
        keep3 = d3 != 0
        key3, d3 = key3[keep3], d3[keep3]
        return key3 // P, key3 % P, d3

    def _descent_budgets(self, s: _State, idx: np.ndarray, p: np.ndarray, q: np.ndarray, d_p: np.ndarray,
                         d_q: np.ndarray, d_e: np.ndarray, third: tuple, room: np.ndarray,
                         cost_room: np.ndarray) -> np.ndarray:
        """Which of the moves ``idx`` (in rank order) fit the per-part budgets over the batch: rows and cost of
        p, q and the in-neighbours' parts (``third``: their (candidate, part, row change)), both caps."""
        c3, r3, d3 = third
        pi, qi = p[idx], q[idx]
        d_ei = d_e[idx]
        ones = np.ones(len(idx))
        fit = self._within_budgets(idx, (
            (pi, d_p[idx], room), (qi, d_q[idx], room),
            (pi, -self.c_edge * d_ei + self.c_row * d_p[idx], cost_room),
            (qi, self.c_edge * d_ei + self.c_row * d_q[idx], cost_room),
            (pi, ones, s.n - 1, True), (qi, ones, self.node_cap - s.n, True),
            (qi, d_ei, s.edge_cap - s.e, True)))
        rank = np.full(len(p), len(idx), dtype=np.int64)
        rank[idx] = np.arange(len(idx))
        up = d3 > 0
        if up.any():   # the third parts' rises, in the moves' rank order, within their room
            t_rank, t_r, t_d = rank[c3[up]], r3[up], d3[up]
            o = np.argsort(t_rank, kind="stable")
            t_rank, t_r, t_d = t_rank[o], t_r[o], t_d[o]
            live = t_rank < len(idx)
            t_rank, t_r, t_d = t_rank[live], t_r[live], t_d[live]
            fits = _fits(t_r, t_d, np.minimum(room, cost_room / self.c_row), False)
            fit[t_rank[~fits]] = False
        return fit

    def _descend(self, s: _State, cost_top: float, max_iters: int, seed: int, bar) -> tuple[int, int]:
        """Phase 3: threshold descent on the max communication rows (:meth:`propose_descent`), the level
        ``DESCENT_BAND`` below the current maximum (at least one row), lowered as the maximum falls. A batch is
        kept if no cap is newly crossed, the max cost stays under ``cost_top``, the max rows do not rise and the
        energy does not rise (plateau batches are kept: they reshape the boundary for later drops); else
        undone and ``step`` halved. Stops after ``DESCENT_PATIENCE`` kept batches in a row without an energy
        drop, when the max rows fell by less than ``DESCENT_TOL`` over the last ``DESCENT_WINDOW`` evaluations,
        when nothing is proposed, ``step`` < 1/256, or after ``max_iters`` evaluations. Deterministic for
        ``seed`` (candidate subsets, destinations and plateau moves are drawn from it)."""
        rng = np.random.default_rng(seed)
        step, iters, accepted, stall = 1.0, 0, 0, 0
        history = [s.max_comm]
        while iters < max_iters and step >= MIN_STEP and stall < DESCENT_PATIENCE:
            if len(history) > DESCENT_WINDOW and history[-1] > history[-1 - DESCENT_WINDOW] * (1 - DESCENT_TOL):
                break
            top = s.max_comm
            level = min(top - 1, np.floor(top * (1 - DESCENT_BAND)))
            nodes, dest = self.propose_descent(s, cost_top, level, rng, DESCENT_PLATEAU)
            if not len(nodes):
                break
            k = max(1, int(np.ceil(step * len(nodes))))
            e0 = float(np.maximum(0.0, s.comm - level).sum())
            viol = s.violation
            s.apply(nodes[:k], dest[:k])
            iters += 1
            if bar:
                bar.update(1)
                bar.set_postfix(max_ms=f"{1e3 * s.max_cost:.3g}", rows=int(s.max_comm), mode="descent")
            e1 = float(np.maximum(0.0, s.comm - level).sum())
            if s.violation <= viol + 1e-12 and s.max_cost <= cost_top * (1 + 1e-12) and s.max_comm <= top \
                    and e1 <= e0:
                accepted += 1
                step = min(1.0, step * 1.5)
                stall = 0 if e1 < e0 else stall + 1
            else:
                s.undo()
                step /= 2
            history.append(s.max_comm)
        return iters, accepted
