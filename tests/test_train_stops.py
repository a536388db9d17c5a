"""g3-train stopped from outside or by a stalled peer: a stop signal or time limit checkpoints at an epoch
boundary, the communication watchdog names the rank it waits for, a rank killed outright is resumed from."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tests.conftest import mpiexec, run_mpi, tool_env
from tests.train_runs import COMM_TIMEOUT, FAST, MOD, error_lines, metrics, parts, train  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


def _signalled(cmd, env: dict, send, ready) -> tuple[subprocess.Popen, str]:
    """Start ``cmd``; once ``ready()`` (polled for up to 120 s) call ``send(proc)``; wait for the end (killing it
    if it outlives 120 s more). Returns the process and its stderr."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**tool_env(), **env})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ready():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        send(proc)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, err


@pytest.mark.parametrize("target", ["mpiexec", "one rank"])
def test_stop_signal_checkpoints_at_an_epoch_boundary_and_resume_is_exact(target, parts, tmp_path):
    """SIGTERM to mpiexec (forwarded to every rank, as at a batch job's time limit) or SIGUSR1 to one rank only:
    every rank stops after the same epoch with its checkpoint written, exit status 75, nothing else written;
    --resume then continues exactly as a run that was never stopped."""
    args = ["--eval-every", "1", "--dropout", "0.5", "--seed", "3", "--model", "sage"]
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "100000", *args, *FAST]

    def send(proc):
        if target == "mpiexec":
            proc.send_signal(signal.SIGTERM)
        else:
            os.kill(int((pids / "rank-1.pid").read_text()), signal.SIGUSR1)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids)}, send, ready=lambda: (run / "metrics.jsonl").exists()
                           and len((run / "metrics.jsonl").read_text().splitlines()) >= 2)
    assert proc.returncode == 75, err
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert e >= 2
    assert [r["epoch"] for r in metrics(run)] == list(range(1, e + 1))
    # mpiexec forwards SIGTERM to both ranks, maybe an epoch apart: the line says so when only one had it then
    why = r"SIGTERM( on 1 of 2 ranks)?" if target == "mpiexec" else "SIGUSR1 on 1 of 2 ranks"
    assert re.search(f"g3-train: stopped by {why} after epoch {e} of 100000: {re.escape(str(run))}/checkpoint.pt is "
                     f"written; continue with: mpiexec -n 2 g3-train --resume {re.escape(str(run))}\n", err), err
    assert not error_lines(err), err
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.jsonl"]
    train(2, None, None, "--resume", run, "--epochs", e + 2)
    train(2, parts / "p2", tmp_path / "straight", "--epochs", e + 2, *args)
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=True)
    b = torch.load(run / "checkpoint.pt", weights_only=True)
    assert a["epoch"] == b["epoch"] == e + 2
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)
    for ra, rb in zip(metrics(tmp_path / "straight"), metrics(run), strict=True):
        for k in ("epoch", "loss", "train_acc", "val_acc", "test_acc"):
            assert ra[k] == rb[k], (ra["epoch"], k)


