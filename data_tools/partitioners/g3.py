"""G3's locality-aware partitioning, generalised: METIS, then batched refinement of the slowest rank's epoch.

G3 (SIGMOD 2023) refines a METIS partition greedily: take the part with the most halo dependencies, pick the
boundary node whose move removes most of them, swap it with a node of the lightest part that adds the fewest
new dependencies. Here the same step runs on many nodes at once, on a cost model of the whole epoch
(:mod:`.cost`): each part p has a load

    load_p = compute_p + comm_p + penalty * mean_cost * (excess_nodes_p / node_cap + excess_edges_p / edge_cap)

where compute_p = edge_seconds * local_edges_p * width, comm_p = (halo_p + send_p) * width * 4 / bandwidth,
node_cap = max(node_imbalance * mean owned nodes, ceil(N / P)) and edge_cap_p = edge_imbalance * mean local edges,
raised by d - mean when part p owns a node with d > mean in-edges (a hub, on skewed graphs with many parts: its
in-edges stay together, so the plain cap could never be met).

0. Start (:mod:`.g3_start`): METIS (recursive bisection up to 16 parts, k-way above), node-balanced, or
   edge-balanced when in-degrees are skewed; on skewed graphs up to 8 parts k-way minimising the communication
   volume instead of the cut. A node-balanced start over the edge cap that cuts more than ``SWITCH_CUT`` of the
   edges is replaced by an edge-balanced one with the same objective (``start_switched`` in the info). Nodes
   without any edge cost nothing anywhere: they are re-placed by water-filling so owned counts are as equal as
   they can be (:mod:`.caps`).
1. Balance step (phase 1 and 2 steps: :mod:`.g3_steps`): parts above the mean load shed nodes to the parts
   below it with room under both caps, each to the receiver holding most of its neighbours, else to the
   least-loaded one (G3's "lightest part"). *Chain* step: the same with receivers allowed past a cap, then a
   balance step that passes the excess on (G3's swap, batched). *Edge-cap swap*, only while a cap is broken
   and nothing else moves: heavy nodes out of the parts over their edge cap, light nodes back.
2. Communication step: boundary moves that lower the total halo rows, no load reaching the current maximum
   and no cap crossed; of two neighbours in one batch only the better-ranked moves.
3. Max-communication step (phase 2): G3's step on the parts whose halo + send rows are within 5 % of the
   maximum (*swap*: the same with the caps relaxed, then a balance step).
4. For all proposed moves at once the exact single-move change of the halo and send rows of p and q is
   computed from the replica counts; moves are ranked and a prefix taken per source and per receiver within
   their budgets (:mod:`.g3_moves`).
5. A fraction ``step`` of the batch is applied (C is updated incrementally: O(moved in-edges x P),
   :mod:`.g3_state`) and kept if it lowers (cap violation, max cost, max communication rows, total halo rows)
   lexicographically; else undone and ``step`` halved.

6. Descent step (phase 3, :mod:`.g3_descent`): a zero-temperature threshold descent on the energy E = sum
   over parts of max(0, comm_p - level), the level ``DESCENT_BAND`` (10 %) below the max communication rows,
   lowered as the maximum falls; unlike 3 it acts on every part above the level and keeps moves that gain
   nothing at once.

Phase 1 alternates balance, communication and chain steps (and edge-cap swaps, as above); phase 2 alternates
swap, max-communication, balance and communication steps (and edge-cap swaps) with the max cost allowed up to
``(1 + cost_slack)`` times phase 1's (default 0: the max cost never rises). Each phase runs until no step
proposes a move, ``step`` < 1/256, two accepted steps in a row gain less than 0.1 %, its objective gained
less than 0.1 % over the last ``WINDOW`` (8) evaluations (phase 1: ``PHASE1_WINDOW``, 3, one round of its
steps), or ``max_iters`` evaluations (both phases together). Phase 3 (the descent, under the same bound; by
default only when the max communication rows are more than ``DESCENT_MIN_IMBALANCE`` (1.10) times the mean)
runs until the max rows fell by less than ``DESCENT_TOL`` (1 %) over the last ``DESCENT_WINDOW`` (4)
evaluations, ``DESCENT_PATIENCE`` kept batches in a row leave the energy as it was, nothing is proposed, or as many
evaluations as phases 1 and 2 took (at most ``max_iters``; ``descent_iters`` overrides it): on 10^5-10^6-node
graphs an evaluation costs tens of milliseconds. When phase 1 already leaves the rows more than
``DESCENT_MIN_IMBALANCE`` apart, phase 2 is skipped and the descent runs in its place (phase 2 only works on
the parts within ``COMM_BAND`` of the maximum; on Cora it took 8-14 evaluations for what the descent does in
1-3). A last repair moves lowest-degree nodes out of any part still above the node cap, then nodes out of any
part above its edge cap where another part has room under both (:mod:`.caps`). Everything is
deterministic for a given seed (the METIS seed; ties broken by node and part ID).
"""
from __future__ import annotations

