"""g3-train end to end: run directory contents, P-independence of the trained model, Cora, clear errors."""
from __future__ import annotations

import json
import os
import re
import time
import tomllib
from pathlib import Path

import h5py
import matplotlib.image
import numpy as np
import pytest
import torch

from tests.conftest import run_module, run_mpi
from tests.job_report import one_error
from data_tools.build import write_partition
from g3mpi.format import Graph
from tests.graphs import cora_graph, csr_from_edges, partition, random_graph

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_a_model_too_big_for_memory", "test_bad_command_line", "test_bad_config",
              "test_bad_configuration_does_not_wait_for_a_rank_that_never_checks",
              "test_bad_configuration_on_one_rank_stops_every_rank", "test_config_that_cannot_be_read",
              "test_cora_end_to_end", "test_corrupt_part_on_one_rank", "test_empty_paths_are_refused",
              "test_gat_with_a_repeated_edge_as_a_whole_neighbour_block",
              "test_init_from_evaluates_and_fine_tunes_on_any_partition", "test_init_from_refuses_what_does_not_fit",
              "test_no_plots_then_plots_on_demand", "test_nocomm_is_exact_on_one_rank",
              "test_patience_counts_evaluations_without_a_better_validation_accuracy",
              "test_resume_with_settings_without_effect_warns_and_goes_on",
              "test_resumed_run_warns_only_about_its_own_command_line", "test_run_directory",
              "test_same_model_for_any_P", "test_saved_config_never_forces_and_on_off_settings_undo_both_ways",
              "test_settings_without_effect_warn_on_rank_0_and_change_nothing", "test_wrong_number_of_ranks")

MOD = "g3mpi.cli.train"


@pytest.fixture(scope="module")
def small_parts(tmp_path_factory):
    g = random_graph(n=200, f=8, c=4, seed=3)
    root = tmp_path_factory.mktemp("parts")
    for P in (1, 2, 4):
        partition(g, P, root / f"p{P}", seed=P)
    return g, root


def train(P, parts, out, *extra, check=True):
    return run_mpi(P, MOD, "--parts", parts, "--out", out, "--no-progress", *extra, check=check)


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_same_model_for_any_P(model, small_parts, tmp_path):
    g, root = small_parts
    args = ["--model", model, "--epochs", "12", "--dropout", "0.5", "--seed", "7", "--eval-every", "3",
            "--hidden", "8"]
    if model == "gat":
        args += ["--heads", "2", "--attn-dropout", "0.4", "--activation", "elu"]
    train(1, root / "p1", tmp_path / "r1", *args)
    train(4, root / "p4", tmp_path / "r4", *args)
    a = torch.load(tmp_path / "r1" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "r4" / "model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.linalg.norm(a[k] - b[k]) <= 1e-4 * torch.linalg.norm(a[k]), k
    with h5py.File(tmp_path / "r1" / "predictions.h5") as f1, h5py.File(tmp_path / "r4" / "predictions.h5") as f4:
        np.testing.assert_allclose(f4["logits"][:], f1["logits"][:], rtol=1e-4, atol=1e-5)
        assert np.array_equal(f1["pred"][:], f4["pred"][:])
    s1 = json.loads((tmp_path / "r1" / "summary.json").read_text())
    s4 = json.loads((tmp_path / "r4" / "summary.json").read_text())
    assert s1["best_epoch"] == s4["best_epoch"] and s1["test_acc"] == s4["test_acc"]


def test_gat_with_a_repeated_edge_as_a_whole_neighbour_block(tmp_path):
    """Node 3's only in-edges are two copies of 2 -> 3, and node 2 is on the other rank: its block for that
    neighbour is 1 x 1 with 2 entries, which torch's sampled_addmm refused (the backward crashed on P = 2)."""
    src, dst = np.array([0, 1, 2, 2, 3, 4]), np.array([1, 0, 3, 3, 2, 0])
    indptr, indices = csr_from_edges(src, dst, 5)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    g = Graph(indptr, indices, x, np.array([0, 1, 0, 1, 0]), np.array([1, 1, 0, 1, 0], bool),
              np.array([0, 0, 1, 0, 0], bool), np.array([0, 0, 0, 0, 1], bool), dict(num_classes=2, source="dup"))
    write_partition(g, np.zeros(5, np.int64), 1, tmp_path / "p1", method="random", seed=0, force=True)
    write_partition(g, np.array([0, 0, 0, 1, 0]), 2, tmp_path / "p2", method="random", seed=0, force=True)
    args = ["--model", "gat", "--epochs", "3", "--hidden", "4", "--heads", "2", "--dropout", "0.2",
            "--attn-dropout", "0.3", "--no-plots"]
    train(1, tmp_path / "p1", tmp_path / "r1", *args)
    train(2, tmp_path / "p2", tmp_path / "r2", *args)
    a = torch.load(tmp_path / "r1" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "r2" / "model.pt", weights_only=True)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)


