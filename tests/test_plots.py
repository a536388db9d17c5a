"""The run directory's plots (g3mpi.train.plots) from synthetic metrics.jsonl files: what is drawn, and the odd
records a real run leaves (no evaluation yet, empty splits, a line cut short, a resume on another rank count)."""
from __future__ import annotations

import json

import matplotlib.image
import numpy as np
import pytest

from g3mpi.train.plots import PLOTS, draw_ranks, draw_training, plot_run
from g3mpi.train.rundir import read_metrics

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_legends_and_ticks_clear_of_the_data", "test_plot_run_writes_both_pngs",
              "test_records_with_values_of_other_types_are_skipped", "test_resumed_on_another_number_of_ranks",
              "test_resumed_on_fewer_ranks_shows_the_latest_ranks", "test_ranks_share_the_plots")


def record(epoch, P, acc=None, loss=None):
    r = dict(epoch=epoch, loss=loss if loss is not None else 2.0 / epoch, epoch_time_s=0.1 + 0.01 * P,
             rank_compute_s=[0.05 * (p + 1) for p in range(P)], rank_blocked_s=[0.01] * P,
             rank_allreduce_s=[0.02] * P, rank_bytes_sent=[1000 * (p + 1) for p in range(P)],
             rank_overlap=[None] + [0.5] * (P - 1))
    if acc is not None:
        r.update(train_acc=acc, val_acc=None, test_acc=acc / 2)
    return r


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_plot_run_writes_both_pngs(tmp_path):
    recs = [record(e, 3, acc=0.1 * e if e % 2 == 0 else None) for e in range(1, 9)]
    write(tmp_path / "metrics.jsonl", recs, tail='{"epoch": 9, "loss": 0.')   # a line a crash cut short
    (tmp_path / "summary.json").write_text(json.dumps(dict(best_epoch=6)))
    out = plot_run(tmp_path)
    assert [p.name for p in out] == list(PLOTS)
    for p in out:
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 600
    assert not list(tmp_path.glob(".*"))   # written atomically: no temporary left


def test_ranks_share_the_plots(tmp_path):
    """g3-train's ranks draw the plots side by side: each share is its own, and together they are all of them."""
    write(tmp_path / "metrics.jsonl", [record(e, 2) for e in (1, 2)])
    assert [p.name for p in plot_run(tmp_path, 1, share=(1, 2))] == [PLOTS[1]]
    assert plot_run(tmp_path, 1, share=(3, 4)) == []   # (no timeline.json: nothing for the fourth rank)
    assert [p.name for p in plot_run(tmp_path, 1, share=(0, 2))] == [PLOTS[0]]
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(PLOTS)


def test_what_is_drawn():
    recs = [record(e, 4, acc=0.2 if e % 2 == 0 else None) for e in range(1, 7)]
    acc_ax = draw_training(recs, best_epoch=4).axes[1]
    names = [ln.get_label() for ln in acc_ax.lines if not ln.get_label().startswith("_")]
    assert names == ["train", "test", "best validation (epoch 4)"]   # val is None everywhere (an empty split)
    assert list(acc_ax.lines[0].get_xdata()) == [2, 4, 6]
    axes = draw_ranks(recs).axes
    assert len(axes[0].patches) == 3 * 4            # compute, blocked, idle for each of 4 ranks
    heights = [b.get_height() for b in axes[0].patches[:4]]
    np.testing.assert_allclose(heights, [0.05, 0.10, 0.15, 0.20])
    np.testing.assert_allclose([b.get_height() for b in axes[2].patches], np.arange(1, 5) * 1000 / 2**20)


