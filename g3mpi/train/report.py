"""Many runs side by side (``g3-report``): a table of their settings and results, and accuracy vs a setting.

A run is a g3-train run directory: its settings come from ``config.toml``, its results from ``summary.json`` (best
validation and test accuracy, best epoch, epochs) and its training time from ``metrics.jsonl`` (the sum of the
slowest rank's epoch times over every epoch, the jobs before a ``--resume`` included). A directory that is not a
run is taken as a sweep's: its sub-directories that are runs, in order of their leading index (``sweep.sbatch``
names them ``INDEX-SETTINGS``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from g3mpi.format.errors import failure_reason

from .config import ConfigError, TrainConfig, config_from
from .choices import SUFFIX
from .rundir import read_metrics

#: the settings every table shows (others only where the runs differ)
KEY_SETTINGS = ("model", "seed", "lr")
#: settings that name where a run is, not what it trains
NOT_SHOWN = ("out", "force", "progress", "plots", "log_level", "timeline_epoch")
#: the results each row ends with: column, summary.json key
RESULTS = (("val_acc", "val_acc"), ("test_acc", "test_acc"), ("best_epoch", "best_epoch"), ("epochs", "epochs"))
#: the values a plot can show: the accuracies, and the other --metric values of the runs that chose them
METRICS = ("test_acc", "val_acc", "train_acc") + tuple(f"{s}_{m}" for m in SUFFIX.values() if m != "acc"
                                                       for s in ("test", "val", "train"))


class ReportError(ValueError):
    """A run that cannot be reported (the message names the file)."""


@dataclass(frozen=True)
class Run:
    dir: Path
    config: TrainConfig
    summary: dict
    time_s: float | None    # training time, seconds (None: metrics.jsonl has no epoch times)


def _is_run(d: Path) -> bool:
    return (d / "config.toml").is_file()


def _index(d: Path) -> tuple:
    m = re.match(r"(\d+)", d.name)
    return (int(m.group(1)) if m else math.inf, d.name)


def find_runs(paths) -> list[Path]:
    """The run directories named by ``paths``: each a run, or a directory of runs (a sweep)."""
    out = []
    for p in map(Path, paths):
        if _is_run(p):
            out.append(p)
        elif p.is_dir():
            runs = sorted((d for d in p.iterdir() if d.is_dir() and _is_run(d)), key=_index)
            if not runs:
                raise ReportError(f"{p}: neither a g3-train run directory (no config.toml) nor a directory of runs")
            out += runs
        else:
            raise ReportError(f"{p}: no such run directory")
    return out


def read_run(d: Path) -> Run:
    """One run; ReportError naming the file when its config or summary is missing or unreadable."""
    try:
        cfg = config_from(str(d / "config.toml"))
    except ConfigError as e:
        raise ReportError(str(e)) from None
    path = d / "summary.json"
    if not path.is_file():
        raise ReportError(f"{path}: no such file (the run has not finished: still running, stopped or failed)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(summary, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:
        raise ReportError(f"{path}: cannot be read: {failure_reason(e)}") from None
    try:
        times = [r["epoch_time_s"] for r in read_metrics(d / "metrics.jsonl") if "epoch_time_s" in r]
    except OSError:
        times = []
    return Run(d, cfg, summary, float(sum(times)) if times else None)


def read_runs(paths, partial: bool = False) -> tuple[list[Run], list[str]]:
    """The runs of ``paths`` and, with ``partial``, the lines of those left out (unfinished, unreadable);
    without it the first such run is a ReportError."""
    runs, skipped = [], []
    for d in find_runs(paths):
        try:
            runs.append(read_run(d))
        except ReportError as e:
            if not partial:
                raise
            skipped.append(str(e))
    return runs, skipped


def setting_columns(runs: list[Run]) -> list[str]:
    """:data:`KEY_SETTINGS`, then the other settings whose values differ between the runs, in config order."""
    names = [f for f in TrainConfig.__dataclass_fields__ if f not in NOT_SHOWN and f not in KEY_SETTINGS]
    differ = [k for k in names if len({repr(getattr(r.config, k)) for r in runs}) > 1]
    return [*KEY_SETTINGS, *differ]


def _cell(v) -> str:
    if v is None:
        return "-"
    return f"{v:g}" if isinstance(v, float) else str(v)


def table(runs: list[Run]) -> list[list[str]]:
    """The header and one row per run: run directory, settings (:func:`setting_columns`), results, time."""
    cols = setting_columns(runs)
    rows = [["run", *cols, *(c for c, _ in RESULTS), "time_s"]]
    for r in runs:
        results = [r.summary.get(k) for _, k in RESULTS]
        acc = [f"{v:.4f}" if isinstance(v, float) else _cell(v) for v in results[:2]]
        rows.append([str(r.dir), *(_cell(getattr(r.config, c)) for c in cols), *acc,
                     *map(_cell, results[2:]), "-" if r.time_s is None else f"{r.time_s:.1f}"])
    return rows


def format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def plot_vs(runs: list[Run], setting: str, metric: str, path) -> Path:
    """``metric`` of every run against its ``setting`` (a point each; the mean over the runs of a value as a
    line): numbers on a numeric axis (logarithmic when they span a factor of 10 or more), other values one
    position each. Written atomically to ``path``."""
    from g3mpi.plotting import figure, legend_above
    from .plots import _save

    if setting not in TrainConfig.__dataclass_fields__:
        raise ReportError(f"--plot {setting}: not a g3-train setting")
    if metric not in METRICS:
        raise ReportError(f"--metric {metric}: one of {', '.join(METRICS)}")
    pts = [(getattr(r.config, setting), r.summary.get(metric)) for r in runs]
    pts = [(x, y) for x, y in pts if isinstance(y, (int, float)) and math.isfinite(y)]
    if not pts:
        raise ReportError(f"no run has a {metric} to plot")
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in pts)
    values = sorted({x for x, _ in pts}, key=lambda v: (v if numeric else str(v)))
    pos = {v: (v if numeric else i) for i, v in enumerate(values)}
    fig = figure(6, 4)
    ax = fig.subplots()
    h = [ax.scatter([pos[x] for x, _ in pts], [y for _, y in pts], color="C0", alpha=0.7, zorder=3,
                    label=f"one run ({len(pts)})")]
    means = [sum(y for x, y in pts if x == v) / sum(1 for x, _ in pts if x == v) for v in values]
    h += ax.plot([pos[v] for v in values], means, color="C1", marker="_", markersize=14, label="mean")
    if numeric and min(values) > 0 and max(values) >= 10 * min(values):
        ax.set_xscale("log")
    if numeric:
        ax.set_xticks([pos[v] for v in values], [_cell(v) for v in values])
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)), [str(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    ax.set_xlabel(setting)
    ax.set_ylabel(metric.replace("_acc", " accuracy"))
    legend_above(ax, h, ncol=2, title=f"{metric.replace('_acc', ' accuracy')} vs {setting}")
    return _save(fig, Path(path))
