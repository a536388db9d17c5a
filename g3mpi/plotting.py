"""Plotting helpers shared by the run directory's plots, g3-inspect's partition plot and the benchmarks' (matplotlib).

Figures are made with matplotlib's object API (:class:`matplotlib.figure.Figure`, Agg canvas): no display, no
pyplot state, nothing to close.

Per-part and per-rank panels are drawn alike at 1 to 1024 bars: stacked bars (filled steps above
:data:`STEP_BARS`), dashed lines at the mean and the max (the max naming its part or rank), the legend above the
panel, outside its data (:func:`legend_above`), and whole-number ticks (:func:`index_axis`, :func:`whole_ticks`).
"""
from __future__ import annotations

import numpy as np

#: above this many bars a panel draws them as filled steps (``stairs``): bars one or two pixels wide leave light
#: seams between them
STEP_BARS = 64
#: up to this many bars every bar has its own tick label; above, whole-number ticks about an inch apart
TICK_EVERY_BAR = 32
#: font size of legend entries; legend and panel titles are a point larger
LEGEND_FONTSIZE = 8


def figure(width: float, height: float):
    """A Figure of ``width`` x ``height`` inches with constrained layout."""
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), layout="constrained")


def stacked(ax, layers, labels, colors=None) -> list:
    """``layers`` (arrays of one value per bar) stacked bar by bar, the first at the bottom, one bar per index
    (filled steps above :data:`STEP_BARS` bars); returns the layers' handles. The
    y axis runs from 0 to just above the highest stack (set, not autoscaled: a stacked bar's bottom is a sticky
    edge that can pin the top to a line drawn at the maximum)."""
    layers = [np.nan_to_num(np.asarray(v, dtype=float)) for v in layers]
    n = len(layers[0])
    colors = colors or [f"C{i}" for i in range(len(layers))]
    steps = n > STEP_BARS
    handles, bottom = [], np.zeros(n)
    for v, label, color in zip(layers, labels, colors):
        if steps:
            handles.append(ax.stairs(bottom + v, np.arange(n + 1) - 0.5, baseline=bottom, fill=True, color=color,
                                     label=label))
        else:
            handles.append(ax.bar(np.arange(n), v, bottom=bottom, color=color, label=label))
        bottom = bottom + v
    top = float(bottom.max()) if n else 0.0
    ax.set_ylim(0, 1.06 * top if top > 0 else 1)
    return handles


def shown(v: float) -> str:
    """``v`` to 3 significant digits, but 2432 rows, not 2.43e+03."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def mean_max(ax, total, unit: str, noun: str) -> list:
    """Dashed lines at the mean and the max of ``total`` over the bars, the max naming its ``noun`` ("part",
    "rank") and index (the slowest rank sets the epoch; among 1024 thin bars it is easy to miss); returns their
    handles (none for no bars)."""
    total = np.nan_to_num(np.asarray(total, dtype=float))
    if not len(total):
        return []
    worst = int(np.argmax(total))
    unit = f" {unit}" if unit else ""
    return [ax.axhline(float(total.mean()), color="0.25", linestyle="--", linewidth=1,
                       label=f"mean {shown(total.mean())}{unit}"),
            ax.axhline(float(total[worst]), color="C3", linestyle=":", linewidth=1.2,
                       label=f"max {shown(total[worst])}{unit} ({noun} {worst})")]


def legend_above(ax, handles, ncol: int, title: str | None = None) -> None:
    """The legend of ``handles`` above the panel, outside its data (constrained layout makes room for it), row
    by row in ``ncol`` columns, clear of the top y tick label (which stands half its height above the panel when
    the tick is at the top). A panel with a legend takes its ``title`` as the legend's: an axes title would sit on
    top of the legend. With no handles the title is the panel's own."""
    if not handles:
        if title:
            ax.set_title(title, fontsize=LEGEND_FONTSIZE + 1)
        return
    rows = -(-len(handles) // max(1, ncol))
    # matplotlib fills a legend column by column: handing it the entries column by column keeps them in rows
    handles = [handles[i] for c in range(ncol) for i in range(c, rows * ncol, ncol) if i < len(handles)]
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties
    tick_points = FontProperties(size=rcParams["ytick.labelsize"]).get_size_in_points()
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol, frameon=False,
              fontsize=LEGEND_FONTSIZE, title=title, title_fontsize=LEGEND_FONTSIZE + 1,
              borderaxespad=0.75 * tick_points / LEGEND_FONTSIZE, handlelength=1.6, columnspacing=1.5)


def index_axis(ax, n: int, label: str) -> None:
    """The x axis of ``n`` bars (parts, ranks): exactly their span, every index labelled up to
    :data:`TICK_EVERY_BAR` bars, else whole-number ticks about an inch apart."""
    ax.set_xlabel(label)
    ax.set_xlim(-0.5, max(n, 1) - 0.5)
    if n <= TICK_EVERY_BAR:
        ax.set_xticks(np.arange(n), [str(i) for i in range(n)])
    else:
        whole_ticks(ax)


def whole_ticks(ax) -> None:
    """Whole-number ticks on the x axis (epochs, ranks), written as whole numbers: 1, 2, 3 for three epochs and
    a single 1 for one, where matplotlib's own ticks are 1.00, 1.25, ... or 0.96, 0.98, ... (its ``integer``
    option only keeps steps above 1 whole)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    class Whole(MaxNLocator):
        def tick_values(self, vmin, vmax):
            ticks = super().tick_values(vmin, vmax)
            return ticks[np.isclose(ticks, np.round(ticks))]

    ax.xaxis.set_major_locator(Whole(nbins="auto", steps=[1, 2, 5, 10], integer=True))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}"))


def rank_breakdown(ax, comp, blocked, idle, title: str) -> None:
    """Stacked per-rank time breakdown: compute, blocked on communication, idle (waiting at the allreduce), with
    the mean and the slowest rank's total; the legend, titled ``title``, above the panel."""
    handles = stacked(ax, [comp, blocked, idle], ["compute", "blocked", "idle"])
    handles += mean_max(ax, np.add(np.add(comp, blocked), idle), "s", "rank")
    index_axis(ax, len(comp), "rank")
    ax.set_ylabel("seconds per epoch")
    legend_above(ax, handles, ncol=3, title=title)
