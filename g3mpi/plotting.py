"""Plotting helpers shared by the run directory's plots and the benchmarks' (matplotlib).

Figures are made with matplotlib's object API (:class:`matplotlib.figure.Figure`, Agg canvas): no display, no
pyplot state, nothing to close.
"""
from __future__ import annotations

import numpy as np


def figure(width: float, height: float):
    """A Figure of ``width`` x ``height`` inches with constrained layout."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def rank_breakdown(ax, comp, blocked, idle, title: str) -> None:
    """Stacked per-rank time breakdown: compute, blocked on communication, idle (waiting at the allreduce)."""
    r = np.arange(len(comp))
    ax.bar(r, comp, label="compute")
    ax.bar(r, blocked, bottom=comp, label="blocked")
    ax.bar(r, idle, bottom=np.add(comp, blocked), label="idle")
    if len(r) <= 32:
        ax.set_xticks(r, [str(i) for i in r])
    ax.set_xlabel("rank")
    ax.set_ylabel("seconds per epoch")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