import time

import numpy as np

from .caps import fill_isolated, repair_edges, repair_nodes
from .cost import CostModel
from .g3_descent import DESCENT_MIN_IMBALANCE, _Descent
from .g3_start import _switch_to_edges, start_plan
from .g3_state import _State
from .g3_steps import PHASE1, PHASE1_WINDOW, PHASE2, _Steps
from .metis import fill_empty_parts, metis_partition, symmetrize


class _Refiner(_Steps, _Descent):
    """G3's refinement of one graph into ``num_parts`` parts: the steps of phases 1 and 2 (:mod:`.g3_steps`), the
    descent (:mod:`.g3_descent`) and their schedule (:meth:`refine`)."""

    def refine(self, a: np.ndarray, max_iters: int, progress=None, start=None,
               cost_slack: float = 0.0, descent_iters: int | None = None, seed: int = 0) -> tuple[np.ndarray, dict]:
        """Phase 1 minimises the max cost (balance and total-halo steps); phase 2 lowers the max communication
        rows (G3's step on the worst parts first) keeping the max cost within ``1 + cost_slack`` of phase 1's;
        phase 3 (:meth:`_descend`, under the same bound) evens out the parts' rows when phase 2 leaves them more
        than ``DESCENT_MIN_IMBALANCE`` apart, or always when ``descent_iters`` is given (``seed``: its draws).
        When phase 1 already leaves them more than ``DESCENT_MIN_IMBALANCE`` apart, phase 2 is skipped and the
        descent runs in its place (unless ``descent_iters`` is 0)."""
        s = _State(self, start if start is not None else a)
        first = dict(max_cost=s.max_cost, violation=s.violation, total_comm=s.total_comm, max_comm=s.max_comm)
        moved = np.nonzero(s.a != a)[0]
        if len(moved):
            s.apply(moved, a[moved])
        bar = progress(total=max_iters) if progress else None
        it1, acc1 = self._loop(s, PHASE1, max_iters, 0.0, bar, objective=1, window=PHASE1_WINDOW)
        phase1 = dict(max_cost=s.max_cost, max_comm=s.max_comm, iterations=it1)
        bound = s.max_cost * (1 + cost_slack) if s.violation == 0 else 0.0
        descent = s.violation == 0 and bound > 0 and descent_iters != 0
        # the descent replaces phase 2 when the parts' rows are far apart (max / mean communication rows)
        skip2 = descent and s.comm_spread() > DESCENT_MIN_IMBALANCE
        it2 = acc2 = 0
        if not skip2:
            it2, acc2 = self._loop(s, PHASE2, max_iters - it1, bound, bar, objective=2)
        phase2 = dict(max_cost=s.max_cost, max_comm=s.max_comm, iterations=it2, skipped=skip2)
        it3 = acc3 = 0
        if descent and (descent_iters is not None or s.comm_spread() > DESCENT_MIN_IMBALANCE):   # (true if skip2)
            budget = min(max_iters, it1 + it2) if descent_iters is None else descent_iters
            it3, acc3 = self._descend(s, bound, budget, seed, bar)
        it2, acc2 = it2 + it3, acc2 + acc3
        if bar:
            bar.close()
        last = dict(max_cost=s.max_cost, violation=s.violation, total_comm=s.total_comm, max_comm=s.max_comm,
                    node_imbalance=float(s.n.max() / s.n.mean()),
                    edge_imbalance=float(s.e.max() / max(1e-300, s.e.mean())))
        return s.a, dict(first=first, phase1=phase1, phase2=phase2, descent=dict(iterations=it3, accepted=acc3),
                         last=last, iterations=it1 + it2, accepted=acc1 + acc2,
                         assignment=s.a)


def _progress_bar(total: int):
    """tqdm bar of the refinement's evaluations on stderr (hidden where stderr is not a terminal)."""
    import sys

    from tqdm import tqdm
    return tqdm(total=total, desc="g3 refinement", unit="iter", file=sys.stderr, leave=False, disable=None)


