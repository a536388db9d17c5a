"""A stalled rank ends the job (docs/RELIABILITY.md, "Deadlines"): the default adaptive deadline, quiet waits,
stop signals and a lost launcher reaching a rank blocked on its peers, inputs that are not regular files.

Every fault here is a rank that stops answering: ``kill -STOP`` of its process, or a ``G3_TEST_STALL`` sleep at a
named point (``g3mpi.train.faults``). The deadlines are the default adaptive ones with a small floor
(``--comm-timeout-floor``): the job must end with exit status 69 (``EXIT_STALLED``) and a line naming the rank it
waited for and the phase, its last checkpoint valid.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from g3mpi.mpi.deadline import EXIT_STALLED
from tests.conftest import mpiexec, tool_env
from tests.train_runs import FAST, MOD, error_lines, metrics, parts, train  # noqa: F401 - parts: a fixture

SLOW_TESTS = ("test_stopped_rank_mid_epoch_costs_no_core_and_ends_the_job",
              "test_sigterm_ends_a_wait_on_a_stalled_rank", "test_stall_at_a_point_ends_the_job",
              "test_slow_rank_does_not_trip_the_adaptive_deadline", "test_killed_mpiexec_leaves_no_rank",
              "test_part_file_not_regular_is_refused", "test_stopped_rank_ends_the_stream_partitioner",
              "test_comm_timeout_settings")
#: the adaptive deadline's floor in these tests: above any legitimate wait of one rank for another on two busy
#: cores before the fault (tests/train_runs.py's COMM_TIMEOUT), far below the default 300 s
FLOOR = 6
#: what the end of a job may take beyond its deadline: the abort, the launcher tearing the ranks down
MARGIN_S = 10


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def _start(cmd, env=None) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**tool_env(), **(env or {})})


def _wait_for(path: Path, proc: subprocess.Popen, limit: float = 150) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _finish(proc: subprocess.Popen, pids=(), timeout: float = 60) -> tuple[str, str]:
    """The job's output once it ended; on a timeout every process of it is killed first (by its own pid)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the job did not end within {timeout} s\n{err}") from None


def _train_cmd(P, parts_dir, run, *extra):
    return [mpiexec(), "-n", str(P), sys.executable, "-m", "mpi4py", "-m", MOD, *FAST, "--parts", str(parts_dir),
            "--out", str(run), *map(str, extra)]


def test_stopped_rank_mid_epoch_costs_no_core_and_ends_the_job(parts, tmp_path):
    """Rank 1 stopped (SIGSTOP) mid-training: rank 0, waiting for it, uses at most 10 % of a core over 20 s (the
    blocking MPI wait cost about a quarter), then the default deadline (its floor, 25 s here) ends the job within
    a margin: exit status 69, one line naming rank 1 and the epoch; the last checkpoint loads."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    floor = 25
    proc = _start(_train_cmd(2, parts / "p2", run, "--epochs", "100000", "--checkpoint-every", "2",
                             "--comm-timeout-floor", floor), env={"G3_TEST_PIDFILE": str(pids)})
    _wait_for(run / "checkpoint.pt", proc)
    r0, r1 = (int((pids / f"rank-{r}.pid").read_text()) for r in (0, 1))
    try:
        os.kill(r1, signal.SIGSTOP)
        t_stop = time.monotonic()
        time.sleep(1)   # (rank 0 finishes what it was computing)
        c0, t0 = _cpu_seconds(r0), time.monotonic()
        time.sleep(20)
        share = (_cpu_seconds(r0) - c0) / (time.monotonic() - t0)
        _, err = _finish(proc, (r0, r1), timeout=90)
        ended = time.monotonic() - t_stop
    finally:
        for pid in (r0, r1):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert share <= 0.10, f"a waiting rank used {share:.1%} of a core"
    assert proc.returncode == EXIT_STALLED, err
    lines = error_lines(err).get(0, [])
    assert len(lines) == 1 and "communication timeout" in lines[0] and "waiting for rank 1 " in lines[0], err
    assert f"--comm-timeout-floor {floor}" in lines[0] and ", epoch " in lines[0], lines[0]
    assert ended < floor + 10 * 2 + MARGIN_S, err   # (the deadline is max(floor, 10 epochs): under 2 s each here)
    from g3mpi.train.checkpoint import load_checkpoint
    assert load_checkpoint(run / "checkpoint.pt")["epoch"] % 2 == 0


def test_sigterm_ends_a_wait_on_a_stalled_rank(parts, tmp_path):
    """Rank 1 stalls at epoch 3 (asleep for 300 s); SIGTERM to rank 0, blocked waiting for it, ends the job within
    15 s: the stop cannot be agreed on, so one line names the signal and rank 1, and the exit status is 69."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    proc = _start(_train_cmd(2, parts / "p2", run, "--epochs", "100", "--comm-timeout-floor", 120),
                  env={"G3_TEST_PIDFILE": str(pids), "G3_TEST_STALL": "1:3:300"})
    _wait_for(run / "metrics.jsonl", proc)
    deadline = time.monotonic() + 120
    while len(metrics(run)) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)   # (rank 0 is in epoch 3, waiting for rank 1)
    r0, r1 = (int((pids / f"rank-{r}.pid").read_text()) for r in (0, 1))
    os.kill(r0, signal.SIGTERM)
    t_term = time.monotonic()
    _, err = _finish(proc, (r0, r1), timeout=60)
    ended = time.monotonic() - t_term
    assert proc.returncode == EXIT_STALLED, err
    lines = error_lines(err).get(0, [])
    assert lines and "SIGTERM received" in lines[0] and "waiting for rank 1 " in lines[0], err
    assert ended < 15, (ended, err)


