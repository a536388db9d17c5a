"""g3-sweep's grids (the cartesian product, element by element) and g3-report's table and plot, on run
directories written here; the array job itself runs in tests/test_slurm_requeue.py. The command lines run
in-process (``main``), one of each also as a process."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_module
from g3mpi.cli import report, sweep as sweep_cli
from g3mpi.train.config import TrainConfig, to_toml
from g3mpi.train.sweep import GridError, read_grid

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_report_bad_inputs_are_one_line", "test_report_tables_a_sweep_and_plots_accuracy_vs_a_setting",
              "test_sweep_cli_prints_an_element")

GRID = """model = ["gcn", "sage"]
seed = [0, 1, 2]
lr = [0.01, 0.005]
epochs = 100
weight-decay = 0
plots = false
parts = "/data/parts-4"
"""


def test_grid_is_the_cartesian_product_in_file_order(tmp_path):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    grid = read_grid(path)
    assert grid.size == 12 and list(grid.dims) == ["model", "seed", "lr"]
    combos = [grid.combination(i) for i in range(12)]
    assert [(c["model"], c["seed"], c["lr"]) for c in combos[:3]] == [("gcn", 0, 0.01), ("gcn", 0, 0.005),
                                                                     ("gcn", 1, 0.01)]
    assert len({(c["model"], c["seed"], c["lr"]) for c in combos}) == 12
    assert all(c["epochs"] == 100 and c["weight_decay"] == 0.0 and c["plots"] is False for c in combos)
    assert grid.name(11) == "11-model-sage_seed-2_lr-0.005"
    args = grid.arguments(11)
    assert args[args.index("--weight-decay") + 1] == "0.0" and "--no-plots" in args
    assert args[-6:] == ["--model", "sage", "--seed", "2", "--lr", "0.005"]
    assert args[args.index("--parts") + 1] == "/data/parts-4"
    with pytest.raises(GridError, match=r"no combination 12: the grid has 12 .*--array=0-11"):
        grid.combination(12)


@pytest.mark.parametrize("text, message", [
    ("lr = [0.01,", "not valid TOML"),
    ("learning_rate = [0.1]", "unknown setting 'learning_rate'"),
    ("out = ['a', 'b']", "out cannot be part of a grid"),
    ("seed = []", "seed is an empty list"),
    ("lr = [0.1, 'fast']", "lr must be of type float"),
    ("seed = [1, 1]", "seed lists a value twice"),
    ("model = 'gcn'\ndropout = [0.5, 1.5]", r"combination 1 \(1-dropout-1.5\): dropout must be in \[0, 1\)"),
])
def test_bad_grids_are_one_line_naming_the_file(tmp_path, capsys, text, message):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(GridError, match=message):
        read_grid(path)
    p = _main(capsys, sweep_cli, "size", path)
    assert p.returncode == 1 and p.stdout == ""
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith(f"g3-sweep: error: {path}: "), p.stderr


def test_sweep_cli_prints_an_element(tmp_path, capsys):
    path = tmp_path / "grid.toml"
    path.write_text(GRID)
    assert run_module("g3mpi.cli.sweep", "size", path).stdout == "12\n"   # as a process, once
    lines = _main(capsys, sweep_cli, "args", path, 4).stdout.splitlines()
    assert lines[0] == "4-model-gcn_seed-2_lr-0.01" and lines[-2:] == ["--lr", "0.01"]
    listed = _main(capsys, sweep_cli, "list", path).stdout.splitlines()
    assert len(listed) == 12 and listed[4].startswith("4 4-model-gcn_seed-2_lr-0.01 --epochs 100")
    p = _main(capsys, sweep_cli, "size", tmp_path / "none.toml")
    assert p.returncode == 1 and p.stderr == f"g3-sweep: error: {tmp_path / 'none.toml'}: no such grid file\n"


def _run(d, summary: dict | None, epoch_times=(0.5, 0.25), **settings):
    d.mkdir(parents=True)
    (d / "config.toml").write_text(to_toml(TrainConfig(parts="/p", out=str(d), **settings)))
    (d / "metrics.jsonl").write_text("".join(json.dumps(dict(epoch=i + 1, epoch_time_s=t)) + "\n"
                                             for i, t in enumerate(epoch_times)))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


def _summary(test, val=0.7, epochs=2, best=1):
    return dict(test_acc=test, val_acc=val, epochs=epochs, best_epoch=best)


def test_report_tables_a_sweep_and_plots_accuracy_vs_a_setting(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _run(sweep / "0-lr-0.1", _summary(0.8125), lr=0.1)
    _run(sweep / "10-lr-0.01", _summary(0.75, epochs=30, best=12), epoch_times=(1.0,) * 30, lr=0.01, seed=1)
    _run(sweep / "2-lr-0.001", _summary(0.5), lr=0.001, hidden=32)
    plot = tmp_path / "acc.png"
    p = _main(capsys, report, sweep, "--plot", "lr", "--plot-out", plot)
    rows = [line.split() for line in p.stdout.splitlines()]
    assert rows[0] == ["run", "model", "seed", "lr", "hidden", "val_acc", "test_acc", "best_epoch", "epochs",
                       "time_s"]
    # in the order of the leading index; the settings that differ (hidden) beside model, seed and lr
    assert rows[1] == [str(sweep / "0-lr-0.1"), "gcn", "0", "0.1", "16", "0.7000", "0.8125", "1", "2", "0.8"]
    assert rows[2][0].endswith("2-lr-0.001") and rows[2][3:5] == ["0.001", "32"]
    assert rows[3][0].endswith("10-lr-0.01") and rows[3][2] == "1" and rows[3][-3:] == ["12", "30", "30.0"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stderr.strip() == str(plot)
    p = _main(capsys, report, sweep / "0-lr-0.1", "--plot", "model", "--metric", "val_acc",
                   "--plot-out", tmp_path / "by-model.png")
    assert len(p.stdout.splitlines()) == 2 and (tmp_path / "by-model.png").exists()


def test_report_bad_inputs_are_one_line(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    _run(sweep / "0-a", _summary(0.8))
    _run(sweep / "1-b", None)
    p = run_module("g3mpi.cli.report", sweep, check=False)   # as a process, once
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == (f"g3-report: error: {sweep / '1-b' / 'summary.json'}: no such file (the run has not "
                        "finished: still running, stopped or failed)\n")
    p = _main(capsys, report, sweep, "--partial")
    assert len(p.stdout.splitlines()) == 2 and p.stderr.startswith("g3-report: warning: left out: ")
    (sweep / "0-a" / "summary.json").write_text("{not json")
    p = _main(capsys, report, sweep / "0-a")
    assert p.returncode == 1 and p.stderr.startswith(f"g3-report: error: {sweep / '0-a' / 'summary.json'}: cannot "
                                                     "be read: ") and len(p.stderr.splitlines()) == 1
    (tmp_path / "empty").mkdir()
    p = _main(capsys, report, tmp_path / "empty")
    assert p.returncode == 1 and p.stderr == (f"g3-report: error: {tmp_path / 'empty'}: neither a g3-train run "
                                              "directory (no config.toml) nor a directory of runs\n")
    p = _main(capsys, report, tmp_path / "none")
    assert p.returncode == 1 and p.stderr == f"g3-report: error: {tmp_path / 'none'}: no such run directory\n"
    (sweep / "0-a" / "config.toml").write_text("model = [")
    p = _main(capsys, report, sweep / "0-a")
    assert p.returncode == 1 and p.stderr.startswith(f"g3-report: error: {sweep / '0-a' / 'config.toml'}: not valid")
    p = _main(capsys, report, sweep / "1-b", "--partial")
    assert p.returncode == 1 and p.stderr.splitlines()[-1] == "g3-report: error: no finished run to report"


class Result:
    def __init__(self, returncode, out, err):
        self.returncode, self.stdout, self.stderr = returncode, out, err


def _main(capsys, cli, *args) -> Result:
    """The command line's ``main`` in this process: its status and what it printed."""
    capsys.readouterr()
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return Result(rc, out, err)
