"""g3-train's checkpoints and --resume: bit-identical continuation, and the checkpoints and runs it refuses."""
from __future__ import annotations

import io
import json
import statistics

import h5py
import numpy as np
import pytest
import torch

from g3mpi.format import read_meta
from tests.graphs import random_graph
from tests.train_runs import error_lines, metrics, parts, train  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


def test_resume_is_bit_identical(parts, tmp_path):
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "3", "--checkpoint-every", "2", *args)
    assert torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)["epoch"] == 3
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "6")
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 6
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)
    ma, mb = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["epoch"] for r in mb] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(ma, mb):
        for k in ("loss", "train_acc", "val_acc", "test_acc"):
            assert ra[k] == rb[k], (ra["epoch"], k)
    for name in ("model.pt",):
        sa = torch.load(tmp_path / "straight" / name, weights_only=True)
        sb = torch.load(tmp_path / "split" / name, weights_only=True)
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    with h5py.File(tmp_path / "straight" / "predictions.h5") as fa, \
            h5py.File(tmp_path / "split" / "predictions.h5") as fb:
        assert np.array_equal(fa["logits"][:], fb["logits"][:])
    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert (sa["best_epoch"], sa["test_acc"], sa["final_loss"]) == (sb["best_epoch"], sb["test_acc"], sb["final_loss"])
    # the timings summarise the run's 6 epochs (metrics.jsonl), not only the 3 the resumed job trained
    assert sb["epoch_time_median_s"] == statistics.median(r["epoch_time_s"] for r in mb)
    assert sb["compute_time_median_s"] == statistics.median(max(r["rank_compute_s"]) for r in mb)
    assert sb["bytes_sent_per_epoch"] == sa["bytes_sent_per_epoch"] > 0