def test_a_second_run_in_a_run_directory_in_use_is_refused(parts, tmp_path):
    """Two runs in one run directory at once. Before the lock, a --resume of a run still training trained beside
    it, and a --force run deleted its files and wrote its own: a real run of each on Cora left a checkpoint of
    epoch 222 (the resume's, written after the first run's of epoch 246), metrics.jsonl and summary.json of 20
    epochs (the --force run's; the first run's metrics went to a deleted file), every job exiting 0 or stopped.
    Now the second one is refused on every rank, naming the directory and the first run's rank 0, and nothing of
    the first run is touched; once it has ended the directory is free (no lock file left) and --resume continues
    it."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "100000", "--checkpoint-every", "1", *FAST]
    second = []

    def second_runs_then_stop(proc):
        # (--time-limit: without the lock, each would stop after its first epoch instead of running on)
        second.append(train(2, None, None, "--resume", run, "--time-limit", "0.1", check=False, timeout=120))
        second.append(train(2, parts / "p2", run, "--force", "--epochs", "100000", "--time-limit", "0.1",
                            check=False, timeout=120))
        proc.send_signal(signal.SIGTERM)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids)}, second_runs_then_stop,
                           ready=lambda: (run / "checkpoint.pt").exists())
    holder = f"process {(pids / 'rank-0.pid').read_text().strip()} on {socket.gethostname()}"
    for p in second:
        assert p.returncode == 1, p.stderr
        lines = error_lines(p.stderr)
        assert lines == {0: [f"g3-train: error: [rank 0] {run}: another g3-train run is using this run directory "
                             f"({holder} holds .g3-train.lock); wait for it to end, or choose another --out"]}, p.stderr
    assert proc.returncode == 75, err
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert [r["epoch"] for r in metrics(run)] == list(range(1, e + 1))
    assert sorted(x.name for x in run.iterdir()) == ["checkpoint.pt", "config.toml", "metrics.jsonl"]
    train(2, None, None, "--resume", run, "--epochs", e + 1)
    assert [r["epoch"] for r in metrics(run)] == list(range(1, e + 2))
    assert ".g3-train.lock" not in {x.name for x in run.iterdir()}


def test_stop_signal_during_start_up_stops_after_the_first_epoch(parts, tmp_path):
    """SIGUSR1 to a rank still starting up (here: stalled after loading its part, as under a loaded batch
    system) is a stop request like any other: the run stops after epoch 1 with its checkpoint, status 75.
    Before, MPICH's own SIGUSR1 handler (installed by MPI_Init) swallowed it until g3-train installed its
    handlers before training: the run went on (under srun with timeout(1), until the SIGKILL 60 s later)."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p2"),
           "--out", str(run), "--epochs", "5", *FAST]

    def send(proc):
        time.sleep(0.2)   # rank 1 is loading its part or stalled after it: still starting up
        os.kill(int((pids / "rank-1.pid").read_text()), signal.SIGUSR1)
    proc, err = _signalled(cmd, {"G3_TEST_PIDFILE": str(pids), "G3_TEST_STALL": "1:startup:4"}, send,
                           ready=(pids / "rank-1.pid").exists)
    assert proc.returncode == 75, err
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by SIGUSR1 on 1 of 2 ranks after epoch 1 of 5" in err, err


