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


#: the epoch's phases outside the layers' rounds (timeline.json's labels): their colours, apart from the rounds'
#: blues and oranges and the red of blocked time, and the legend's words for them
PHASE_STYLE = {"forward": ("C4", "forward, before its first round"), "loss": ("C5", "loss"),
               "backward": ("C6", "backward, before its first round"),
               "allreduce (idle)": ("C7", "gradient allreduce and NaN / stop checks"),
               "optimizer step": ("C8", "optimizer step")}


def _timeline_color(label: str, forward: list, backward: list):
    """Forward rounds in blues, backward rounds in oranges (darker: later in the model), each phase its own
    colour (:data:`PHASE_STYLE`)."""
    from matplotlib import colormaps
    if label in forward:
        return colormaps["Blues"](0.35 + 0.55 * forward.index(label) / max(1, len(forward) - 1))
    if label in backward:
        return colormaps["Oranges"](0.35 + 0.55 * backward.index(label) / max(1, len(backward) - 1))
    return PHASE_STYLE.get(label, ("C9", label))[0]


def _timeline_label(label: str) -> str:
    """The legend's entry of a compute part: a layer's round as ``compute: gcn1 fwd``, a phase in words."""
    return PHASE_STYLE[label][1] if label in PHASE_STYLE else f"compute: {label}"


def timeline(ax, doc: dict, title: str, xmax: float | None = None) -> None:
    """One epoch of every rank of ``doc`` (:func:`g3mpi.comm.timeline.combine`) on time in milliseconds: per rank
    a ``compute`` lane (its parts coloured by the round they follow, blocked time left blank) and one lane per
    exchange and direction: the receive window from posting to the last landing (light), the blocked spans (red),
    sends (black ticks) and landings (green ticks). The legend, titled ``title``, above the panel."""
    from matplotlib.patches import Patch
    ranks = doc["ranks"]
    first_post = {}
    for r in ranks:
        for kind, name, t0, _, _ in r["events"]:
            if kind == "post":
                first_post[name] = min(first_post.get(name, t0), t0)
    names = sorted(first_post, key=first_post.get)
    labels = [n.rpartition(".")[0] + " " + n.rpartition(".")[2] for n in names]
    fwd = [lb for lb in labels if lb.endswith(" fwd")]
    bwd = [lb for lb in labels if lb.endswith(" bwd")]
    ms = 1e3
    yticks, ylabels = [], []
    y = 0
    for r in reversed(ranks):
        ev = r["events"]
        for name, label in reversed(list(zip(names, labels))):
            posts = sorted(t0 for k, n, t0, _, _ in ev if k == "post" and n == name)
            lands = [t0 for k, n, t0, _, _ in ev if k == "land" and n == name]
            for i, p in enumerate(posts):
                nxt = posts[i + 1] if i + 1 < len(posts) else float("inf")
                mine = [t for t in lands if p <= t < nxt]
                if mine:
                    ax.broken_barh([(p * ms, (max(mine) - p) * ms)], (y - 0.3, 0.6), color="#dde6f2")
            waits = [(a * ms, (b - a) * ms) for k, n, a, b, _ in ev if k in ("wait", "send_wait") and n == name]
            ax.broken_barh(waits, (y - 0.3, 0.6), color="C3")
            sends = [t0 * ms for k, n, t0, _, _ in ev if k == "send" and n == name]
            ax.plot(sends, [y] * len(sends), "|", color="k", markersize=7, markeredgewidth=1.2)
            ax.plot([t * ms for t in lands], [y] * len(lands), "|", color="C2", markersize=7, markeredgewidth=1.2)
            yticks.append(y)
            ylabels.append(f"rank {r['rank']} {label}")
            y += 1
        segs = r["segments"]
        ax.broken_barh([(a * ms, (b - a) * ms) for _, a, b in segs], (y - 0.4, 0.8),
                       facecolors=[_timeline_color(lb, fwd, bwd) for lb, _, _ in segs])
        yticks.append(y)
        ylabels.append(f"rank {r['rank']} compute")
        y += 1.4
    ax.set_yticks(yticks, ylabels, fontsize=LEGEND_FONTSIZE)
    ax.set_ylim(-0.8, y - 0.6)
    ax.set_xlabel("ms from the first rank's start of the epoch")
    if xmax is not None:
        ax.set_xlim(0, xmax * ms)
    seen = list(dict.fromkeys(lb for r in ranks for lb, _, _ in r["segments"]))
    handles = [Patch(color=_timeline_color(lb, fwd, bwd), label=_timeline_label(lb)) for lb in seen]
    handles += [Patch(color="#dde6f2", label="receives open"), Patch(color="C3", label="blocked"),
                ax.plot([], [], "|", color="k", markersize=7, label="send")[0],
                ax.plot([], [], "|", color="C2", markersize=7, label="landed")[0]]
    legend_above(ax, handles, ncol=min(6, len(handles)), title=title)