def test_run_directory(small_parts, tmp_path):
    g, root = small_parts
    out = tmp_path / "run"
    train(2, root / "p2", out, "--model", "sage", "--epochs", "5", "--eval-every", "2", "--lr", "0.02")
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.jsonl", "model.pt",
                                                     "predictions.h5", "ranks.png", "summary.json", "timeline.json",
                                                     "timeline.png", "training.png"]
    for name in ("ranks.png", "training.png", "timeline.png"):
        assert matplotlib.image.imread(out / name).ndim == 3, name
    cfg = tomllib.loads((out / "config.toml").read_text())
    assert cfg["model"] == "sage" and cfg["epochs"] == 5 and cfg["lr"] == 0.02
    assert cfg["parts"] == str((root / "p2").resolve())   # absolute: --resume works from any directory
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2, 3, 4, 5]
    assert "val_acc" in lines[1] and "val_acc" not in lines[0] and "val_acc" in lines[4]
    for r in lines:
        assert len(r["rank_compute_s"]) == 2 and len(r["rank_bytes_sent"]) == 2
        assert r["bytes_sent"] == sum(r["rank_bytes_sent"]) > 0
    s = json.loads((out / "summary.json").read_text())
    for k in ("model", "world_size", "epochs", "best_epoch", "train_acc", "val_acc", "test_acc",
              "epoch_time_median_s", "bytes_sent_per_epoch", "peak_rss_bytes_max"):
        assert s[k] is not None, k
    assert s["world_size"] == 2 and s["epochs"] == 5 and s["valid"] is True
    assert len(s["rank_peak_rss_bytes"]) == 2 and max(s["rank_peak_rss_bytes"]) == s["peak_rss_bytes_max"] > 0
    # where the start-up and the shut-down went, phase by phase (the slowest rank's; rank 0's writing the outputs)
    for phases, names in ((s["startup"], {"interpreter", "mpi init", "imports", "part files", "trainer"}),
                          (s["shutdown"], {"predictions", "model"})):
        assert names <= set(phases) and all(v >= 0 for v in phases.values()), phases
        assert phases["total"] == pytest.approx(sum(v for k, v in phases.items() if k != "total"), abs=0.01)
    with h5py.File(out / "predictions.h5") as f:
        lg, pred = f["logits"][:], f["pred"][:]
    assert lg.shape == (g.num_nodes, 4) and np.isfinite(lg).all()
    assert np.array_equal(pred, lg.argmax(1))
    # the summary's accuracies are the best model's predictions scored on each split of the whole graph (a mutation
    # that scored every split on the training nodes survived every test that compared runs with each other)
    for split in ("train", "val", "test"):
        mask = getattr(g, f"{split}_mask")
        assert mask.sum() > 0 and s[f"{split}_acc"] == pytest.approx((pred[mask] == g.labels[mask]).mean(), rel=1e-12)
    state = torch.load(out / "model.pt", weights_only=True)
    assert set(state) == {"convs.0.lin_l.weight", "convs.0.lin_l.bias", "convs.0.lin_r.weight",
                          "convs.1.lin_l.weight", "convs.1.lin_l.bias", "convs.1.lin_r.weight"}
    # the saved config reproduces the run (its run directory created with its missing parent)
    again = train(2, root / "p2", tmp_path / "runs" / "again", "--config", out / "config.toml", "--force")
    assert again.returncode == 0
    with h5py.File(tmp_path / "runs" / "again" / "predictions.h5") as f:
        np.testing.assert_array_equal(f["logits"][:], lg)
    # an existing run directory is not replaced without --force
    p = train(2, root / "p2", out, "--epochs", "1", check=False)
    assert p.returncode != 0 and "exists" in p.stderr


