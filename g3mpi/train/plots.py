"""The run directory's plots, drawn from ``metrics.jsonl`` (rank 0 at the end of a run, or on demand).

    python -m g3mpi.cli.plots RUN          # (re)draw RUN/training.png, RUN/ranks.png (and RUN/timeline.png)

``training.png``: the loss per epoch and the train / validation / test accuracies at each evaluation, the
best-validation epoch (the one ``model.pt`` and ``predictions.h5`` come from) marked. ``ranks.png``: where each
rank's epoch time goes (median over the epochs of compute, time blocked on halo messages, idle at the gradient
allreduce), the epoch time over the run (slowest rank) and the bytes each rank sends per epoch, with the mean and
the max over the ranks (the max naming its rank): the partition's balance and the schedule's overlap at a glance.
``timeline.png`` (where the run recorded ``timeline.json``, ``--timeline-epoch``): one epoch of every rank on one
time axis, compute per layer and direction, sends, landings and blocked time (:func:`g3mpi.plotting.timeline`).
The first two are pure functions of ``metrics.jsonl``, all are written atomically; redrawing while a job runs
shows the epochs so far. They are drawn with :mod:`g3mpi.plotting`'s helpers, like g3-inspect's partition plot:
legends above their panels, whole-number ticks, readable at 1 to 1024 ranks and 1 to 10 000 epochs.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from g3mpi.format import atomic_file
from g3mpi.plotting import (LEGEND_FONTSIZE, figure, index_axis, legend_above, mean_max, rank_breakdown,
                            stacked, timeline, whole_ticks)

# PLOTS: the files plot_run writes; TIMELINE: the recorded epoch (--timeline-epoch), TIMELINE_PLOT its plot, drawn
# where the run has one (the run directory's file names live with the other ones)
from .choices import SUFFIX
from .rundir import ACCURACY_KEYS, PLOTS, SPLITS, TIMELINE, TIMELINE_PLOT, read_metrics, writing

DPI = 110


def _latest_ranks(records, key) -> list[list]:
    """The ``key`` lists of the records written by the latest ranks: a run resumed on another number of ranks
    (``--resume RUN --parts OTHER``) has lists of two widths, and the latest epoch's is the one shown."""
    rows = [r[key] for r in records if isinstance(r.get(key), list)]
    width = len(rows[-1]) if rows else 0
    return [x for x in rows if len(x) == width]


def _median_per_rank(records, key) -> np.ndarray:
    rows = [[np.nan if v is None else v for v in x] for x in _latest_ranks(records, key)]
    if not rows:
        return np.zeros(0)
    with warnings.catch_warnings():   # a rank with no value at all (no overlap without messages) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(np.asarray(rows, dtype=float), axis=0)


def _marker(n: int) -> str | None:
    """Points marked on a line of few (a single epoch is a point, not a line), not on hundreds."""
    return "." if n < 50 else None


def draw_training(records: list[dict], best_epoch: int | None, metric: str = "accuracy"):
    """The loss per epoch and the scores at each evaluation, the best-validation epoch marked; each panel's
    legend above it, whole epochs on the x axes. ``metric`` (``--metric``): the score that chose the best epoch,
    drawn in solid lines, with the accuracies dashed beside it where it is not accuracy."""
    fig = figure(10, 3.8)
    ax_loss, ax_acc = fig.subplots(1, 2)
    ep = [r["epoch"] for r in records if r.get("loss") is not None]
    loss = [r["loss"] for r in records if r.get("loss") is not None]
    loss_h = [ax_loss.plot(ep, loss, marker=_marker(len(ep)), color="C0", label="training loss")[0]]
    if loss and min(loss) > 0 and max(loss) > 10 * min(loss):   # a loss that falls by decades
        ax_loss.set_yscale("log")
    ax_loss.set_ylabel("training loss")
    own = metric != "accuracy"
    curves = [(f"{s}_{SUFFIX[metric]}", f"{s} {metric}", "-") for s in SPLITS] if own else []
    curves += [(key, f"{key.split('_')[0]} accuracy" if own else key.split("_")[0], "--" if own else "-")
               for key in ACCURACY_KEYS]
    acc_h = []
    for i, (key, label, style) in enumerate(curves):
        pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            e, a = zip(*pts)
            acc_h += ax_acc.plot(e, a, marker=_marker(len(pts)), color=f"C{i % len(SPLITS)}", linestyle=style,
                                 label=label)
    if best_epoch:
        mark = f"best validation {metric} (epoch {best_epoch})" if own else f"best validation (epoch {best_epoch})"
        for ax, handles in ((ax_loss, loss_h), (ax_acc, acc_h)):
            handles.append(ax.axvline(best_epoch, color="grey", linestyle=":", linewidth=1, label=mark))
    ax_acc.set_ylim(0, 1)
    ax_acc.set_ylabel(f"{metric} and accuracy" if own else "accuracy")
    for ax, handles, title in ((ax_loss, loss_h, "loss"),
                               (ax_acc, acc_h, f"{metric} and accuracy at each evaluation" if own
                                else "accuracy at each evaluation")):
        ax.set_xlabel("epoch")
        whole_ticks(ax)
        legend_above(ax, handles, ncol=min(len(handles), 4), title=title)
    return fig


