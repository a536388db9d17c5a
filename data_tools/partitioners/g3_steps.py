"""G3's refinement steps of phases 1 and 2 (:mod:`.g3`), and the loop that runs them.

1. Balance step: parts above the mean load are *sources* (only the parts over a cap while any is), parts
   below it with room under both caps are *receivers*. Nodes of the sources (a shortlist of at most
   max(4096, N/16) with at most max(2^20, E/32) in-edges, those with most neighbours in a receiver relative
   to their own part) each get a
   destination: the receiver holding most of their in- and out-neighbours, else the least-loaded receiver
   (G3's "lightest part"). *Chain* step: the same with receivers allowed past a cap, followed at once by a
   balance step that passes the excess on (G3's swap, batched); both are kept or undone together.
   *Edge-cap swap*, only while a cap is broken and no other step moves anything (the parts with edge room
   are all at the node cap, so the balance steps, which need room under both, stall: a node-balanced start
   on a skewed graph): the parts over their edge cap shed nodes above the mean in-degree (most in-edges per
   communication row added first, at most k / sources from each) to parts with edge room whatever their node
   count, then the parts over the node cap give their lightest nodes to parts with node room (the shedders
   among them), kept or undone together. Without it g3 left 2.0-4.5x the mean edges in a part of an R-MAT
   graph whose in-degree CV (1.99) is just below ``SKEW`` (4-16 parts, node-balanced start by default).
2. Communication step: boundary nodes with at least as many neighbours in another allowed part as in their
   own move there when that lowers the total halo rows, no load reaches the current maximum and no cap is
   crossed; of two neighbours in one batch only the better-ranked moves.
3. Max-communication step (phase 2): G3's step on the parts whose halo + send rows are within 5 % of the
   maximum: boundary nodes are pushed out of them, or pulled into them from other parts, to the part
   holding most of their neighbours, when that lowers the worst parts' rows; the others stay below the band,
   under the cost bound and the caps (*swap*: the same with the caps relaxed, then a balance step).

Each step proposes a batch ranked best first (:mod:`.g3_moves`); :meth:`_Steps._loop` applies a fraction ``step``
of it and keeps it if it lowers the state's key (cap violation, max cost, max communication rows, total halo
rows; :mod:`.g3_state`) lexicographically, else undoes it and halves ``step``. Phase 1 (``PHASE1``) alternates
balance, communication and chain steps (and edge-cap swaps); phase 2 (``PHASE2``) swap, max-communication,
balance and communication steps (and edge-cap swaps) under a cost bound. A phase runs until no step proposes a
move, ``step`` < ``MIN_STEP``, two accepted steps in a row gain less than ``TOL``, its objective gained less
than ``TOL`` over the last ``WINDOW`` evaluations (phase 1: ``PHASE1_WINDOW``), or ``max_iters`` evaluations.
"""
from __future__ import annotations

import numpy as np

from .caps import node_limit
from .g3_moves import MIN_STEP, _Moves
from .g3_state import _better, _State

#: relative gain under which an accepted step counts as converging
TOL = 1e-3
#: phase 2 stops when its objective gained less than TOL over this many evaluations
WINDOW = 8
#: phase 1 stops when its objective (the max cost) gained less than TOL over this many evaluations: one round of its
#: three steps. On the SBM and R-MAT 16 graphs of the benchmark (4-16 parts) a window of 8 left est. epochs at most
#: 0.1 % lower for 4-7 more evaluations (17-24 in all instead of 12-20); on Cora the extra ones gained nothing
PHASE1_WINDOW = 3
#: the max-communication step works on the parts within this fraction of the maximum rows
COMM_BAND = 0.05
PHASE1 = ("balance", "comm", "chain", "capswap")
PHASE2 = ("swap", "maxcomm", "balance", "comm", "capswap")