def test_stop_signal_while_importing_torch(parts, tmp_path):
    """SIGUSR1 to every rank while it imports torch (most of a rank's start-up, seconds under load; here each rank
    sends it to itself as the import begins) stops the run after epoch 1 with its checkpoint, status 75, the line
    naming the signal. Before, g3-train installed its handlers after that import: MPICH's SIGUSR1 handler swallowed
    the request and the run went on (a rank that had its handlers already and one that had not yet made the line
    say "a stop signal on 1 rank(s)", which test_slurm's G3_TIMEOUT test did not expect)."""
    run = tmp_path / "run"
    p = run_mpi(2, "tests.mpi_stop_at_import", *FAST, "--parts", parts / "p2", "--out", run, "--epochs", "5",
                check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by SIGUSR1 after epoch 1 of 5" in p.stderr, p.stderr


def test_time_limit_stops_with_a_checkpoint(parts, tmp_path):
    """--time-limit S: the run stops at the first epoch end after S seconds as on a stop signal (checkpoint, exit
    75 on every rank, the line naming the limit), and the limit is not saved for a resumed run."""
    run = tmp_path / "run"
    p = train(2, parts / "p2", run, "--epochs", "100000", "--time-limit", "2", check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    e = torch.load(run / "checkpoint.pt", weights_only=True)["epoch"]
    assert f"g3-train: stopped by the time limit (--time-limit 2) after epoch {e} of 100000" in p.stderr, p.stderr
    assert "time_limit = 0.0" in (run / "config.toml").read_text()
    train(2, None, None, "--resume", run, "--epochs", e + 1)


def test_time_limit_passed_on_one_rank_only(parts, tmp_path):
    """The limit is timed by each rank's own clock: when it has passed on one rank only at an epoch end, every
    rank stops there, and the line still names the time limit (it said "a stop signal on 1 rank(s)")."""
    run = tmp_path / "run"
    p = run_mpi(2, "tests.mpi_time_limit", *FAST, "--parts", parts / "p2", "--out", run, "--epochs", "50",
                "--time-limit", "1000", check=False, timeout=120)
    assert p.returncode == 75, p.stderr
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == 1
    assert "g3-train: stopped by the time limit (--time-limit 1000) after epoch 1 of 50" in p.stderr, p.stderr


@pytest.mark.parametrize("P", [1, 2, 3])
def test_watchdog_text_messages_between_ranks(P):
    """The start-up's and the outputs' control messages (an error text or None) arrive as sent on every rank,
    with and without a deadline, and never through pickle (tests/mpi_watchdog.py refuses it)."""
    p = run_mpi(P, "tests.mpi_watchdog", timeout=120)
    assert f"WATCHDOG TEXT OK {P}" in p.stdout, p.stdout + p.stderr


def test_watchdog_names_stalled_neighbour(parts, tmp_path):
    run = tmp_path / "run"
    p = train(3, parts / "p3", run, "--epochs", "8", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=150,
              env={"G3_TEST_STALL": "1:3:120"})
    t_end = time.time()
    assert p.returncode != 0
    lines = [x for r, v in error_lines(p.stderr).items() if r != 1 for x in v]
    assert lines, p.stderr
    msg = lines[0]
    assert "communication timeout" in msg and "waiting for rank 1" in msg and "forward direction" in msg, msg
    # the first exchange of the pass: layer 1's (layer 0 keeps its input's halo and sends nothing)
    assert "layer 'gcn1'" in msg and "epoch 3" in msg, msg
    # the job ended long before the stalled rank woke up: within the timeout plus a few seconds after epoch 2
    assert [r["epoch"] for r in metrics(run)] == [1, 2]
    assert t_end - (run / "metrics.jsonl").stat().st_mtime < 30


def test_watchdog_names_the_rank_it_receives_from(tmp_path):
    """Three parts joined by a cycle of one-way edges: rank r receives only from rank r + 1 and sends only to rank
    r - 1 (mod 3). Rank 1 stalls in epoch 3: a rank that times out names the rank whose message it waits for (in
    forward the one it receives rows from, in backward the one it returns gradients from). (A mutation run found this untested: naming the rank at the same position of the send
    list passed every test, since in the tests' other graphs every rank sends to the ranks it receives from.)"""
    from data_tools.build import write_partition
    from g3mpi.format import Graph
    from tests.graphs import csr_from_edges
    n = 30
    ring = np.arange(n)
    nxt = ring // 10 * 10 + (ring + 1) % 10           # a ring inside each part of 10 nodes, both directions
    src = np.concatenate([ring, nxt, [10, 20, 0]])     # 10 -> 0: part 0 receives from part 1, and so on
    dst = np.concatenate([nxt, ring, [0, 10, 20]])
    indptr, indices = csr_from_edges(src, dst, n)
    x = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    g = Graph(indptr, indices, x, ring % 2, ring % 3 == 0, ring % 3 == 1, ring % 3 == 2,
              dict(num_classes=2, source="one-way cycle"))
    write_partition(g, ring // 10, 3, tmp_path / "parts", method="random", seed=0)
    p = train(3, tmp_path / "parts", tmp_path / "run", "--epochs", "8", "--comm-timeout", COMM_TIMEOUT,
              check=False, timeout=150, env={"G3_TEST_STALL": "1:3:120"})
    assert p.returncode != 0
    lines = {r: v for r, v in error_lines(p.stderr).items() if r != 1}
    assert lines, p.stderr
    for r, v in lines.items():   # forward: the rank it receives rows from; backward: gradients, the one it sends to
        peer = (r + 1) % 3 if "forward direction" in v[0] else (r - 1) % 3
        assert "communication timeout" in v[0] and f"waiting for rank {peer} in" in v[0], v[0]
    assert any("forward direction" in v[0] for v in lines.values()), lines


def test_watchdog_covers_startup_checks(parts, tmp_path):
    """A rank stalled before the start-up halo check (before the first epoch) ends the job after --comm-timeout,
    one line per waiting rank naming the check; the other ranks once blocked in its Alltoall until it woke up."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    p = train(3, parts / "p3", run, "--epochs", "4", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=120,
              env={"G3_TEST_STALL": "1:startup:300", "G3_TEST_PIDFILE": str(pids)})
    t_end = time.time()
    assert p.returncode != 0
    lines = [x for r, v in error_lines(p.stderr).items() if r != 1 for x in v]
    assert lines, p.stderr
    for msg in lines:
        assert "communication timeout: blocked" in msg and f"--comm-timeout {COMM_TIMEOUT}" in msg, msg
        assert "in the start-up check 'halo lists'" in msg, msg
    assert not run.exists()   # it ended before the run directory was made
    # within the timeout plus a few seconds of the ranks' start (each wrote its pid when it began loading)
    assert t_end - max(f.stat().st_mtime for f in pids.iterdir()) < 30


def test_watchdog_covers_predictions_turns(parts, tmp_path):
    """A rank stalled before its turn writing predictions.h5 ends the job after --comm-timeout: the rank after it
    names it, rank 0 (waiting for the file back from the last rank) names the last rank; of the outputs only the
    checkpoint of the finished training is written."""
    run = tmp_path / "run"
    p = train(3, parts / "p3", run, "--epochs", "2", "--comm-timeout", COMM_TIMEOUT, check=False, timeout=120,
              env={"G3_TEST_STALL": "1:predictions:300"})
    t_end = time.time()
    assert p.returncode != 0
    lines = {r: v for r, v in error_lines(p.stderr).items() if r != 1}
    assert lines, p.stderr
    waits = {0: "waiting for rank 2 in the ranks' turns writing predictions.h5 (rank 2 writes last",
             2: "waiting for rank 1 in the ranks' turns writing predictions.h5 (rank 1 writes before rank 2)"}
    for r, v in lines.items():
        assert len(v) == 1 and "communication timeout: blocked" in v[0], p.stderr
        assert waits[r] in v[0] and "after epoch 2" in v[0], v[0]
    # (and rank 0's temporary .predictions.h5.tmp, which a --resume removes)
    written = sorted(f.name for f in run.iterdir() if f.name[0] != ".")
    assert written == ["checkpoint.pt", "config.toml", "metrics.jsonl"], written
    assert t_end - (run / "checkpoint.pt").stat().st_mtime < 30


def test_watchdog_allows_slow_turns_writing_predictions(parts, tmp_path):
    """Every rank's turn writing predictions.h5 takes 0.6 x --comm-timeout (3.6 s under 6): the run succeeds. A
    rank's wait spans the turns before its own (rank 2: 7.2 s here), so the deadline is the timeout per turn waited
    for (the reviewer's finding: the whole wait was held to one timeout and every such run ended without its
    outputs)."""
    run = tmp_path / "run"
    train(3, parts / "p3", run, "--epochs", "2", "--comm-timeout", COMM_TIMEOUT, timeout=120,
          env={"G3_TEST_STALL": f"*:predictions:{0.6 * COMM_TIMEOUT:g}"})
    assert (run / "summary.json").exists() and (run / "predictions.h5").exists()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_kill_one_rank_then_resume(parts, tmp_path):
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", MOD, "--parts", str(parts / "p3"),
           "--out", str(run), "--epochs", "100000", "--checkpoint-every", "2", *FAST]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**tool_env(), "G3_TEST_PIDFILE": str(pids)})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run / "checkpoint.pt").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.2)
        assert (run / "checkpoint.pt").exists()
        time.sleep(1.0)  # well inside later epochs
        rank_pids = [int((pids / f"rank-{r}.pid").read_text()) for r in range(3)]
        t_kill = time.monotonic()
        os.kill(rank_pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    assert waited < 30, waited
    t0 = time.monotonic()
    while any(_alive(p) for p in rank_pids) and time.monotonic() - t0 < 10:
        time.sleep(0.1)
    assert not any(_alive(p) for p in rank_pids), "orphan rank processes"
    # the last checkpoint is intact and the run continues from it, taking over the lock file the killed one left
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    e = ckpt["epoch"]
    assert e >= 2 and e % 2 == 0
    assert (run / ".g3-train.lock").read_text() == f"{rank_pids[0]} {socket.gethostname()}\n"
    train(3, None, None, "--resume", run, "--epochs", str(e + 2))
    assert [r["epoch"] for r in metrics(run)] == list(range(1, e + 3))
    assert torch.load(run / "checkpoint.pt", weights_only=True)["epoch"] == e + 2
    assert not (run / ".g3-train.lock").exists()
