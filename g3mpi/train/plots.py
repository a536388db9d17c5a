"""The run directory's plots, drawn from ``metrics.jsonl`` (rank 0 at the end of a run, or on demand).

    python -m g3mpi.cli.plots RUN          # (re)draw RUN/training.png and RUN/ranks.png

``training.png``: the loss per epoch and the train / validation / test accuracies at each evaluation, the
best-validation epoch (the one ``model.pt`` and ``predictions.h5`` come from) marked. ``ranks.png``: where each
rank's epoch time goes (median over the epochs of compute, time blocked on halo messages, idle at the gradient
allreduce), the epoch time over the run (slowest rank) and the bytes each rank sends per epoch: the partition's
balance and the schedule's overlap at a glance. Both are pure functions of ``metrics.jsonl``, written
atomically; redrawing while a job runs shows the epochs so far.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np

from g3mpi.format import atomic_file
from g3mpi.plotting import figure, rank_breakdown

from .rundir import ACCURACY_KEYS, read_metrics, writing

#: the files :func:`plot_run` writes into the run directory
PLOTS = ("training.png", "ranks.png")
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


def draw_training(records: list[dict], best_epoch: int | None):
    fig = figure(10, 3.8)
    ax_loss, ax_acc = fig.subplots(1, 2)
    ep = [r["epoch"] for r in records if r.get("loss") is not None]
    loss = [r["loss"] for r in records if r.get("loss") is not None]
    ax_loss.plot(ep, loss, color="C0")
    if loss and min(loss) > 0 and max(loss) > 10 * min(loss):   # a loss that falls by decades
        ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("training loss")
    ax_loss.set_title("loss", fontsize=10)
    for i, key in enumerate(ACCURACY_KEYS):
        pts = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
        if pts:
            e, a = zip(*pts)
            ax_acc.plot(e, a, marker="." if len(pts) < 50 else None, color=f"C{i}", label=key.split("_")[0])
    if best_epoch:
        for ax in (ax_loss, ax_acc):
            ax.axvline(best_epoch, color="grey", linestyle="--", linewidth=1)
        last = max((r["epoch"] for r in records), default=best_epoch)
        right = best_epoch > last / 2   # the label on the side with room, inside the axes
        ax_acc.text(best_epoch, 0.02, f" best (epoch {best_epoch}) ", fontsize=8, color="grey",
                    ha="right" if right else "left")
    ax_acc.set_ylim(0, 1)
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_title("accuracy at each evaluation", fontsize=10)
    if ax_acc.get_legend_handles_labels()[0]:   # (the best epoch's line has no label)
        ax_acc.legend(fontsize=8)
    return fig


def draw_ranks(records: list[dict]):
    comp = _median_per_rank(records, "rank_compute_s")
    blocked = _median_per_rank(records, "rank_blocked_s")
    idle = _median_per_rank(records, "rank_allreduce_s")
    sent = _median_per_rank(records, "rank_bytes_sent")
    P = len(comp)
    fig = figure(min(16, 10 + P / 16), 7)
    (ax_t, ax_e), (ax_b, ax_n) = fig.subplots(2, 2)
    rank_breakdown(ax_t, comp, blocked, idle,
                   f"median per rank over {len(_latest_ranks(records, 'rank_compute_s'))} epochs")
    ep = [r["epoch"] for r in records if r.get("epoch_time_s") is not None]
    ax_e.plot(ep, [r["epoch_time_s"] for r in records if r.get("epoch_time_s") is not None], color="C0")
    ax_e.set_xlabel("epoch")
    ax_e.set_ylabel("seconds")
    ax_e.set_title("epoch time (slowest rank)", fontsize=9)
    r = np.arange(P)
    ax_b.bar(r, sent / 2**20, color="C4")
    if P <= 32:
        ax_b.set_xticks(r, [str(i) for i in r])
    ax_b.set_xlabel("rank")
    ax_b.set_ylabel("MiB sent per epoch (median)")
    ax_b.set_title("halo bytes sent", fontsize=9)
    ov = _median_per_rank(records, "rank_overlap")
    ax_n.bar(r, np.nan_to_num(ov) if len(ov) else np.zeros(P), color="C2")
    if P <= 32:
        ax_n.set_xticks(r, [str(i) for i in r])
    ax_n.set_ylim(0, 1)
    ax_n.set_xlabel("rank")
    ax_n.set_ylabel("overlap (median)")
    ax_n.set_title("overlap = 1 - blocked / communication time", fontsize=9)
    return fig


def _save(fig, path: Path) -> Path:
    with writing(path, ValueError, RuntimeError), atomic_file(path, force=True) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI)
    return path


def plot_run(run_dir, best_epoch: int | None = None) -> list[Path]:
    """Draw :data:`PLOTS` into ``run_dir`` from its metrics.jsonl; ``best_epoch`` defaults to summary.json's.
    A plot that cannot be written raises :class:`~g3mpi.train.rundir.OutputError` naming it. Nothing is drawn
    (an empty list) for a run without a trained epoch (``--init-from --epochs 0``: one evaluation)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    if not any(r.get("loss") is not None for r in records):
        return []
    if best_epoch is None and (run_dir / "summary.json").is_file():
        try:
            best_epoch = json.loads((run_dir / "summary.json").read_text()).get("best_epoch")
        except (OSError, ValueError):
            best_epoch = None
    return [_save(draw_training(records, best_epoch), run_dir / PLOTS[0]),
            _save(draw_ranks(records), run_dir / PLOTS[1])]