def test_resumed_on_another_number_of_ranks(tmp_path):
    """Epochs 1-3 on 2 ranks, 4-6 on 3 (--resume --parts): the per-rank figures are the 3 ranks'."""
    recs = [record(e, 2) for e in (1, 2, 3)] + [record(e, 3) for e in (4, 5, 6)]
    write(tmp_path / "metrics.jsonl", recs)
    assert [r["epoch"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert len(draw_ranks(recs).axes[0].patches) == 3 * 3
    assert len(plot_run(tmp_path, best_epoch=None)) == 2


def test_resumed_on_fewer_ranks_shows_the_latest_ranks():
    """Epochs 1-3 on 3 ranks, 4-7 on 2: the per-rank figures are the 2 ranks' (the latest), not the widest."""
    recs = [record(e, 3) for e in (1, 2, 3)] + [record(e, 2) for e in (4, 5, 6, 7)]
    ax = draw_ranks(recs).axes[0]
    assert len(ax.patches) == 3 * 2
    assert ax.get_legend().get_title().get_text() == "median per rank over 4 epochs"   # the legend's title


def test_force_replaces_the_plots(tmp_path):
    """--force replaces a run directory's files, the plots included: a new run with --no-plots (or one that
    fails before its end) must not keep the plots of the run it replaced; a crash's temporary plot goes too."""
    from g3mpi.train.config import TrainConfig, to_toml
    from g3mpi.train.rundir import _create_run_dir
    out = tmp_path / "run"
    out.mkdir()
    for name in (*PLOTS, "metrics.jsonl", ".training.png.abc123.tmp"):
        (out / name).write_text("old run")
    (out / "config.toml").write_text(to_toml(TrainConfig(parts=str(tmp_path), out=str(out))))
    _create_run_dir(TrainConfig(parts=str(tmp_path), out=str(out), force=True, plots=False), out)
    assert sorted(p.name for p in out.iterdir()) == ["config.toml"]


def test_force_keeps_the_files_of_a_directory_that_is_not_a_run(tmp_path):
    """--force removes the run files only in a run directory (its config.toml reads as g3-train's): a directory
    of the user's that --out named by mistake keeps its config.toml and model.pt (before, --force deleted every
    file there named like a run file). A directory with none of those names takes the run beside its files."""
    from g3mpi.train.config import TrainConfig
    from g3mpi.train.rundir import _create_run_dir
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.toml").write_text("[tool]\nname = 'mine'\n")
    (out / "model.pt").write_text("my model")
    with pytest.raises(ValueError) as e:
        _create_run_dir(TrainConfig(parts=str(tmp_path), out=str(out), force=True), out)
    assert str(e.value) == (f"{out}: not a run directory (its config.toml is not g3-train's) but holds model.pt, "
                            "config.toml: not replaced, even with --force (remove them yourself or choose another "
                            "--out)")
    assert {p.name: p.read_text() for p in out.iterdir()} == {"config.toml": "[tool]\nname = 'mine'\n",
                                                              "model.pt": "my model"}
    (out / "config.toml").unlink()
    (out / "model.pt").unlink()
    (out / "notes.txt").write_text("mine")
    _create_run_dir(TrainConfig(parts=str(tmp_path), out=str(out), force=True), out)
    assert sorted(p.name for p in out.iterdir()) == ["config.toml", "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"


def test_records_with_values_of_other_types_are_skipped(tmp_path):
    """A metrics.jsonl line whose values are not numbers (a string loss, a dict in a per-rank list) stopped the
    plots with a TypeError traceback: from python -m g3mpi.cli.plots, and at the end of every --resume of that run,
    after model.pt and before summary.json. Such lines are skipped, like a line cut short."""
    recs = [record(e, 2) for e in (1, 2, 3)]
    bad = [dict(record(4, 2), loss="1.5"), dict(record(5, 2), rank_compute_s=[{"s": 1}, 0.1])]
    write(tmp_path / "metrics.jsonl", recs + bad)
    assert [r["epoch"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    assert len(plot_run(tmp_path, best_epoch=None)) == 2


def run_records(P: int, E: int, seed: int = 0) -> list[dict]:
    """E epochs on P ranks as a run writes them: per-rank times and bytes that vary, an evaluation every
    epoch up to 100 epochs and about 100 in all beyond."""
    rng = np.random.default_rng(seed)
    every = max(1, E // 100)
    recs = []
    for e in range(1, E + 1):
        r = dict(epoch=e, loss=2.0 * np.exp(-5 * e / E) + 0.05, epoch_time_s=0.1 + 0.01 * rng.random(),
                 rank_compute_s=list(0.05 + 0.05 * rng.random(P)), rank_blocked_s=list(0.01 * rng.random(P)),
                 rank_allreduce_s=list(0.02 * rng.random(P)), rank_bytes_sent=list(1e6 * rng.random(P)),
                 rank_overlap=list(rng.random(P)))
        if e % every == 0 or e == 1:
            a = 1 - np.exp(-5 * e / E)
            r.update(train_acc=0.95 * a, val_acc=0.8 * a, test_acc=0.78 * a)
        recs.append(r)
    return recs


@pytest.mark.parametrize("P,E", [(1, 1), (2, 3), (4, 10000), (16, 200), (64, 12), (256, 40), (1024, 5)])
def test_legends_and_ticks_clear_of_the_data(P, E):
    """At 1 to 1024 ranks and 1 to 10000 epochs, in both plots: each legend lies above its panel, outside every
    panel's data area, inside the figure, clear of the titles, tick and axis labels and of the other legends;
    the rank axes show whole rank numbers inside 0..P-1 (each rank's own up to 32 ranks), the epoch axes whole
    epochs inside 0..E, and no two tick labels overlap; the figure is at most 16 inches wide; the breakdown's
    max line names the slowest rank. Before, ranks.png's breakdown legend sat inside the panel over the bars
    (rank 0's at 2 ranks, the top of the only bar at 1), training.png's over the accuracy lines and its best
    epoch label at their foot, and a run of 1 epoch had epoch ticks 0.96, 0.98, 1.00, ..."""
    from tests.plot_layout import check_legends, rendered, whole_ticks
    from g3mpi.train.plots import DPI
    recs = run_records(P, E, seed=P)
    best = max(1, E - 1)
    fig = draw_training(recs, best_epoch=best)
    ren = rendered(fig, DPI)
    legends = check_legends(fig, ren, 2)
    assert [leg.get_title().get_text() for leg in legends] == ["loss", "accuracy at each evaluation"]
    assert f"best validation (epoch {best})" in [t.get_text() for t in legends[1].get_texts()]
    for ax in fig.axes:
        ticks = whole_ticks(ax, ren)
        assert ticks and all(0 <= t <= E for t in ticks), ticks
    fig = draw_ranks(recs)
    ren = rendered(fig, DPI)
    assert fig.get_figwidth() <= 16
    legends = check_legends(fig, ren, 2)
    ax_t, ax_e, ax_b, ax_n = fig.axes
    for ax in (ax_t, ax_b, ax_n):
        ticks = whole_ticks(ax, ren)
        assert all(0 <= t <= P - 1 for t in ticks), ticks
        assert (ticks == list(range(P))) if P <= 32 else (len(ticks) >= 4), ticks
    ticks = whole_ticks(ax_e, ren)
    assert ticks and all(0 <= t <= E for t in ticks), ticks
    comp, blocked, idle = (np.median([r[k] for r in recs], axis=0)
                           for k in ("rank_compute_s", "rank_blocked_s", "rank_allreduce_s"))
    worst = int(np.argmax(comp + blocked + idle))
    assert any(t.get_text().endswith(f"(rank {worst})") for t in legends[0].get_texts()), worst


def test_chosen_metric_drawn_with_the_marker_that_follows_it():
    """--metric roc_auc: training.png draws the ROC-AUC that chose the best epoch, and the accuracies beside it
    (before, only the accuracies, under a marker that followed ROC-AUC)."""
    recs = [dict(record(e, 2), train_acc=0.5, val_acc=0.4, test_acc=0.45, train_roc_auc=0.7, val_roc_auc=0.6,
                 test_roc_auc=0.65) for e in range(1, 5)]
    ax = draw_training(recs, best_epoch=3, metric="roc_auc").axes[1]
    names = [ln.get_label() for ln in ax.lines if not ln.get_label().startswith("_")]
    assert names == ["train roc_auc", "val roc_auc", "test roc_auc", "train accuracy", "val accuracy",
                     "test accuracy", "best validation roc_auc (epoch 3)"]
    assert list(ax.lines[1].get_ydata()) == [0.6] * 4


def test_warm_up_epoch_does_not_squash_the_epoch_panel():
    recs = [record(e, 2) for e in range(1, 6)]
    recs[0]["epoch_time_s"] = 30.0   # the first epoch: allocations, first touches
    ax_e = draw_ranks(recs).axes[1]
    assert list(ax_e.lines[0].get_xdata()) == [2, 3, 4, 5] and max(ax_e.lines[0].get_ydata()) < 1
    assert "warm-up" in ax_e.get_title()


def test_timeline_phases_have_their_own_colours_and_words():
    from matplotlib.colors import to_hex

    from g3mpi.comm.timeline import PHASE_LABELS
    from g3mpi.plotting import _timeline_color, _timeline_label
    labels = list(PHASE_LABELS.values())
    colours = {to_hex(_timeline_color(lb, ["gcn1 fwd"], ["gcn1 bwd"])) for lb in labels + ["gcn1 fwd", "gcn1 bwd"]}
    assert len(colours) == len(labels) + 2
    words = [_timeline_label(lb) for lb in labels]
    assert not any("idle" in w or w.startswith("compute:") for w in words), words
    assert _timeline_label("gcn1 fwd") == "compute: gcn1 fwd"
