"""G3's start: which METIS partition the refinement (:mod:`.g3`) begins from.

METIS recursive bisection up to ``RECURSIVE_MAX_PARTS`` (16) parts, k-way above, node-balanced, or
edge-balanced when in-degrees are skewed (coefficient of variation > ``SKEW`` (2), power-law graphs such as
RMAT, where node-balanced METIS leaves 3-8x edge imbalance). On skewed graphs up to ``VOLUME_MAX_PARTS`` (8)
parts (and with ``start_objective="volume"`` at any P) k-way METIS minimising the total communication volume
instead of the cut: there it leaves 13-16 % fewer max communication rows after refinement, but the volume
objective's METIS time grows with P (2.5-3x the cut's at 16 parts on RMAT), so above 8 parts the default stays
the cut (:func:`start_plan`). A node-balanced start over the edge cap that cuts more than ``SWITCH_CUT`` of the
edges (hubs bunched in a part of a graph with little locality: R-MAT of moderate skew) is replaced by an
edge-balanced one with the same objective (:func:`_switch_to_edges`; ``start_switched`` in the info).
"""
from __future__ import annotations

import numpy as np

#: coefficient of variation of in-degrees above which g3 starts from edge-balanced METIS
SKEW = 2.0
#: a node-balanced METIS start over the edge cap that cuts more than this fraction of the edges is replaced by an
#: edge-balanced one (same objective and bisection). Node-balanced METIS cuts 6-14 % of Cora's edges (4-16 parts;
#: edge imbalance 1.15-1.38, where g3 from it reaches 0.97-1.0x the best METIS epoch), 20-56 % of the SBM's (edge
#: imbalance <= 1.06) and 43-81 % of R-MAT graphs' with a = 0.35-0.45 (in-degree CV 0.9-2.0, edge imbalance
#: 1.10-4.3), where g3 from it ended 1.01-1.15x the best METIS epoch and from the edge-balanced start 0.98-1.0x
SWITCH_CUT = 0.4
#: g3 starts from METIS recursive bisection up to this many parts (k-way above): on the SBM and RMAT18 graphs
#: of the benchmark bisection left 29% / 38% fewer max communication rows at 16 parts than k-way
RECURSIVE_MAX_PARTS = 16
#: on skewed graphs g3 starts from METIS minimising the communication volume up to this many parts (the cut above)
VOLUME_MAX_PARTS = 8


def _switch_to_edges(src: np.ndarray, dst: np.ndarray, in_deg: np.ndarray, start: np.ndarray, num_parts: int,
                     edge_imbalance: float) -> dict | None:
    """Whether g3 should leave a node-balanced METIS start for an edge-balanced one: when the start is over the
    edge cap (its edge imbalance above ``edge_imbalance``) and cuts more than ``SWITCH_CUT`` of the edges (little
    locality: every move of a hub costs communication rows). ``src``/``dst``: the edges' ends (the refiner's
    arrays). Returns the two figures, or None."""
    e = np.bincount(start, weights=in_deg, minlength=num_parts)
    imbalance = float(e.max() / max(1e-300, e.mean()))
    if imbalance <= edge_imbalance:
        return None
    cut = float(np.count_nonzero(start[src] != start[dst])) / max(1, len(dst))
    return dict(edge_imbalance=imbalance, cut_fraction=cut) if cut > SWITCH_CUT else None


def start_plan(in_deg: np.ndarray, num_parts: int, balance: str = "auto", recursive: bool | None = None,
               objective: str = "auto") -> tuple[str, bool, str]:
    """The METIS start g3 uses: (vertex weights, recursive bisection or not, objective), ``auto``/None resolved.

    Skewed in-degrees (coefficient of variation > ``SKEW``, power-law graphs): edge-balanced, and up to
    ``VOLUME_MAX_PARTS`` parts (unless ``recursive`` is given) k-way minimising the communication volume; else
    node-balanced, minimising the cut by bisection up to ``RECURSIVE_MAX_PARTS`` parts, k-way above."""
    in_deg = np.asarray(in_deg)
    skewed = float(in_deg.std()) / max(1e-12, float(in_deg.mean())) > SKEW if len(in_deg) else False
    if balance == "auto":  # skewed: edge-balanced, node counts are filled with cheap nodes
        balance = "edges" if skewed else "nodes"
    if objective == "auto":
        objective = "volume" if skewed and num_parts <= VOLUME_MAX_PARTS and recursive is None else "cut"
    if objective == "volume":
        recursive = False
    elif recursive is None:
        recursive = num_parts <= RECURSIVE_MAX_PARTS
    return balance, bool(recursive), objective