class _Steps(_Moves):
    """The proposal steps of phases 1 and 2 (``propose_*``) and the loop that applies them (:meth:`_loop`)."""

    def propose_balance(self, s: _State, strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Moves from parts above the mean load to parts below it, best ratio first (G3's step, batched).

        ``strict=False`` (the first half of a chained step): the receivers may pass a cap, the balance step
        that follows passes the excess on."""
        a = s.a
        target = float(s.load.sum() / len(s.load))   # = load.mean(), without its Python overhead
        sources = s.load > target * (1 + 1e-9)
        if s.violation > 0:  # the parts over a cap first: other moves would only blur whether the batch helps
            sources &= (s.excess_n + s.excess_e) > 0
        receivers = s.load < target
        if strict:
            receivers &= (s.n < self.node_cap - 1) & (s.e < s.edge_cap)
        if not sources.any() or not receivers.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cand = self._shortlist(s, np.nonzero(sources[a])[0], receivers)
        ci, u = self.in_edges(cand)
        rec = np.nonzero(receivers)[0]
        rows = s.c_rows(cand) if s.dense else None
        q = self._destinations(s, cand, ci, u, receivers, int(rec[np.argmin(s.load[rec])]), rows)
        p = a[cand]
        d_comm_p, d_comm_q, _ = self._deltas(s, cand, q, ci, u, halo=False)
        d_e = self.in_deg[cand]
        d_cost_q = self.c_edge * d_e + self.c_row * d_comm_q
        gain = self._source_gain(s, p, d_e, d_comm_p)
        idx = np.nonzero(gain > 0)[0]
        g, dq = gain[idx], d_cost_q[idx]
        score = np.where(dq <= 0, 1e30 + g, g / np.maximum(dq, 1e-300))
        order = np.lexsort((cand[idx], -score))
        idx, g, dq = idx[order], g[order], dq[order]
        pi, qi, ones = p[idx], q[idx], np.ones(len(idx))
        big = np.full(self.P, np.inf)
        ok = self._within_budgets(idx, (
            (pi, ones, s.n - 1, True),                             # sources never empty
            (qi, dq, s.max_cost * (1 - 1e-6) - s.load),            # receivers stay under the max cost
            (qi, ones, self.node_cap - s.n if strict else big, True),  # ... within the node cap
            (qi, d_e[idx], s.edge_cap - s.e if strict else big, True)),  # ... and the edge cap
            shed=((pi, g, s.load - target),                        # sources shed down to the mean,
                  (qi, dq, target - s.load)))                      # receivers grow up to it
        return cand[idx[ok]], qi[ok]

    def propose_shed_edges(self, s: _State, rounds: int = 3) -> tuple[np.ndarray, np.ndarray]:
        """The first half of an edge-cap swap: the parts over their edge cap shed in-edges down to it into parts
        with edge room, whatever their load or node count (:meth:`propose_return` then sends light nodes back).

        A candidate goes to the receiver holding most of its neighbours, else to the one with most edge room.
        Only nodes above the mean in-degree move (light ones come back in exchange), most in-edges per
        communication row added first, within budgets: sources shed down to their edge cap and never empty;
        receivers stay under their edge cap and the max cost. Receivers that a dropped move wanted are full:
        the dropped candidates then choose among the others, for up to ``rounds`` rounds (a part whose nodes
        are all well connected to one full part still sheds)."""
        a = s.a
        sources = s.excess_e > 0
        receivers = ~sources & (s.e < s.edge_cap)
        empty = np.zeros(0, np.int64)
        if not sources.any() or not receivers.any():
            return empty, empty
        cand = self._shortlist(s, np.nonzero(sources[a])[0], receivers, per_part=True)
        ci, u = self.in_edges(cand)
        rows = s.c_rows(cand) if s.dense else None
        mean_deg = len(self.src) / self.N
        n_room, cost_room = s.n - 1, s.max_cost * (1 - 1e-6) - s.load
        edge_room, shed = s.edge_cap - s.e, s.e - s.edge_cap
        out_n, out_q = [], []
        for _ in range(rounds):
            rec = np.flatnonzero(receivers)
            if not len(rec) or not len(cand):
                break
            q = self._destinations(s, cand, ci, u, receivers, int(rec[np.argmax(edge_room[rec])]), rows)
            p = a[cand]
            d_e = self.in_deg[cand]
            idx, dq = self._shed_order(s, cand, q, ci, u, mean_deg)
            pi, qi, de = p[idx], q[idx], d_e[idx]
            ones = np.ones(len(idx))
            ok = self._within_budgets(idx, (
                (pi, ones, n_room, True),            # sources never empty
                (qi, dq[idx], cost_room),            # receivers stay under the max cost
                (qi, de, edge_room, True)),          # ... and their edge cap
                shed=((pi, de, shed),))              # sources shed down to their edge cap
            take = idx[ok]
            out_n.append(cand[take])
            out_q.append(q[take])
            P = self.P
            n_room = n_room - np.bincount(p[take], minlength=P)
            cost_room = cost_room - np.bincount(q[take], weights=dq[take], minlength=P)
            edge_room = edge_room - np.bincount(q[take], weights=d_e[take], minlength=P)
            shed = shed - np.bincount(p[take], weights=d_e[take], minlength=P)
            dropped = idx[~ok]
            receivers = receivers.copy()
            receivers[qi[~ok]] = False                         # full
            left = np.zeros(len(cand), dtype=bool)
            left[dropped] = shed[p[dropped]] > 0               # their part still over its cap
            if not left.any():
                break
            ci, u = self._edges_of(left, ci, u)
            cand = cand[left]
            rows = rows[left] if rows is not None else None
        return np.concatenate(out_n) if out_n else empty, np.concatenate(out_q) if out_q else empty

    def _shed_order(self, s: _State, cand: np.ndarray, q: np.ndarray, ci: np.ndarray, u: np.ndarray,
                    mean_deg: float) -> tuple[np.ndarray, np.ndarray]:
        """The shedding moves worth proposing (their source gains, an in-degree above the mean), most in-edges per
        communication row added first; and every candidate's cost added to its receiver."""
        p = s.a[cand]
        d_comm_p, d_comm_q, _ = self._deltas(s, cand, q, ci, u, halo=False)
        d_e = self.in_deg[cand]
        dq = self.c_edge * d_e + self.c_row * d_comm_q
        gain = self._source_gain(s, p, d_e, d_comm_p, nodes=False)
        idx = np.flatnonzero((gain > 0) & (d_e > mean_deg))
        score = d_e[idx] / (1.0 + np.maximum(0.0, d_comm_p[idx] + d_comm_q[idx]))
        return idx[np.lexsort((cand[idx], -score))], dq

    def propose_return(self, s: _State) -> tuple[np.ndarray, np.ndarray]:
        """The second half of an edge-cap swap: parts over the node cap give their nodes with fewest in-edges
        (those whose moves add fewest communication rows first) to the parts with room under it, the part
        holding most of their neighbours, else the one with most room. A receiver may pass its edge cap by the
        few in-edges of the light nodes (the next swap sheds a heavy node for them): a swap is kept only if the
        cap violation falls, and a light node's share of the node cap outweighs its share of the edge cap."""
        a, P = s.a, self.P
        limit = node_limit(self.node_cap, self.N, P)
        excess = np.maximum(0, s.n - limit).astype(np.int64)
        room = s.n < limit
        if not excess.any() or not room.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cand = np.flatnonzero(excess[a] > 0)
        # per part over the cap, its 4 x excess (at least 64) nodes with fewest in-edges
        order = np.lexsort((cand, self.in_deg[cand], a[cand]))
        cand = cand[order]
        pc = a[cand]
        rank = np.arange(len(cand)) - np.searchsorted(pc, pc)
        cand = np.sort(cand[rank < np.maximum(64, 4 * excess[pc])])
        ci, u = self.in_edges(cand)
        rows = s.c_rows(cand) if s.dense else None
        rec = np.flatnonzero(room)
        q = self._destinations(s, cand, ci, u, room, int(rec[np.argmax(limit - s.n[rec])]), rows)
        keep = q >= 0
        cand, q = cand[keep], q[keep]
        if not len(cand):
            return cand, q
        ci, u = self.in_edges(cand)
        d_comm_p, d_comm_q, _ = self._deltas(s, cand, q, ci, u, halo=False)
        d_e = self.in_deg[cand]
        order = np.lexsort((cand, d_comm_p + d_comm_q, d_e))
        cand, q, d_e, p = cand[order], q[order], d_e[order], a[cand[order]]
        ones = np.ones(len(cand))
        ok = self._within_budgets(np.arange(len(cand)), (
            (q, ones, limit - s.n, True),),          # receivers up to the node cap
            shed=((p, ones, s.n - limit),))          # sources down to it
        return cand[ok], q[ok]

    def propose_comm(self, s: _State) -> tuple[np.ndarray, np.ndarray]:
        """Boundary moves that lower the total halo rows without raising any load to the maximum or a cap."""
        a = s.a
        top = float(s.load.max()) * (1 - 1e-6)
        allowed = (s.n < self.node_cap - 1) & (s.e < s.edge_cap) & (s.load < top)
        if s.dense:
            cand = self._shortlist(s, np.arange(self.N), allowed, require_gain=True)
        else:
            cross = a[self.src] != a[self.dst]
            boundary = np.zeros(self.N, dtype=bool)
            boundary[self.src[cross]] = True
            boundary[self.dst[cross]] = True
            cand = np.nonzero(boundary)[0]
        if not len(cand):
            return cand, cand
        ci, u = self.in_edges(cand)
        rows = s.c_rows(cand) if s.dense else None
        q = self._destinations(s, cand, ci, u, allowed, None, rows)
        has = q >= 0
        cand, q = cand[has], q[has]
        ci, u = self._edges_of(has, ci, u)
        p = a[cand]
        d_comm_p, d_comm_q, d_halo = self._deltas(s, cand, q, ci, u)
        idx = np.nonzero(d_halo < 0)[0]
        idx = idx[np.lexsort((cand[idx], d_halo[idx]))]
        d_e = self.in_deg[cand[idx]]
        d_cost_p = -self.c_edge * d_e + self.c_row * d_comm_p[idx]
        d_cost_q = self.c_edge * d_e + self.c_row * d_comm_q[idx]
        pi, qi, ones = p[idx], q[idx], np.ones(len(idx))
        slack = top - s.load
        ok = self._within_budgets(idx, (
            (pi, d_cost_p, slack), (qi, d_cost_q, slack),
            (pi, ones, s.n - 1, True),
            (qi, ones, self.node_cap - s.n, True), (qi, d_e, s.edge_cap - s.e, True)))
        idx = self._no_clash(cand, idx[ok])
        return cand[idx], q[idx]

    def propose_maxcomm(self, s: _State, bound: float, strict: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """G3's step on the communication rows of the worst parts (the *sources*: rows within ``COMM_BAND`` of the
        maximum and above the mean). A boundary node moves to the part holding most of its neighbours when that
        lowers a source's halo + send rows: pushed out of a source, or pulled into one (a node of another part
        whose neighbours are mostly in the source). Sources shed down to the band, the other parts stay below it;
        ``strict``: the part gaining a node also stays under the cost bound (``max(bound, max cost)``) and the
        caps (else the balance step that follows in a ``swap`` restores them)."""
        a, comm = s.a, s.comm
        top = float(comm.max())
        target = max(float(comm.mean()), (1 - COMM_BAND) * top)
        src = comm >= target
        if src.all() or not src.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        allowed = np.ones(self.P, dtype=bool)
        cand = self._shortlist(s, np.arange(self.N), allowed, require_gain=True)
        if not len(cand):
            return cand, cand
        ci, u = self.in_edges(cand)
        q = self._destinations(s, cand, ci, u, allowed, None)
        p = a[cand]
        keep = (q >= 0) & (src[p] != src[np.maximum(q, 0)])
        if not keep.all():
            cand, q, p = cand[keep], q[keep], p[keep]
            ci, u = self.in_edges(cand)
        d_comm_p, d_comm_q, d_halo = self._deltas(s, cand, q, ci, u)
        gain = -np.where(src[p], d_comm_p, d_comm_q)
        rise = np.where(src[p], d_comm_q, d_comm_p)
        idx = np.nonzero(gain > 0)[0]
        score = gain[idx] / np.maximum(rise[idx], 0.5) - 1e-3 * d_halo[idx]
        idx = idx[np.lexsort((cand[idx], -score))]
        sign = np.where(src, -1.0, 1.0)
        room = np.where(src, comm - target + 1, target - comm - 1)   # sources shed to the band, others stay below
        pi, qi = p[idx], q[idx]
        rules = [(pi, sign[pi] * d_comm_p[idx], room), (qi, sign[qi] * d_comm_q[idx], room),
                 (pi, np.ones(len(idx)), s.n - 1)]
        if strict:
            d_e = self.in_deg[cand[idx]]
            cost_top = max(bound, s.max_cost)
            rules += [(qi, self.c_edge * d_e + self.c_row * d_comm_q[idx], cost_top - s.cost),
                      (pi, -self.c_edge * d_e + self.c_row * d_comm_p[idx], cost_top - s.cost),
                      (qi, np.ones(len(idx)), self.node_cap - s.n), (qi, d_e, s.edge_cap - s.e)]
        idx = idx[self._within_budgets(idx, rules)]
        idx = self._no_clash(cand, idx)
        return cand[idx], q[idx]

    def _loop(self, s: _State, modes, max_iters: int, bound: float, bar, objective: int,
              window: int = WINDOW) -> tuple[int, int]:
        """Alternate the proposal steps of ``modes`` (applied, kept if ``key(bound)`` improves, else undone and
        the step halved) until none proposes a move, each converged, the phase's objective (``key`` entry
        ``objective``) gained less than ``TOL`` over the last ``window`` evaluations without cap violation, or
        ``max_iters`` evaluations."""
        steps = {m: 1.0 for m in modes}
        idle = {m: False for m in modes}
        slow = {m: 0 for m in modes}
        iters = accepted = 0
        k_mode = 0
        memo = {}  # mode -> (state version, its proposal)
        history = [s.key(bound)[objective]]
        while iters < max_iters and not all(idle.values()):
            if len(history) > window and s.violation == 0 and history[-1] > history[-1 - window] * (1 - TOL):
                break
            mode = modes[k_mode % len(modes)]
            k_mode += 1
            if idle[mode]:
                continue
            if mode == "capswap":
                # only when a part is over a cap and nothing else moves: the parts with edge room are all at the
                # node cap (or the reverse), and the balance steps only move nodes into parts with room under both
                others_idle = all(v for m, v in idle.items() if m != mode)
                if not (s.violation > 0 and others_idle):
                    idle[mode] = others_idle
                    continue
            seen = memo.get(mode)
            if seen is not None and seen[0] == s.version:  # a step was undone: same state, same proposal
                nodes, dest = seen[1:]
            else:
                nodes, dest = self._propose(s, mode, bound)
            memo[mode] = s.version, nodes, dest
            if not len(nodes) or steps[mode] < MIN_STEP:
                idle[mode] = True
                continue
            k = max(1, int(np.ceil(steps[mode] * len(nodes))))
            before = s.key(bound)
            self._apply_step(s, mode, nodes[:k], dest[:k])
            iters += 1
            if bar:
                _show(bar, s, mode)
            after = s.key(bound)
            if _better(after, before):
                accepted += 1
                steps[mode] = min(1.0, steps[mode] * 1.5)
                idle = {m: False for m in modes}
                small = after[0] >= before[0] - 1e-12 and all(after[i] > before[i] * (1 - TOL) for i in (1, 2, 3))
                slow[mode] = slow[mode] + 1 if small else 0
                if slow[mode] >= 2:  # converged: two accepted steps in a row that gain < TOL
                    idle[mode] = True
            else:
                if mode in ("swap", "chain", "capswap"):
                    s.undo()
                s.undo()
                steps[mode] /= 2
                if k == 1:  # a single move was rejected: a smaller step would propose the same move again
                    idle[mode] = True
            history.append(s.key(bound)[objective])
        return iters, accepted

    def _propose(self, s: _State, mode: str, bound: float) -> tuple[np.ndarray, np.ndarray]:
        """The moves (nodes, destinations) that the step ``mode`` of :meth:`_loop` proposes on ``s``."""
        if mode in ("balance", "chain"):
            return self.propose_balance(s, strict=mode == "balance")
        if mode == "capswap":  # heavy nodes out of parts over the edge cap, else light ones out of parts
            nodes, dest = self.propose_shed_edges(s)   # over the node cap (the second half returns more)
            if not len(nodes):
                nodes, dest = self.propose_return(s)
            return nodes, dest
        if mode == "comm":
            return self.propose_comm(s)
        return self.propose_maxcomm(s, bound, strict=mode == "maxcomm")

    def _apply_step(self, s: _State, mode: str, nodes: np.ndarray, dest: np.ndarray) -> None:
        """Apply a step's moves, and for the two-part steps their second half (undone with them: :meth:`_loop`
        undoes twice)."""
        s.apply(nodes, dest)
        if mode in ("swap", "chain"):  # G3's swap, batched: the receivers pass load on to the lightest parts
            n2, d2 = self.propose_balance(s)
            s.apply(n2, d2)
        elif mode == "capswap":  # the receivers of heavy nodes give light ones back where there is node room
            n2, d2 = self.propose_return(s)
            s.apply(n2, d2)


def _show(bar, s: _State, mode: str) -> None:
    """One evaluation on the progress bar, with the state it left."""
    bar.update(1)
    bar.set_postfix(max_ms=f"{1e3 * s.max_cost:.3g}", rows=int(s.max_comm), viol=f"{s.violation:.3g}", mode=mode)