def g3_partition(indptr, indices, num_parts: int, *, model: CostModel, node_imbalance: float = 1.10,
                 edge_imbalance: float = 1.10, max_iters: int = 100, seed: int = 0, progress: bool = False,
                 log=None, start: np.ndarray | None = None, start_balance: str = "auto", cost_slack: float = 0.0,
                 recursive: bool | None = None, start_objective: str = "auto",
                 descent_iters: int | None = None, start_name: str | None = None,
                 symmetric: bool = False) -> tuple[np.ndarray, dict]:
    """METIS start (node-balanced) refined for the slowest rank's estimated epoch. Returns (assignment, info).

    ``indptr``/``indices``: in-edge CSR without self loops. ``start_objective``: the METIS start minimises the
    edge cut (``cut``) or the total communication volume (``volume``: k-way, so ``recursive`` is ignored);
    ``auto`` (default): the volume when the in-degrees are skewed, P <= ``VOLUME_MAX_PARTS`` and ``recursive``
    is not given, else the cut. On the R-MAT graphs of the benchmark the volume start leaves 13-16 % fewer max
    communication rows after refinement and a 1-3 % lower estimated epoch, but METIS takes 3-5x longer with it
    (3-10x on the SBM graph, where it gains 1-2 %). ``start_balance``: the start's vertex weights, ``nodes`` or
    ``edges``; ``auto`` (default): edges on skewed in-degrees, else nodes, switched to edges when the
    node-balanced start is over the edge cap and cuts more than ``SWITCH_CUT`` of the edges (a second METIS
    run; ``start_switched`` in the info). ``descent_iters``: the most evaluations of the descent
    (phase 3); None (default): as many as phases 1 and 2 took, at most ``max_iters``, and only when the parts'
    rows are more than ``DESCENT_MIN_IMBALANCE`` apart; 0: no descent. ``start``: an assignment to refine
    instead of METIS's (``g3-partition --refine g3``), ``start_name`` what made it (info's ``start``).
    ``symmetric``: every edge u -> v has its reverse v -> u in the CSR (graph.h5's ``symmetric``), which makes
    the refiner's set-up faster; the result is the same.
    """
    n = len(indptr) - 1
    epoch = 2 * model.layers
    limits = dict(node_imbalance_limit=node_imbalance, edge_imbalance_limit=edge_imbalance)
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64), dict(objective_before=0.0, objective_after=0.0, iterations=0, **limits)
    t0 = time.time()
    in_deg = np.diff(np.asarray(indptr))
    auto_balance = start_balance == "auto"
    start_balance, recursive, start_objective = start_plan(in_deg, num_parts, start_balance, recursive,
                                                           start_objective)
    ref = _Refiner(indptr, indices, num_parts, model, node_imbalance, edge_imbalance, symmetric)
    t_setup = time.time() - t0
    said, switched = (), None
    if start is None:
        start, start_balance, said, switched = _metis_start(indptr, indices, num_parts, ref, in_deg, seed=seed,
                                                            balance=start_balance, auto_balance=auto_balance,
                                                            recursive=recursive, objective=start_objective,
                                                            edge_imbalance=edge_imbalance)
    t_metis = time.time() - t0 - t_setup  # the refiner's setup counts as refinement time
    bar = _progress_bar if progress else None
    start = np.asarray(start, dtype=np.int64)
    out_deg = in_deg if ref.symmetric else np.bincount(np.asarray(indices, dtype=np.int64), minlength=n)
    isolated = (in_deg == 0) & (out_deg == 0)
    a, r = ref.refine(fill_isolated(start, isolated, num_parts), max_iters, bar, start, cost_slack=cost_slack,
                      descent_iters=descent_iters, seed=seed)
    a = _final_repairs(a, r, ref, num_parts, in_deg, out_deg)
    desc = start_name or f"metis balance={start_balance} {'recursive' if recursive else 'kway'}" + \
        (" objective=volume" if start_objective == "volume" else "")
    out = _info(r, ref, epoch, desc, cost_slack, round(t_metis, 3), round(time.time() - t0 - t_metis, 3), in_deg,
                num_parts, limits)
    if said:
        out["metis_messages"] = list(said)
    if switched:
        out["start_switched"] = switched
    if log:
        _log_outcome(log, out, r, ref, in_deg, n, num_parts, node_imbalance, edge_imbalance)
    return a, out


def _info(r: dict, ref: _Refiner, epoch: int, start: str, cost_slack: float, t_metis: float, t_refine: float,
          in_deg: np.ndarray, num_parts: int, limits: dict) -> dict:
    """:func:`g3_partition`'s info from the refiner's record ``r``: the objective and the comm rows before and after,
    per phase, the imbalances, the start and the times."""
    n, m = len(in_deg), int(in_deg.sum())
    first, last = r["first"], r["last"]
    return dict(objective="max over parts of the estimated epoch seconds (cost_model)",
                objective_before=epoch * first["max_cost"], objective_after=epoch * last["max_cost"],
                violation_before=first["violation"], violation_after=last["violation"],
                halo_rows_before=int(first["total_comm"]), halo_rows_after=int(last["total_comm"]),
                max_comm_rows_before=int(first["max_comm"]), max_comm_rows_after=int(last["max_comm"]),
                max_comm_rows_phase1=int(r["phase1"]["max_comm"]), cost_slack=cost_slack,
                node_imbalance_after=last["node_imbalance"], edge_imbalance_after=last["edge_imbalance"],
                iterations=r["iterations"], accepted_iterations=r["accepted"],
                max_comm_rows_phase2=int(r["phase2"]["max_comm"]), phase2_skipped=r["phase2"]["skipped"],
                descent_iterations=r["descent"]["iterations"], start=start, metis_seconds=t_metis,
                refine_seconds=t_refine, node_imbalance_cap=ref.node_cap * num_parts / n, hubs=len(ref.hubs),
                edge_imbalance_floor=float(in_deg.max()) * num_parts / max(1, m), **limits)