def test_nocomm_is_exact_on_one_rank(small_parts, tmp_path):
    """On one rank there is no halo for the nocomm schedule to skip: its run is the pipelined run, bit for bit,
    and its summary says valid (it said "schedule nocomm skips the halo exchange: timings only, results are
    wrong"). On two ranks it still says invalid."""
    g, root = small_parts
    args = ["--epochs", "6", "--eval-every", "2", "--dropout", "0.5", "--seed", "3", "--no-plots"]
    train(1, root / "p1", tmp_path / "pipelined", *args)
    train(1, root / "p1", tmp_path / "nocomm", *args, "--schedule", "nocomm")
    a = torch.load(tmp_path / "pipelined" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "nocomm" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with h5py.File(tmp_path / "pipelined" / "predictions.h5") as fa, h5py.File(tmp_path / "nocomm" /
                                                                               "predictions.h5") as fb:
        assert np.array_equal(fa["logits"][:], fb["logits"][:]) and np.array_equal(fa["pred"][:], fb["pred"][:])
    results = ("epochs", "best_epoch", "train_acc", "val_acc", "test_acc", "final_loss", "split_sizes", "valid")
    sa, sb = (json.loads((tmp_path / r / "summary.json").read_text()) for r in ("pipelined", "nocomm"))
    assert {k: sb[k] for k in results} == {k: sa[k] for k in results} and sa["valid"] is True
    assert "invalid_reason" not in sb and sb["schedule"] == "nocomm"
    losses = [[json.loads(x).get("loss") for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
              for r in ("pipelined", "nocomm")]
    assert losses[0] == losses[1] and len(losses[0]) == 6
    train(2, root / "p2", tmp_path / "nocomm2", *args, "--schedule", "nocomm")
    s2 = json.loads((tmp_path / "nocomm2" / "summary.json").read_text())
    assert (s2["valid"], s2["invalid_reason"]) == (False, "schedule nocomm skips the halo exchange: timings only, "
                                                          "results are wrong")


def test_saved_config_never_forces_and_on_off_settings_undo_both_ways(small_parts, tmp_path):
    """RUN/config.toml saves force off, so a rerun with --config RUN/config.toml --out OTHER refuses an existing
    OTHER unless told (before, a run made with --force saved force = true and the rerun silently replaced
    OTHER); every on/off setting of a config file can be undone on the command line (--plots after a config's
    plots = false; before, only --no-plots existed)."""
    _, root = small_parts
    first, other = tmp_path / "first", tmp_path / "other"
    train(1, root / "p1", first, "--epochs", "1", "--no-plots", "--force")
    saved = tomllib.loads((first / "config.toml").read_text())
    assert saved["force"] is False and saved["plots"] is False
    # nor is the run itself replaced by a rerun of its own config.toml (whose out is the run)
    model = (first / "model.pt").read_bytes()
    p = run_mpi(1, MOD, "--config", first / "config.toml", "--epochs", "2", "--no-progress", check=False)
    assert p.returncode != 0 and "exists" in p.stderr and (first / "model.pt").read_bytes() == model
    train(1, root / "p1", other, "--config", first / "config.toml", "--epochs", "1", "--plots")
    assert sorted(x.name for x in other.glob("*.png")) == ["ranks.png", "timeline.png", "training.png"]
    p = train(1, root / "p1", other, "--config", first / "config.toml", check=False)
    assert p.returncode != 0 and "run directory exists and is not empty (use --force" in p.stderr
    assert (other / "ranks.png").exists()
    train(1, root / "p1", other, "--config", first / "config.toml", "--force", "--no-verify")
    assert not list(other.glob("*.png"))


def test_no_plots_then_plots_on_demand(small_parts, tmp_path):
    _, root = small_parts
    out = tmp_path / "run"
    train(2, root / "p2", out, "--epochs", "3", "--no-plots")
    assert not list(out.glob("*.png"))
    p = run_module("g3mpi.cli.plots", out)
    assert sorted(Path(x).name for x in p.stdout.split()) == ["ranks.png", "timeline.png", "training.png"]
    assert all(matplotlib.image.imread(out / n).ndim == 3 for n in ("ranks.png", "training.png", "timeline.png"))
    p = run_module("g3mpi.cli.plots", tmp_path / "nowhere", check=False)
    assert p.returncode == 1 and "nowhere/metrics.jsonl: no such file" in p.stderr


def test_wrong_number_of_ranks(small_parts, tmp_path):
    _, root = small_parts
    p = run_mpi(2, MOD, "--parts", root / "p4", "--out", tmp_path / "run", check=False, timeout=120)
    assert p.returncode != 0
    assert "4 parts but 2 ranks were started" in one_error(p.stderr, "g3-train", "ranks 0-1")
    assert not (tmp_path / "run").exists()
    p = run_mpi(1, MOD, "--parts", root / "p4", "--out", tmp_path / "run", check=False, timeout=120)
    assert p.returncode != 0 and "4 parts but 1 rank was started (run with mpiexec -n 4)" in p.stderr, p.stderr
    assert not (tmp_path / "run").exists()


def test_corrupt_part_on_one_rank(small_parts, tmp_path):
    import shutil
    _, root = small_parts
    bad = tmp_path / "p2"
    shutil.copytree(root / "p2", bad)
    with open(bad / "part-00001.h5", "r+b") as f:
        f.seek(-100, 2)
        f.write(b"\0" * 50)
    p = run_mpi(2, MOD, "--parts", bad, "--out", tmp_path / "run", check=False, timeout=120)
    assert p.returncode != 0
    err = one_error(p.stderr, "g3-train", "rank 1")
    assert "part-00001.h5" in err and "checksum" in err
    assert not (tmp_path / "run").exists()


def test_a_model_too_big_for_memory(small_parts, tmp_path):
    """One line per rank naming the model and the allocation, not a traceback, and no run directory."""
    _, root = small_parts
    p = run_mpi(2, MOD, "--parts", root / "p2", "--out", tmp_path / "run", "--hidden", str(10**11), check=False,
                timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert re.search(r"\[rank \d\] setting up training ran out of memory \(--model gcn --layers 2 --hidden "
                     r"100000000000, 4 classes, \d+ owned and \d+ halo nodes of 8 features on this rank\): "
                     r"RuntimeError: .*can't allocate memory", p.stderr), p.stderr
    assert not (tmp_path / "run").exists()


def test_bad_config(small_parts, tmp_path):
    _, root = small_parts
    (tmp_path / "c.toml").write_text('model = "gcn"\nbogus = 1\n')
    p = run_mpi(1, MOD, "--parts", root / "p1", "--out", tmp_path / "run", "--config", tmp_path / "c.toml",
                check=False)
    assert p.returncode != 0 and "bogus" in p.stderr
    p = run_mpi(1, MOD, "--parts", root / "p1", "--out", tmp_path / "run", "--dropout", "1.5", check=False)
    assert p.returncode != 0 and "dropout" in p.stderr


def test_resumed_run_warns_only_about_its_own_command_line(small_parts, tmp_path):
    """RUN/config.toml is g3-train's record, not the user's choice: --resume does not warn again about the
    settings of the run it continues, only about what its own command line gives. The input cache is idle where
    the first layer multiplies by its weight first (8 features, 4 hidden channels)."""
    _, root = small_parts

    def warnings(p):
        return [x.split(" WARNING g3mpi: ")[1] for x in p.stderr.splitlines() if " WARNING " in x]
    p = train(1, root / "p1", tmp_path / "r", "--epochs", "1", "--hidden", "4", "--heads", "4", "--no-input-cache",
              "--no-plots")
    assert warnings(p) == [
        "command line: --heads 4 has no effect: the model is gcn, and attention heads are GAT's",
        "command line: --no-input-cache has no effect: there is no parameter-free product of the input to keep: the "
        "first layer has more input features than outputs, so it multiplies by its weight before it aggregates"]
    p = run_mpi(1, MOD, "--resume", tmp_path / "r", "--epochs", "2", "--force", "--no-progress")
    assert warnings(p) == ["command line: --force has no effect: a resumed run continues in its run directory: "
                           "nothing is replaced"], p.stderr


def test_resume_with_settings_without_effect_warns_and_goes_on(small_parts, tmp_path):
    """--resume with a setting that differs from the run's but has no effect on it (heads, out_heads and
    attn_dropout for GCN, momentum with Adam, activation with one layer) gets the warning any run gets for it, one
    line on rank 0, and the run goes on, computing what it computes without them (it was refused as an
    "incompatible configuration"); a setting that would change the model or the results is still refused, named
    alone. A value that differs from the run's is named even at its default (--heads 8 after --heads 4)."""
    import shutil
    _, root = small_parts

    def warnings(p):
        return [x.split(" WARNING g3mpi: ")[1] for x in p.stderr.splitlines() if " WARNING " in x]
    train(2, root / "p2", tmp_path / "a", "--epochs", "2", "--heads", "4", "--no-plots")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    run_mpi(2, MOD, "--resume", tmp_path / "a", "--epochs", "4", "--no-progress")
    p = run_mpi(2, MOD, "--resume", tmp_path / "b", "--epochs", "4", "--no-progress", "--heads", "8", "--out-heads",
                "2", "--attn-dropout", "0.3", "--momentum", "0.9")
    gcn = "the model is gcn, and attention"
    assert warnings(p) == [f"command line: --heads 8 has no effect: {gcn} heads are GAT's",
                           f"command line: --out-heads 2 has no effect: {gcn} heads are GAT's",
                           f"command line: --attn-dropout 0.3 has no effect: {gcn} dropout is GAT's",
                           "command line: --momentum 0.9 has no effect: the optimizer is adam, and momentum is SGD's "
                           "(optimizer sgd)"], p.stderr
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [[json.loads(x)["loss"] for x in (tmp_path / r / "metrics.jsonl").read_text().splitlines()]
              for r in "ab"]
    assert losses[0] == losses[1] and len(losses[0]) == 4
    assert tomllib.loads((tmp_path / "b" / "config.toml").read_text())["heads"] == 8
    before = (tmp_path / "c" / "checkpoint.pt").read_bytes()
    p = run_mpi(2, MOD, "--resume", tmp_path / "c", "--epochs", "4", "--no-progress", "--heads", "8", "--dropout",
                "0.1", "--hidden", "4", check=False)
    assert p.returncode != 0 and warnings(p) == []
    assert one_error(p.stderr, "g3-train", "ranks 0-1") == (
        f"{tmp_path / 'c' / 'checkpoint.pt'}: incompatible configuration: hidden = 16 in the checkpoint but 4 now; "
        "dropout = 0.5 in the checkpoint but 0.1 now"), p.stderr
    assert (tmp_path / "c" / "checkpoint.pt").read_bytes() == before


def test_config_that_cannot_be_read(small_parts, tmp_path):
    """The job names the file in one line, every rank exits 2, before any run directory: a directory, and a file whose
    read fails (/proc/self/mem: EIO, even for root; it was a traceback on every rank)."""
    _, root = small_parts
    (tmp_path / "dir.toml").mkdir()
    for path, what in [(tmp_path / "dir.toml", "is a directory, not a config file"),
                       ("/proc/self/mem", "cannot be read: Input/output error")]:
        p = run_mpi(2, MOD, "--parts", root / "p2", "--out", tmp_path / "run", "--config", path, check=False)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert one_error(p.stderr, "g3-train", "ranks 0-1") == f"{path}: {what}", p.stderr
        assert not (tmp_path / "run").exists()


def test_bad_command_line(small_parts, tmp_path):
    """A value of the wrong type or an unknown option: one line for the job naming it and the ranks, exit status 2
    (it was argparse's 16-line usage on every rank, and a line without the rank)."""
    _, root = small_parts
    for bad, what in [(["--epochs", "ten"], "argument --epochs: invalid int value: 'ten'"),
                      (["--hiden", "64"], "unrecognized arguments: --hiden 64 (did you mean '--hidden'?)")]:
        p = run_mpi(2, MOD, "--parts", root / "p2", "--out", tmp_path / "run", *bad, check=False)
        assert p.returncode == 2 and "usage:" not in p.stderr, p.stderr
        assert one_error(p.stderr, "g3-train", "ranks 0-1") == f"{what} (g3-train --help lists the options)"
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["cli", "config"])
def test_bad_configuration_on_one_rank_stops_every_rank(case, small_parts, tmp_path):
    """Rank 1 alone has a bad command line or config file (tests/mpi_config_check.py; mpiexec gives every rank the
    same): rank 0, which read its own and went on to the ranks' configuration check, says rank 1's error for the
    job; both exit 2 there, without waiting for a deadline, before any run directory."""
    _, root = small_parts
    p = run_mpi(2, "tests.mpi_config_check", case, root / "p2", tmp_path / "run", check=False, timeout=120)
    assert p.returncode == 2 and "timeout" not in p.stderr, p.stderr
    what = ("argument --epochs: invalid int value: 'ten' (g3-train --help lists the options)" if case == "cli"
            else "/nonexistent/g3-config.toml: ")
    assert one_error(p.stderr, "g3-train", "rank 1").startswith(what), p.stderr
    assert not (tmp_path / "run").exists()


def test_bad_configuration_does_not_wait_for_a_rank_that_never_checks(small_parts, tmp_path):
    """Rank 1's command line is bad and rank 0 never reaches the configuration check (it sleeps 120 s): rank 1
    waits the check's limit (2 s here) and ends the job alone, with status 2, its error and a line saying why."""
    _, root = small_parts
    t0 = time.monotonic()
    p = run_mpi(2, "tests.mpi_config_check", "absent", root / "p2", tmp_path / "run", check=False, timeout=120)
    assert time.monotonic() - t0 < 60 and p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("g3-train: error:")]
    assert len(lines) == 2 and lines[1] == ("g3-train: error: [rank 1] argument --epochs: invalid int value: 'ten' "
                                            "(g3-train --help lists the options)"), p.stderr
    assert re.fullmatch(r"g3-train: error: \[rank 1\] communication timeout: blocked \d+\.\d s \(the configuration "
                        r"check's limit 2\) waiting for rank 0 in the "
                        r"configuration check; aborting the job", lines[0]), p.stderr


def test_empty_paths_are_refused(small_parts, tmp_path):
    """--config "", --resume "" or --init-from "" (an unset shell variable) stop every rank, one line, before
    any run directory (they were taken for no option at all: a run with the defaults, a new run, the seeded
    initialisation)."""
    _, root = small_parts
    for opt in ("--config", "--resume", "--init-from"):
        p = run_mpi(2, MOD, "--parts", root / "p2", "--out", tmp_path / "run", "--epochs", "1", opt, "",
                    check=False)
        assert p.returncode == 2, p.stderr
        assert one_error(p.stderr, "g3-train", "ranks 0-1") == f"{opt}: the path is empty", p.stderr
        assert not (tmp_path / "run").exists()


def test_init_from_evaluates_and_fine_tunes_on_any_partition(small_parts, tmp_path):
    """--init-from RUN/model.pt: with --epochs 0 the same logits as RUN's own predictions on another partition
    and number of ranks; fine-tuning from it is the same whatever P, and the same as resuming the evaluation-only
    run to more epochs."""
    _, root = small_parts
    model = ["--model", "sage", "--hidden", "8", "--seed", "5", "--dropout", "0.3"]
    train(2, root / "p2", tmp_path / "r2", *model, "--epochs", "6", "--no-plots")
    init = tmp_path / "r2" / "model.pt"
    train(4, root / "p4", tmp_path / "e4", *model, "--epochs", "0", "--init-from", init)
    e4 = tmp_path / "e4"
    with h5py.File(tmp_path / "r2" / "predictions.h5") as a, h5py.File(e4 / "predictions.h5") as b:
        np.testing.assert_allclose(b["logits"][:], a["logits"][:], rtol=1e-5, atol=1e-6)
        assert np.array_equal(a["pred"][:], b["pred"][:]) and b.attrs["best_epoch"] == 0
    r2s, e4s = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "r2", e4))
    assert e4s["epochs"] == e4s["best_epoch"] == 0 and e4s["final_loss"] is None
    accs = ("train_acc", "val_acc", "test_acc")
    assert [e4s[k] for k in accs] == [r2s[k] for k in accs]
    lines = [json.loads(x) for x in (e4 / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(x) for x in lines] == [["epoch", "test_acc", "train_acc", "val_acc"]] and lines[0]["epoch"] == 0
    assert not list(e4.glob("*.png"))   # nothing trained, nothing to draw
    assert tomllib.loads((e4 / "config.toml").read_text())["init_from"] == str(init.resolve())
    a, b = torch.load(init, weights_only=True), torch.load(e4 / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # fine-tuning: P = 1 directly, and P = 4 by resuming the evaluation-only run
    train(1, root / "p1", tmp_path / "f1", *model, "--epochs", "3", "--init-from", init, "--no-plots")
    run_mpi(4, MOD, "--resume", e4, "--epochs", "3", "--no-progress")
    for name in ("model.pt", "checkpoint.pt"):   # the best parameters, and the last (epoch 3: trained)
        f1, f4 = (torch.load(d / name, weights_only=True) for d in (tmp_path / "f1", e4))
        if name == "checkpoint.pt":
            assert f1["epoch"] == f4["epoch"] == 3
            f1, f4 = f1["model"], f4["model"]
            assert not torch.equal(f1["convs.0.lin_l.weight"], a["convs.0.lin_l.weight"])
        for k in f1:
            torch.testing.assert_close(f4[k], f1[k], rtol=1e-5, atol=1e-6)
    f1s, f4s = (json.loads((d / "summary.json").read_text()) for d in (tmp_path / "f1", e4))
    assert f1s["best_epoch"] == f4s["best_epoch"] and f1s["val_acc"] == f4s["val_acc"] >= e4s["val_acc"]
    f1m = [json.loads(x) for x in (tmp_path / "f1" / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in f1m] == [0, 1, 2, 3] and f1m[0]["val_acc"] == e4s["val_acc"]


def test_init_from_refuses_what_does_not_fit(small_parts, tmp_path):
    """Parameters of another model or a checkpoint: every rank names the file and stops, before any run directory
    is made; --epochs 0 needs --init-from, --resume refuses it."""
    _, root = small_parts
    train(1, root / "p1", tmp_path / "r", "--hidden", "8", "--epochs", "1", "--no-plots")
    model = tmp_path / "r" / "model.pt"
    cases = [(model, ["--hidden", "4"], "do not fit this model (--model gcn --layers 2 --hidden 4, 8 features, 4 "
                                        "classes): convs.0.bias is (8,), the model's (4,); convs.0.lin.weight is "
                                        "(8, 8), the model's (4, 8)"),
             (model, ["--model", "sage", "--hidden", "8"], "missing convs.0.lin_l.weight"),
             (tmp_path / "r" / "checkpoint.pt", ["--hidden", "8"], "is a g3mpi checkpoint: continue its run with "
                                                                  "--resume RUN")]
    for path, extra, what in cases:
        p = run_mpi(2, MOD, "--parts", root / "p2", "--out", tmp_path / "run", "--epochs", "0", "--init-from", path,
                    *extra, check=False, timeout=120)
        assert p.returncode != 0, path
        err = one_error(p.stderr, "g3-train", "ranks 0-1")
        assert err.startswith(f"{path}: ") and what in err, p.stderr
        assert not (tmp_path / "run").exists()
    p = run_mpi(1, MOD, "--parts", root / "p1", "--out", tmp_path / "run", "--epochs", "0", check=False)
    assert p.returncode == 2 and "epochs must be at least 1 (got 0); 0 only with init_from" in p.stderr
    p = run_mpi(1, MOD, "--resume", tmp_path / "r", "--init-from", model, check=False)
    assert p.returncode == 2 and "--init-from starts a new run" in p.stderr


def test_load_model_state_refuses_what_is_not_parameters(tmp_path):
    from g3mpi.train.checkpoint import CheckpointError, load_model_state, state_mismatch
    good = {"convs.0.lin.weight": torch.ones(2, 3), "convs.0.bias": torch.zeros(2)}
    torch.save(good, tmp_path / "good.pt")
    assert load_model_state(tmp_path / "good.pt").keys() == good.keys()
    torch.save({**good, "convs.0.bias": torch.tensor([0.0, float("nan")])}, tmp_path / "nan.pt")
    torch.save({**good, "convs.0.bias": torch.tensor([0, 1])}, tmp_path / "int.pt")
    torch.save([torch.ones(2)], tmp_path / "list.pt")
    torch.save({}, tmp_path / "empty.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:60])
    raw = bytearray((tmp_path / "good.pt").read_bytes())
    at = raw.index(np.float32(1).tobytes() * 6)   # the weight's data: a flipped bit still loads with torch.load
    raw[at + 1] ^= 0x10
    (tmp_path / "flip.pt").write_bytes(bytes(raw))

    class Evil:   # pickled as a class reference: weights_only refuses it without running anything
        def __reduce__(self):
            return (print, ("unpickled!",))
    torch.save({"convs.0.bias": Evil()}, tmp_path / "evil.pt")
    (tmp_path / "dir.pt").mkdir()    # (it was "no such model file")
    os.mkfifo(tmp_path / "fifo.pt")  # (it was "no such model file"; reading it would block)
    for name, what in [("nan.pt", "'convs.0.bias' has non-finite values"), ("int.pt", "is a torch.int64 tensor"),
                       ("list.pt", "not a model state_dict"), ("empty.pt", "not a model state_dict"),
                       ("cut.pt", "not a readable model file"), ("evil.pt", "not a readable model file"),
                       ("flip.pt", "checksum mismatch in record '.*' \\(file corrupt\\)"),
                       ("none.pt", "no such model file"), ("dir.pt", "is a directory, not a model file"),
                       ("fifo.pt", "is a special file, not a model file")]:
        with pytest.raises(CheckpointError, match=f"^{tmp_path / name}: .*{what}"):
            load_model_state(tmp_path / name)
    assert state_mismatch(good, good) is None
    assert state_mismatch({"convs.0.bias": torch.zeros(3), "x": torch.zeros(1)}, good) == (
        "missing convs.0.lin.weight; not in the model x; convs.0.bias is (3,), the model's (2,)")


def test_cora_end_to_end(cora_npz, tmp_path):
    partition(cora_graph(cora_npz), 2, tmp_path / "parts")
    train(2, tmp_path / "parts", tmp_path / "run", "--epochs", "100", "--eval-every", "5")
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["test_acc"] >= 0.75, s


def test_one_allreduce_counts_the_splits_at_start_up(small_parts, tmp_path, monkeypatch):
    # the training, validation and test node counts are summed over the ranks once, before the model is built,
    # and the trainer takes them from g3-train instead of summing them again
    from mpi4py import MPI

    from g3mpi.cli.train import main
    from g3mpi.mpi.watchdog import Watchdog
    seen = []
    allreduce = Watchdog.allreduce

    def record(self, buf, *args, **kw):
        seen.append(kw.get("what", ""))
        return allreduce(self, buf, *args, **kw)
    monkeypatch.setattr(Watchdog, "allreduce", record)
    assert main(["--parts", str(small_parts[1] / "p1"), "--out", str(tmp_path / "r"), "--epochs", "1",
                 "--no-progress", "--no-plots"], comm=MPI.COMM_WORLD) == 0
    assert [w for w in seen if w.startswith("start-up")] == ["start-up check 'split sizes'"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    g = small_parts[0]
    assert summary["split_sizes"] == dict(train=int(g.train_mask.sum()), val=int(g.val_mask.sum()),
                                          test=int(g.test_mask.sum()))


def test_patience_counts_evaluations_without_a_better_validation_accuracy(small_parts, tmp_path):
    """``--patience k --eval-every e`` stops at the k-th evaluation after the best one, epoch best + k * e, none of
    those k better than the best, which is the first epoch that reached it (a mutation that ran one evaluation
    more survived every other test: they only checked that the run stopped before ``--epochs``)."""
    g, root = small_parts
    out = tmp_path / "run"
    train(1, root / "p1", out, "--epochs", "300", "--patience", "3", "--eval-every", "2", "--lr", "0.5",
          "--no-plots")
    s = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in lines if "val_acc" in r]
    assert s["epochs"] < 300 and s["epochs"] == s["best_epoch"] + 3 * 2 == lines[-1]["epoch"]
    best = max(r["val_acc"] for r in evals)
    assert [r["epoch"] for r in evals if r["val_acc"] == best][0] == s["best_epoch"]
    after = [r for r in evals if r["epoch"] > s["best_epoch"]]
    assert len(after) == 3 and all(r["val_acc"] <= best for r in after)


def test_settings_without_effect_warn_on_rank_0_and_change_nothing(small_parts, tmp_path):
    """Settings the user gave that this run does not use (on the command line or in --config): rank 0 names each
    once, with where it was given and why; the run is the one without them. Defaults and the settings that have
    an effect say nothing."""
    _, root = small_parts
    (tmp_path / "c.toml").write_text("attn-dropout = 0.25\nlr = 0.02\nmomentum = 0.0\n")
    common = ["--epochs", "2", "--hidden", "8", "--no-plots"]
    p = train(2, root / "p2", tmp_path / "a", *common, "--config", tmp_path / "c.toml", "--momentum", "0.9",
              "--heads", "4", "--checkpoint-every", "2", "--out-heads", "1")
    warnings = [x.split(" ", 1)[1] for x in p.stderr.splitlines() if " WARNING " in x]   # (after the time)
    assert warnings == [f"[rank 0/2] WARNING g3mpi: {w}" for w in [
        "command line: --heads 4 has no effect: the model is gcn, and attention heads are GAT's",
        f"{tmp_path / 'c.toml'}: attn-dropout = 0.25 has no effect: the model is gcn, and attention dropout is GAT's",
        "command line: --momentum 0.9 has no effect: the optimizer is adam, and momentum is SGD's (optimizer sgd)",
        "command line: --checkpoint-every 2 has no effect: the run ends at epoch 2, where the checkpoint is written "
        "anyway"]], p.stderr
    p = train(2, root / "p2", tmp_path / "b", *common, "--lr", "0.02")
    assert " WARNING " not in p.stderr, p.stderr
    for name in ("model.pt", "checkpoint.pt"):   # the best parameters, and the last epoch's
        a, b = (torch.load(tmp_path / d / name, weights_only=True) for d in "ab")
        a, b = (x["model"] if name == "checkpoint.pt" else x for x in (a, b))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    losses = [[json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in "ab"]
    assert losses[0] == losses[1]
    with h5py.File(tmp_path / "a" / "predictions.h5") as fa, h5py.File(tmp_path / "b" / "predictions.h5") as fb:
        assert np.array_equal(fa["logits"][:], fb["logits"][:])