def draw_ranks(records: list[dict]):
    """Per rank (1 to 1024 of them): the epoch's time breakdown and the halo bytes sent (medians over the
    epochs, stacked or plain bars, filled steps beyond ``g3mpi.plotting.STEP_BARS`` ranks, with the mean and
    the max), the overlap; and the epoch time over the run. Legends above their panels, whole-number ticks."""
    comp = _median_per_rank(records, "rank_compute_s")
    blocked = _median_per_rank(records, "rank_blocked_s")
    idle = _median_per_rank(records, "rank_allreduce_s")
    sent = _median_per_rank(records, "rank_bytes_sent")
    P = len(comp)
    fig = figure(min(16, 10 + P / 16), 7)
    (ax_t, ax_e), (ax_b, ax_n) = fig.subplots(2, 2)
    E = len(_latest_ranks(records, "rank_compute_s"))
    rank_breakdown(ax_t, comp, blocked, idle, f"median per rank over {E} epoch{'' if E == 1 else 's'}")
    timed = [(r["epoch"], r["epoch_time_s"]) for r in records if r.get("epoch_time_s") is not None]
    title = "epoch time (slowest rank)"
    if len(timed) >= 3:   # the first epoch warms up (allocations, first touches): drawn, it squashed the others
        (e0, t0), timed = timed[0], timed[1:]
        title = f"epoch time (slowest rank; epoch {e0}, warm-up: {t0:.3g} s, not drawn)"
    ep = [e for e, _ in timed]
    ax_e.plot(ep, [t for _, t in timed], marker=_marker(len(ep)), color="C0")
    ax_e.set_xlabel("epoch")
    whole_ticks(ax_e)
    ax_e.set_ylabel("seconds")
    ax_e.set_title(title, fontsize=LEGEND_FONTSIZE + 1)
    mib = sent / 2**20 if len(sent) == P else np.zeros(P)
    handles = stacked(ax_b, [mib], ["sent"], colors=["C4"]) + mean_max(ax_b, mib, "MiB", "rank")
    index_axis(ax_b, P, "rank")
    ax_b.set_ylabel("MiB sent per epoch (median)")
    legend_above(ax_b, handles[1:], ncol=2, title="halo bytes sent")
    ov = _median_per_rank(records, "rank_overlap")
    stacked(ax_n, [ov if len(ov) == P else np.zeros(P)], ["overlap"], colors=["C2"])
    index_axis(ax_n, P, "rank")
    ax_n.set_ylim(0, 1)
    ax_n.set_ylabel("overlap (median)")
    ax_n.set_title("overlap = 1 - blocked / communication time", fontsize=LEGEND_FONTSIZE + 1)
    return fig


def draw_timeline(doc: dict):
    """One recorded epoch (``timeline.json``) of every rank: :func:`g3mpi.plotting.timeline`."""
    lanes = sum(1 + len({e[1] for e in r["events"] if e[0] == "post"}) for r in doc["ranks"])
    fig = figure(12, 1.6 + 0.22 * lanes)
    timeline(fig.subplots(), doc, f"{doc.get('model')}, {doc.get('schedule')}, epoch {doc.get('epoch')}, "
                                  f"{doc.get('world_size')} ranks, sim-net {doc.get('sim_net') or 'off'}")
    return fig


def _save(fig, path: Path) -> Path:
    with writing(path, ValueError, RuntimeError), atomic_file(path, force=True) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path


def plot_run(run_dir, best_epoch: int | None = None, share: tuple[int, int] = (0, 1),
             metric: str | None = None) -> list[Path]:
    """Draw :data:`PLOTS` into ``run_dir`` from its metrics.jsonl (and ``timeline.png`` from its timeline.json,
    where there is one); ``best_epoch`` and ``metric`` (the score that chose it) default to summary.json's.
    ``share`` (r, n): draw only the plots i with i % n == r, so that n processes draw them side by side
    (g3-train's ranks at the end of a run).
    A plot that cannot be written raises :class:`~g3mpi.train.rundir.OutputError` naming it. Nothing is drawn
    (an empty list) for a run without a trained epoch (``--init-from --epochs 0``: one evaluation)."""
    mine = [i for i in range(len(PLOTS) + 1) if i % share[1] == share[0]]
    if not mine:
        return []
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    if not any(r.get("loss") is not None for r in records):
        return []
    if (best_epoch is None or metric is None) and (run_dir / "summary.json").is_file():
        try:
            summary = json.loads((run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            summary = {}
        summary = summary if isinstance(summary, dict) else {}
        best_epoch = summary.get("best_epoch") if best_epoch is None else best_epoch
        metric = summary.get("metric") if metric is None else metric
    if metric not in SUFFIX:
        metric = "accuracy"
    out = []
    if 0 in mine:
        out.append(_save(draw_training(records, best_epoch, metric), run_dir / PLOTS[0]))
    if 1 in mine:
        out.append(_save(draw_ranks(records), run_dir / PLOTS[1]))
    if 2 in mine and (run_dir / TIMELINE).is_file():
        with writing(run_dir / TIMELINE_PLOT, ValueError, KeyError, TypeError):   # from a file it cannot read
            fig = draw_timeline(json.loads((run_dir / TIMELINE).read_text()))
        out.append(_save(fig, run_dir / TIMELINE_PLOT))
    return out