def _metis_start(indptr, indices, num_parts: int, ref: _Refiner, in_deg: np.ndarray, *, seed: int, balance: str,
                 auto_balance: bool, recursive: bool, objective: str, edge_imbalance: float) -> tuple:
    """The METIS start: (assignment, its balance, what METIS said, the switch to an edge-balanced start or
    None). A node-balanced start of an ``auto`` balance over the edge cap with a large cut is run again
    edge-balanced."""
    sym = symmetrize(indptr, indices)
    start, info = metis_partition(indptr, indices, num_parts, balance=balance, seed=seed, sym=sym,
                                  recursive=recursive, objective=objective)
    said = tuple(info.get("metis_messages", ()))
    switched = None
    if auto_balance and balance == "nodes":
        switched = _switch_to_edges(ref.src, ref.dst, in_deg, start, num_parts, edge_imbalance)
    if switched:   # hubs bunched in a part of a graph with little locality: an edge-balanced start instead
        balance = "edges"
        start, info = metis_partition(indptr, indices, num_parts, balance=balance, seed=seed, sym=sym,
                                      recursive=recursive, objective=objective)
        said += tuple(info.get("metis_messages", ()))
    return start, balance, said, switched


def _final_repairs(a: np.ndarray, r: dict, ref: _Refiner, num_parts: int, in_deg: np.ndarray,
                   out_deg: np.ndarray) -> np.ndarray:
    """The refined assignment within the node and edge caps and with no empty part; ``r["last"]`` (and
    ``r["repaired"]``) updated when that moved a node."""
    degree = in_deg + out_deg
    a = repair_nodes(a, ref.node_cap, num_parts, degree)
    a, _ = fill_empty_parts(a, num_parts, degree)  # a no-op unless P is close to N
    a = repair_edges(a, ref.node_cap, ref.edge_cap, num_parts, in_deg)
    if not np.array_equal(a, r["assignment"]):
        last = _State(ref, a)
        r["last"] = dict(max_cost=last.max_cost, violation=last.violation, total_comm=last.total_comm,
                         max_comm=last.max_comm,
                         node_imbalance=float(last.n.max() / last.n.mean()),
                         edge_imbalance=float(last.e.max() / max(1e-300, last.e.mean())))
        r["repaired"] = True
    return a


def _log_outcome(log, out: dict, r: dict, ref: _Refiner, in_deg: np.ndarray, n: int, num_parts: int,
                 node_imbalance: float, edge_imbalance: float) -> None:
    """The refinement's notes (a switched start, caps that cannot be met), its result and a warning if the caps
    were not met."""
    switched, first, last = out.get("start_switched"), r["first"], r["last"]
    m = int(in_deg.sum())
    if switched:
        log(f"g3: note: node-balanced METIS left an edge imbalance of {switched['edge_imbalance']:.3f} and cut "
            f"{100 * switched['cut_fraction']:.0f} % of the edges; starting from edge-balanced METIS instead")
    if in_deg.max() > ref.edge_cap:
        hub = int(np.argmax(in_deg))
        big = int((in_deg > ref.edge_cap).sum())
        log(f"g3: note: {big} node(s) have more in-edges than an edge imbalance of {edge_imbalance:g} allows "
            f"({ref.edge_cap:.0f} per part); the largest, node {hub}, has {int(in_deg[hub])} "
            f"({out['edge_imbalance_floor']:.3f}x the mean part's {m / num_parts:.0f}). A part owning a node with "
            f"d in-edges above the mean may hold d - {m / num_parts:.0f} more than the cap")
    if ref.node_cap > node_imbalance * n / num_parts:
        log(f"g3: note: a node imbalance of {node_imbalance:g} cannot be met with {n} nodes in {num_parts} parts; "
            f"each part may own {int(ref.node_cap)} ({out['node_imbalance_cap']:.3f}x the mean)")
    log(f"g3: objective {out['objective_before']:.6g}s -> {out['objective_after']:.6g}s, cap violation "
        f"{first['violation']:.3g} -> {last['violation']:.3g}, {r['iterations']} iterations ({r['accepted']} kept)")
    if last["violation"] > 0:
        log(f"g3: warning: node/edge caps not met (node imbalance {out['node_imbalance_after']:.3f}, "
            f"edge imbalance {out['edge_imbalance_after']:.3f})")