@pytest.mark.parametrize("rank, point, phase", [
    (1, "startup", "in the start-up check 'halo lists'"),
    (1, "evaluation", "forward direction, epoch 1, evaluation"),
    (0, "checkpoint", "in the checkpoint hand-off (rank 0 writes it), epoch 2"),
    (1, "checkpoint", "in the checkpoint hand-off (rank 0 writes it), epoch 2"),
])
def test_stall_at_a_point_ends_the_job(parts, tmp_path, rank, point, phase):
    """A rank that stops answering before the first epoch, in an evaluation, or around a checkpoint (rank 0: the
    writer hangs; rank 1: the others wait at the hand-off) ends the job under the default adaptive deadline:
    exit status 69, the other rank's one line naming it and the phase, within the deadline and a margin. A
    checkpoint written before is valid and resumes bit-identically (as a straight run of the same epochs)."""
    run = tmp_path / "run"
    p = train(2, parts / "p2", run, "--epochs", "4", "--checkpoint-every", "2", "--comm-timeout-floor", FLOOR,
              check=False, timeout=150, env={"G3_TEST_STALL": f"{rank}:{point}:300"})
    assert p.returncode == EXIT_STALLED, p.stderr
    other = 1 - rank
    lines = error_lines(p.stderr).get(other, [])
    assert len(lines) == 1, p.stderr
    assert "communication timeout" in lines[0] and f"waiting for rank {rank} " in lines[0], lines[0]
    assert phase in lines[0], lines[0]
    assert p.elapsed < 150
    written = run / "checkpoint.pt"
    if (rank, point) != (1, "checkpoint"):
        assert not written.exists()   # the writer never wrote, or no epoch was reached
        return
    from g3mpi.train.checkpoint import load_checkpoint
    assert load_checkpoint(written)["epoch"] == 2
    train(2, None, None, "--resume", run, "--epochs", 4, timeout=150)
    straight = tmp_path / "straight"
    train(2, parts / "p2", straight, "--epochs", 4, timeout=150)
    a, b = (torch.load(r / "model.pt", weights_only=True) for r in (run, straight))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_slow_rank_does_not_trip_the_adaptive_deadline(parts, tmp_path):
    """Epochs of about 3 s (a simulated network of 500 ms per message: four exchanges to train, two to evaluate);
    rank 1 sleeps 7 s, about twice the epoch time, once at epoch 3 (the deadline follows the epochs from the third
    on), so rank 0 waits about that long: beyond the floor, which a fixed deadline of that size would have fired
    on, but within 10 x the slowest epoch: the run completes."""
    run = tmp_path / "run"
    train(2, parts / "p2", run, "--epochs", "3", "--sim-net", "10Gbit,500ms", "--comm-timeout-floor", FLOOR,
          "--timeline-epoch", "0", timeout=170, env={"G3_TEST_STALL": "1:3:7"})
    m = metrics(run)
    assert [r["epoch"] for r in m] == [1, 2, 3]
    assert m[2]["epoch_time_s"] > FLOOR   # the slow epoch really waited beyond the floor