def test_resume_after_an_off_grid_last_epoch(parts, tmp_path):
    """A run of 4 epochs with --eval-every 3 evaluates after epoch 4 because it is its last: resumed to 6 epochs
    it must select, log and predict as a straight 6-epoch run, which never evaluated at epoch 4 (an audit found
    the resumed run keeping that evaluation: another best epoch and other predictions)."""
    args = ["--eval-every", "3", "--dropout", "0.6", "--lr", "0.2", "--seed", "1"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "4", *args)
    assert "val_acc" in metrics(tmp_path / "split")[3]
    (tmp_path / "split" / ".checkpoint.pt.x1y2.tmp").write_bytes(b"a write a crash interrupted")
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "6")
    assert not list((tmp_path / "split").glob(".*"))
    ma, mb = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    strip = ("epoch_time_s", "rank_compute_s", "rank_blocked_s", "rank_comm_s", "rank_overlap", "rank_allreduce_s",
             "rank_rss_bytes")
    assert [{k: v for k, v in r.items() if k not in strip} for r in ma] == \
        [{k: v for k, v in r.items() if k not in strip} for r in mb]
    sa = json.loads((tmp_path / "straight" / "summary.json").read_text())
    sb = json.loads((tmp_path / "split" / "summary.json").read_text())
    assert (sa["best_epoch"], sa["val_acc"], sa["test_acc"]) == (sb["best_epoch"], sb["val_acc"], sb["test_acc"])
    a = torch.load(tmp_path / "straight" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_continues_early_stopping_and_keeps_the_best_model(parts, tmp_path):
    """With --lr 0 the parameters never change, so the first evaluation stays the best and --patience 3 stops a
    straight run at epoch 4. A run checkpointed at epoch 2 (one evaluation without improvement) and resumed
    must stop there too, with the same best epoch: the checkpoint carries the count and the best accuracy. The
    checkpoint holds the best model itself (model.pt of the run that wrote it). (A mutation run found the count
    and the best accuracy untested: counting from 0 again, or from a best accuracy of -1, after resuming passed
    every test, as did predictions.h5 naming the last epoch as its best_epoch; a checkpoint without the best
    model failed only where a test edits that model.)"""
    args = ["--lr", "0", "--patience", "3", "--eval-every", "1", "--seed", "2"]
    train(2, parts / "p2", tmp_path / "straight", "--epochs", "10", *args)
    train(2, parts / "p2", tmp_path / "split", "--epochs", "2", *args)
    ck = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    best = torch.load(tmp_path / "split" / "model.pt", weights_only=True)
    assert (ck["epoch"], ck["since_best"], ck["best"]["epoch"]) == (2, 1, 1)
    assert sorted(ck["best"]["state"]) == sorted(best)
    assert all(torch.equal(ck["best"]["state"][k], best[k]) for k in best)
    train(2, None, None, "--resume", tmp_path / "split", "--epochs", "10")
    for run in ("straight", "split"):
        s = json.loads((tmp_path / run / "summary.json").read_text())
        assert (s["epochs"], s["best_epoch"]) == (4, 1), run
        with h5py.File(tmp_path / run / "predictions.h5") as f:   # the predictions say whose they are
            assert f.attrs["best_epoch"] == 1, run
    assert [r["epoch"] for r in metrics(tmp_path / "split")] == [1, 2, 3, 4]


def test_resume_refuses_a_finished_run(parts, tmp_path):
    """Resuming a run that finished (or stopped early) rewrote its outputs from the checkpoint: null timings,
    and an older model when the last epoch was off the --eval-every grid (audit). Now refused, files untouched."""
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "3", "--eval-every", "2")
    before = {f.name: f.read_bytes() for f in run.iterdir()}
    p = train(2, None, None, "--resume", run, check=False, timeout=120)
    assert p.returncode != 0
    assert "checkpoint.pt: already at epoch 3: nothing to train with --epochs 3" in error_lines(p.stderr)[0][0]
    assert {f.name: f.read_bytes() for f in run.iterdir()} == before
    # the last checkpoint written but not the outputs (a full disk, a kill): the resume writes them, as they were
    for name in ("summary.json", "model.pt", "predictions.h5"):
        (run / name).unlink()
    train(2, None, None, "--resume", run)
    assert (run / "metrics.jsonl").read_bytes() == before["metrics.jsonl"]
    # the summary is the one the run wrote, its timings too (they were null: no epoch trained in the resumed job)
    sa, sb = json.loads(before["summary.json"]), json.loads((run / "summary.json").read_text())
    measured = ("peak_rss_bytes_max", "rank_peak_rss_bytes", "startup", "shutdown")   # (of each job)
    assert {k: v for k, v in sb.items() if k not in measured} == {k: v for k, v in sa.items() if k not in measured}
    with h5py.File(run / "predictions.h5") as f, h5py.File(io.BytesIO(before["predictions.h5"])) as ref:
        assert f.attrs["best_epoch"] == ref.attrs["best_epoch"]   # the off-grid last evaluation competed again
        assert np.array_equal(f["logits"][:], ref["logits"][:])
    a = torch.load(io.BytesIO(before["model.pt"]), weights_only=True)
    assert all(torch.equal(v, torch.load(run / "model.pt", weights_only=True)[k]) for k, v in a.items())
    early = tmp_path / "early"
    train(2, parts / "p2", early, "--epochs", "200", "--patience", "1", "--lr", "0.5")
    stopped = json.loads((early / "summary.json").read_text())["epochs"]
    assert stopped < 200
    p = train(2, None, None, "--resume", early, "--epochs", "300", check=False, timeout=120)
    assert p.returncode != 0
    assert f"the run stopped early at epoch {stopped}" in error_lines(p.stderr)[1][0]
    train(2, None, None, "--resume", early, "--epochs", str(stopped + 2), "--patience", "50")   # the escape


def test_resume_refuses_incompatible(parts, tmp_path):
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "2")
    before = (run / "checkpoint.pt").read_bytes()
    p = train(2, None, None, "--resume", run, "--epochs", "4", "--hidden", "16", check=False, timeout=120)
    assert p.returncode != 0
    lines = error_lines(p.stderr)
    assert sorted(lines) == [0, 1]
    assert "checkpoint.pt: incompatible configuration: hidden = 8 in the checkpoint but 16 now" in lines[0][0]
    p = train(2, parts / "p2other", None, "--resume", run, "--epochs", "4", check=False, timeout=120)
    assert p.returncode != 0
    assert "checkpoint.pt: was written for partition" in error_lines(p.stderr)[1][0]
    assert (run / "checkpoint.pt").read_bytes() == before


def _extra_parameter(ck):
    ck["model"]["convs.9.bias"] = torch.zeros(3)
    return "its model does not fit the configured one: not in the model convs.9.bias"


def _adam_state_shape(ck):
    ck["optimizer"]["state"][0]["exp_avg"] = torch.zeros(2, 2)
    return "its optimizer state 'exp_avg' of parameter 0 is (2, 2)"


def _short_rng(ck):
    ck["rng"] = ck["rng"][:10]
    return "its rng state has 10 bytes"


def _best_model_shape(ck):
    k = sorted(ck["best"]["state"])[0]
    ck["best"]["state"][k] = torch.zeros(7, 7)
    return f"its best model does not fit the configured one: {k} is (7, 7)"


def _nan_parameter(ck):
    k = sorted(ck["model"])[0]
    ck["model"][k].view(-1)[0] = float("nan")
    return f"its model's parameter {k!r} has non-finite values"


