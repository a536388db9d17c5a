"""The per-rank timeline (g3mpi.comm.timeline): compute parts from synthetic events, and the record of a 2-rank
g3-train run: well-formed events covering every layer's forward and backward exchange, and its plot."""
from __future__ import annotations

import json

import matplotlib.image
import pytest

from g3mpi.comm.timeline import combine, segments
from tests.conftest import run_module, run_mpi
from tests.graphs import partition, random_graph
from tests.timeline_record import check_record


def test_segments_cut_out_blocked_time_and_follow_the_rounds():
    ev = [["phase", "forward", 0.0, 0.0, -1], ["post", "gcn0.fwd", 1.0, 1.0, -1], ["send", "gcn0.fwd", 1.5, 1.5, 1],
          ["wait", "gcn0.fwd", 2.0, 3.0, -1], ["land", "gcn0.fwd", 2.9, 2.9, 1], ["post", "gcn1.fwd", 4.0, 4.0, -1],
          ["phase", "loss", 5.0, 5.0, -1], ["phase", "backward", 5.5, 5.5, -1],
          ["send_wait", "gcn1.bwd", 6.0, 6.5, -1], ["post", "gcn1.bwd", 6.5, 6.5, -1],
          ["phase", "allreduce", 8.0, 8.0, -1], ["phase", "step", 9.0, 9.0, -1], ["phase", "end", 9.5, 9.5, -1]]
    assert segments(ev) == [["forward", 0.0, 1.0], ["gcn0 fwd", 1.0, 2.0], ["gcn0 fwd", 3.0, 4.0],
                            ["gcn1 fwd", 4.0, 5.0], ["loss", 5.0, 5.5], ["backward", 5.5, 6.0],
                            ["gcn1 bwd", 6.5, 8.0], ["allreduce (idle)", 8.0, 9.0], ["optimizer step", 9.0, 9.5]]
    doc = combine([dict(rank=0, events=[[k, n, a + 10, b + 10, p] for k, n, a, b, p in ev])], model="gcn")
    s = doc["ranks"][0]["summary"]
    assert doc["ranks"][0]["events"][0][2] == 0.0 and doc["model"] == "gcn"   # times from the first forward mark
    assert s["epoch_s"] == 9.5 and s["blocked_total_s"] == 1.5
    assert s["compute_s"]["gcn0 fwd"] == 2.0 and s["blocked_s"] == {"gcn0 fwd": 1.0, "gcn1 bwd": 0.5}


@pytest.mark.parametrize("model,schedule", [("gcn", "pipelined"), ("sage", "blocking"), ("gat", "pipelined")])
def test_train_records_one_epoch_of_every_rank(model, schedule, tmp_path):
    partition(random_graph(n=240, f=8, c=4, seed=7), 2, tmp_path / "p2", seed=2)
    out = tmp_path / "run"
    run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", out, "--no-progress", "--model", model,
            "--layers", "3", "--heads", "2", "--epochs", "3", "--timeline-epoch", "2", "--schedule", schedule,
            "--no-input-cache", "--sim-net", "1Gbit,50us")
    doc = json.loads((out / "timeline.json").read_text())
    assert doc["epoch"] == 2 and doc["schedule"] == schedule and doc["world_size"] == 2
    check_record(doc, 2, 3, model)
    assert matplotlib.image.imread(out / "timeline.png").ndim == 3
    (out / "timeline.png").unlink()
    p = run_module("g3mpi.cli.plots", out)   # redrawn on demand from timeline.json
    assert "timeline.png" in p.stdout and (out / "timeline.png").is_file()


def test_no_timeline_when_off_and_the_last_epoch_of_a_short_run(tmp_path):
    partition(random_graph(n=120, f=6, c=3, seed=1), 2, tmp_path / "p2", seed=1)
    run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", tmp_path / "off", "--no-progress",
            "--epochs", "2", "--timeline-epoch", "0")
    assert not (tmp_path / "off" / "timeline.json").exists() and not (tmp_path / "off" / "timeline.png").exists()
    run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", tmp_path / "short", "--no-progress",
            "--epochs", "1", "--no-plots")
    doc = json.loads((tmp_path / "short" / "timeline.json").read_text())
    assert doc["epoch"] == 1 and not (tmp_path / "short" / "timeline.png").exists()
    check_record(doc, 2, 2, "gcn", first_sends=False)   # (the input cache keeps layer 0's halo: it sends nothing)
