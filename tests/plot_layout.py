"""Layout checks of a drawn figure, shared by the plot tests (g3-inspect's partition plot, the run directory's
plots, the benchmarks' plots): legends clear of every panel's data area, of each other and of the figure's
texts; tick labels whole numbers that do not overlap."""
from __future__ import annotations


def rendered(fig, dpi: float):
    """The figure laid out as ``savefig(dpi=dpi)`` draws it; returns its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _drawn(labels, limits, coord: int) -> list:
    """The tick labels inside the axis ``limits`` (position ``coord``): matplotlib draws only those; the others
    keep a stale position, e.g. above the panel where its legend is."""
    lo, hi = sorted(limits)
    slack = 1e-9 * max(1.0, abs(hi - lo))
    return [t for t in labels if lo - slack <= t.get_position()[coord] <= hi + slack]


def _texts(fig, ax) -> list:
    """The texts of a panel that a legend must not cover: its title, axis labels and drawn tick labels."""
    texts = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label]
    texts += _drawn(ax.get_xticklabels(), ax.get_xlim(), 0) + _drawn(ax.get_yticklabels(), ax.get_ylim(), 1)
    return [t for t in texts if t.get_visible() and t.get_text() and t.get_figure() is fig]


def check_legends(fig, ren, want: int) -> list:
    """``want`` legends, each inside the figure and clear of every panel's data area, of every panel's texts,
    of the figure's title and of the other legends; returns the legends."""
    axes = [ax for ax in fig.axes if ax.get_visible()]
    legends = [ax.get_legend() for ax in axes if ax.get_legend() is not None]
    boxes = [leg.get_window_extent(ren) for leg in legends]
    texts = [t for ax in axes for t in _texts(fig, ax)]
    if fig._suptitle is not None and fig._suptitle.get_text():
        texts.append(fig._suptitle)
    fb = fig.bbox
    for i, b in enumerate(boxes):
        assert fb.x0 <= b.x0 and b.x1 <= fb.x1 and fb.y0 <= b.y0 and b.y1 <= fb.y1, (i, b, fb)
        for ax in axes:
            assert not b.overlaps(ax.get_window_extent(ren)), ("legend over a panel", i, b, ax.get_window_extent(ren))
        for t in texts:
            assert not b.overlaps(t.get_window_extent(ren)), (i, b, t.get_text())
        for o in boxes[:i]:
            assert not b.overlaps(o), (i, b, o)
    assert len(legends) == want, [leg.get_title().get_text() for leg in legends]
    return legends


def whole_ticks(ax, ren) -> list[int]:
    """The x tick labels shown inside the panel's limits, as whole numbers (a label like "0.25" or "1.00" fails
    here), after checking that no two overlap."""
    lo, hi = sorted(ax.get_xlim())
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text() and lo <= t.get_position()[0] <= hi]
    values = [int(t.get_text()) for t in labels]
    extents = sorted((t.get_window_extent(ren) for t in labels), key=lambda e: e.x0)
    assert all(a.x1 < b.x0 for a, b in zip(extents, extents[1:])), [t.get_text() for t in labels]
    return values