def test_resume_refuses_states_that_do_not_fit(parts, tmp_path):
    """A checkpoint of the right layout and configuration whose tensors do not fit the model (found by fuzzing
    --resume): an extra parameter made Trainer.restore's load_state_dict fail with a traceback on every rank, an
    Adam state of another shape failed in the first step, a short RNG state in set_rng_state, a best model of
    other shapes at the end when writing model.pt; a NaN parameter trained on to 'non-finite value in the loss'
    (the --init-from check refuses it). Each is now refused before the run directory is touched, one line per
    rank naming the checkpoint."""
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "2")
    good = torch.load(run / "checkpoint.pt", weights_only=True)
    for edit in (_extra_parameter, _adam_state_shape, _short_rng, _best_model_shape, _nan_parameter):
        ck = torch.load(run / "checkpoint.pt", weights_only=True)
        what = edit(ck)
        torch.save(ck, run / "checkpoint.pt")
        before = {f.name: f.read_bytes() for f in run.iterdir()}
        p = train(2, None, None, "--resume", run, "--epochs", "4", check=False, timeout=120)
        assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
        lines = error_lines(p.stderr)
        assert sorted(lines) == [0, 1] and all(len(v) == 1 for v in lines.values()), p.stderr
        assert all("checkpoint.pt: " + what in v[0] for v in lines.values()), p.stderr
        assert {f.name: f.read_bytes() for f in run.iterdir()} == before
        torch.save(good, run / "checkpoint.pt")


def test_resume_on_another_partition_of_the_same_graph(tmp_path):
    """A checkpoint carries over to another partition of the same graph, with another number of ranks (a job
    restarted on a smaller or larger allocation): 3 epochs on 2 ranks, then 3 more on 3 ranks give the model of 6
    epochs on 2 ranks, up to float rounding (parameters are replicated, dropout is keyed by original node ID).
    A partition of another graph, or one whose meta.json does not name its graph, is refused."""
    from data_tools.partition import main as partition_main
    from g3mpi.format import write_graph
    write_graph(tmp_path / "g.h5", random_graph(n=200, f=8, c=4, seed=5))
    write_graph(tmp_path / "h.h5", random_graph(n=200, f=8, c=4, seed=6))
    for graph, P, method, out in (("g", 2, "random", "g2"), ("g", 3, "metis", "g3"), ("h", 3, "metis", "h3")):
        assert partition_main([str(tmp_path / f"{graph}.h5"), "--parts", str(P), "--method", method,
                               "--out", str(tmp_path / out), "--no-progress"]) == 0
    assert read_meta(tmp_path / "g2")["graph_sha256"] == read_meta(tmp_path / "g3")["graph_sha256"] \
        != read_meta(tmp_path / "h3")["graph_sha256"]
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    train(2, tmp_path / "g2", tmp_path / "straight", "--epochs", "6", *args)
    train(2, tmp_path / "g2", tmp_path / "split", "--epochs", "3", *args)
    before = (tmp_path / "split" / "checkpoint.pt").read_bytes()
    p = train(3, tmp_path / "h3", None, "--resume", tmp_path / "split", "--epochs", "6", check=False, timeout=120)
    assert p.returncode != 0
    assert "and it splits another graph (graph_sha256 differs)" in error_lines(p.stderr)[2][0]
    assert (tmp_path / "split" / "checkpoint.pt").read_bytes() == before
    p = train(3, tmp_path / "g3", None, "--resume", tmp_path / "split", "--epochs", "6", "--log-level", "INFO")
    assert "trained on another partition of the same graph (random, 2 parts)" in p.stderr
    assert f"parts = {str(tmp_path / 'g3')!r}".replace("'", '"') in (tmp_path / "split" / "config.toml").read_text()
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(tmp_path / "split" / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == 6 and b["partition"]["num_parts"] == 3
    for k in a["model"]:
        assert torch.linalg.norm(a["model"][k] - b["model"][k]) <= 1e-5 * torch.linalg.norm(a["model"][k]), k
    ma, mb = metrics(tmp_path / "straight"), metrics(tmp_path / "split")
    assert [r["epoch"] for r in mb] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(ma, mb):
        assert abs(ra["loss"] - rb["loss"]) <= 1e-5 * abs(ra["loss"]), ra["epoch"]
        assert (ra["val_acc"], ra["test_acc"]) == (rb["val_acc"], rb["test_acc"]), ra["epoch"]
    with h5py.File(tmp_path / "straight" / "predictions.h5") as fa, \
            h5py.File(tmp_path / "split" / "predictions.h5") as fb:
        np.testing.assert_allclose(fb["logits"][:], fa["logits"][:], rtol=1e-5, atol=1e-6)