def test_killed_mpiexec_leaves_no_rank(parts, tmp_path):
    """SIGKILL of mpiexec while one rank is stopped and the other waits for it: no rank is left after 30 s."""
    run, pids = tmp_path / "run", tmp_path / "pids"
    pids.mkdir()
    proc = _start(_train_cmd(2, parts / "p2", run, "--epochs", "100000", "--checkpoint-every", "2",
                             "--comm-timeout-floor", 120), env={"G3_TEST_PIDFILE": str(pids)})
    _wait_for(run / "checkpoint.pt", proc)
    ranks = [int((pids / f"rank-{r}.pid").read_text()) for r in (0, 1)]
    try:
        os.kill(ranks[1], signal.SIGSTOP)
        proc.kill()
        proc.communicate()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(map(_alive, ranks)):
            time.sleep(0.2)
        left = [pid for pid in ranks if _alive(pid)]
    finally:
        for pid in ranks:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_part_file_not_regular_is_refused(parts, tmp_path, kind):
    """A part file that is a link to /dev/zero, or a FIFO, is refused before any read (it hung the job until an
    outside timeout killed it): one line naming it, on the rank that reads it, and every rank exits."""
    import shutil
    d = tmp_path / "p2"
    shutil.copytree(parts / "p2", d)
    part = d / "part-00001.h5"
    part.unlink()
    if kind == "device":
        part.symlink_to("/dev/zero")
    else:
        os.mkfifo(part)
    p = train(2, d, tmp_path / "run", "--no-verify" if kind == "fifo" else "--verify", check=False, timeout=120)
    assert p.returncode == 1, p.stderr
    lines = error_lines(p.stderr)
    want = "is a device" if kind == "device" else "is a FIFO (named pipe)"
    assert len(lines[1]) == 1 and f"{part}: {want}, expected a regular part file" in lines[1][0], p.stderr


@pytest.mark.parametrize("point", ["partition", "write"])
def test_stopped_rank_ends_the_stream_partitioner(tmp_path, point):
    """``mpiexec -n 3 g3-partition --method stream`` with rank 1 stopped (SIGSTOP, ``G3_TEST_STOP``) before the
    partitioning or before writing the parts: the other ranks end the job after the deadline's floor, exit status
    69, one line each naming the phase; nothing is written."""
    from tests.graphs import random_graph
    from tests.partition_graphs import write
    graph = tmp_path / "g.h5"
    write(random_graph(n=300, f=4, c=3, seed=1), graph)
    cmd = [mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", "data_tools.partition", str(graph),
           "--parts", "3", "--method", "stream", "--out", str(tmp_path / "parts"), "--no-progress",
           "--comm-timeout-floor", str(FLOOR)]
    proc = _start(cmd, env={"G3_TEST_STOP": f"1:{point}"})
    _, err = _finish(proc, timeout=150)
    assert proc.returncode == EXIT_STALLED, err
    lines = [x for x in err.splitlines() if x.startswith("g3-partition: error: [rank ")]
    assert lines and all("communication timeout" in x and "[rank 1]" not in x for x in lines), err
    # rank 1 is named: the waiting ranks ask each other who is still waiting
    phase = ", partitioning" if point == "partition" else "agreement on the output directory (rank 0 makes it), writing"
    assert any(phase in x and "waiting for rank 1 " in x for x in lines), err
    assert not (tmp_path / "parts").exists()


def test_adaptive_deadline_follows_the_input_then_the_slowest_epoch():
    from g3mpi.mpi.deadline import STARTUP_BYTES_PER_S, WARMUP_STEPS, Deadline
    d = Deadline(-1, floor=10, factor=4)
    assert d.adaptive and d.seconds == 10
    d.expect_input(100 * STARTUP_BYTES_PER_S)
    assert d.seconds == 100   # before the first epochs: the largest part's size
    for _ in range(WARMUP_STEPS):
        d.step_done(1.0)
    assert d.seconds == 10    # then the floor, or k x the slowest epoch
    d.step_done(5.0)
    d.step_done(2.0)
    assert d.seconds == 20 and "4 x the slowest epoch 5.00 s" in d.describe("--comm-timeout")
    assert Deadline(0).seconds == 0 and Deadline(7.5).seconds == 7.5 and Deadline(7.5).describe("--x") == "--x 7.5"


def test_comm_timeout_settings():
    """``auto`` (the default, stored as -1), seconds, or 0; anything else is refused naming the setting."""
    from g3mpi.train.config import ConfigError, TrainConfig, config_from
    assert TrainConfig().comm_timeout == -1.0
    assert config_from(None, dict(comm_timeout="auto")).comm_timeout == -1.0
    assert config_from(None, dict(comm_timeout="12")).comm_timeout == 12.0
    assert config_from(None, dict(comm_timeout=0.0)).comm_timeout == 0.0
    for bad in ("-5", "soon", "inf"):
        with pytest.raises(ConfigError, match="comm_timeout"):
            config_from(None, dict(comm_timeout=bad))
    with pytest.raises(ConfigError, match="comm_timeout_floor"):
        config_from(None, dict(comm_timeout_floor=0.0))
