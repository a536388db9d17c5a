"""A user's model file that fails on some ranks only (docs/RELIABILITY.md, "User code that fails"): one stderr
line naming the ranks, the file and its line (besides MPI's own abort line), non-zero exit on every rank within
seconds of the failure, nothing of a finished run written."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.graphs import partition, random_graph
from tests.conftest import mpiexec, tool_env
from tests.train_runs import FAST, MOD, train

SLOW_TESTS = ("test_user_failure_ends_the_job", "test_missing_model_file_said_before_the_partition_is_read",
              "test_resume_refuses_a_changed_model_file",
              "test_undefined_selection_metric_keeps_the_last_model_and_says_so",
              "test_sigterm_ends_a_rank_blocked_in_the_model_files_mpi_call",
              "test_sigterm_to_the_blocked_rank_itself_ends_it", "test_sigterm_ends_an_endless_loop_in_the_model",
              "test_no_rank_outlives_its_launcher",
              "test_watcher_ends_a_main_thread_looping_in_code_outside_g3mpi")
EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"
#: the model file: docs/examples/user_gcn.py's GCN, which fails as G3_UF (CASE:RANK, RANK * for all) asks
MODEL = '''import ctypes, os, sys, time
from mpi4py import MPI
sys.path.insert(0, {examples!r})
from user_gcn import GCN

CASE, _, WHO = os.environ.get("G3_UF", ":").partition(":")
MINE = WHO == "*" or WHO == str(MPI.COMM_WORLD.rank)


def mark():
    with open({stamp!r}, "a") as f:
        f.write(f"{{time.time()}}\\n")


class M(GCN):
    def forward(self, x, key=None):
        if MINE and self.training and key.epoch == 3:
            mark()
            if CASE == "raise":
                raise ValueError("no such layer")
            if CASE == "os_exit":
                os._exit(0)
            if CASE == "sys_exit":
                sys.exit(3)
            if CASE == "c_exit":                # C's _exit: past every Python hook
                ctypes.CDLL(None)._exit(0)
            if CASE == "loop":
                while True: pass  # noqa: E701 - one line: every sample of the loop is at it
        return super().forward(x, key)


def build(graph, in_dim, out_dim, cfg):
    hidden = cfg.hidden
    if MINE and CASE == "shape":
        mark()
        hidden += 1
    if MINE and CASE == "build_exit":
        mark()
        sys.exit(0)
    if MINE and CASE == "barrier":        # a collective on one rank only: it never returns
        mark()
        MPI.COMM_WORLD.Barrier()
    if CASE == "barrier_raise":           # rank 0 blocks in a collective while rank 1 fails its build
        mark()
        if MPI.COMM_WORLD.rank == 0:
            MPI.COMM_WORLD.Barrier()
        raise ValueError("no such layer")
    if MINE and CASE == "build_loop":
        mark()
        while True: pass  # noqa: E701
    return M(graph, in_dim, hidden, out_dim, layers=2, dropout=0.0)
'''
#: case -> (G3_UF, the ranks the line names, what it says)
CASES = {
    "raise_rank1": ("raise:1", "rank 1", "m.py:20: the model raised ValueError: no such layer in training (epoch 3)"),
    "raise_all": ("raise:*", "ranks 0-1", "m.py:20: the model raised ValueError: no such layer in training"),
    "os_exit_rank1": ("os_exit:1", "rank 1", "m.py:22: the model called os._exit(0) (a rank may not leave"),
    "c_exit_rank1": ("c_exit:1", "rank 1", "m.py:26: the model called the C library's _exit(0) (a rank may not"),
    "sys_exit_rank0": ("sys_exit:0", "rank 0", "m.py:24: the model called SystemExit: sys.exit(3)"),
    "build_exit_rank1": ("build_exit:1", "rank 1", "m.py:39: build(graph, in_dim, out_dim, cfg) called SystemExit"),
    "shape_rank1": ("shape:1", "ranks 0-1", "the model's parameters differ between ranks (rank 1 against rank 0): "
                                            "convs.0.bias is [8] on rank 0 but [9] on rank 1"),
}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("uf")
    partition(random_graph(n=120, f=8, c=3, seed=4), 2, root / "p2", seed=1)
    return root / "p2"


def model_file(tmp_path) -> Path:
    path = tmp_path / "m.py"
    path.write_text(MODEL.format(examples=str(EXAMPLES), stamp=str(tmp_path / "stamp")))
    return path


def own_lines(stderr: str) -> list[str]:
    """stderr without MPI's own abort line."""
    return [x for x in stderr.splitlines() if x.strip() and not x.startswith("Abort(")]


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_failure_ends_the_job(case, parts, tmp_path):
    env, ranks, said = CASES[case]
    p = train(2, parts, tmp_path / "run", "--model-file", f"{model_file(tmp_path)}:build", "--epochs", "5",
              "--no-plots", "--comm-timeout-floor", "120", check=False, timeout=120, env={"G3_UF": env})
    end = time.time()
    lines = own_lines(p.stderr)
    assert p.returncode != 0, p.stderr
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"g3-train: error: [{ranks}] ") and said in lines[0], p.stderr
    assert "Traceback" not in p.stderr
    first = min(float(t) for t in (tmp_path / "stamp").read_text().split())
    assert end - first < 10, f"{end - first:.1f} s from the failure to the job's end"
    run = tmp_path / "run"
    assert not any((run / f).exists() for f in ("model.pt", "summary.json", "predictions.h5"))


def test_missing_model_file_said_before_the_partition_is_read(tmp_path):
    """Checked with the configuration: the partition (here none at all) is never opened."""
    p = train(2, tmp_path / "no-parts", tmp_path / "run", "--model-file", f"{tmp_path / 'nope.py'}:build",
              check=False, timeout=120)
    assert p.returncode == 2 and own_lines(p.stderr) == [
        f"g3-train: error: [ranks 0-1] {tmp_path / 'nope.py'}: no such file (--model-file takes PATH.py:FUNCTION)"]


def test_resume_refuses_a_changed_model_file(parts, tmp_path):
    """config.toml records the model file's SHA-256; --resume after an edit names the file (same shapes, so
    nothing else would notice), and --allow-changed-model resumes anyway."""
    path = model_file(tmp_path)
    run = tmp_path / "run"
    train(2, parts, run, "--model-file", f"{path}:build", "--epochs", "2", "--no-plots", timeout=120)
    assert "model_file_sha256 = " in (run / "config.toml").read_text()
    path.write_text(path.read_text() + "# edited\n")
    p = train(2, None, None, "--resume", run, "--epochs", "3", check=False, timeout=120)
    assert p.returncode == 2 and own_lines(p.stderr) == [
        f"g3-train: error: [ranks 0-1] {path}: the model file changed since the run in {run} started (its SHA-256 "
        f"differs from model_file_sha256 in {run}/config.toml); restore it, or resume with --allow-changed-model"]
    train(2, None, None, "--resume", run, "--epochs", "3", "--allow-changed-model", "--no-plots", timeout=120)
    assert (run / "summary.json").exists()


def test_undefined_selection_metric_keeps_the_last_model_and_says_so(tmp_path):
    """--task binary --metric roc_auc with no positives in val: ROC-AUC is undefined in every evaluation; the
    run keeps the last evaluated model (best_epoch the last epoch, its accuracy in the summary) and warns once."""
    g = random_graph(n=120, f=8, c=2, seed=4)
    g.labels[g.val_mask] = 0
    partition(g, 2, tmp_path / "p2", seed=1)
    p = train(2, tmp_path / "p2", tmp_path / "run", "--task", "binary", "--metric", "roc_auc", "--epochs", "3",
              "--no-plots", timeout=120)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].endswith(
        "WARNING g3mpi.train: val roc_auc is undefined at epoch 1 (e.g. the validation split has one class only): "
        "until it is defined, the model of the last evaluated epoch is kept and --patience counts nothing"), p.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["best_epoch"] == 3 and s["val_roc_auc"] is None and s["val_acc"] is not None


@pytest.mark.parametrize("case", ["barrier:0", "barrier_raise:*"])
def test_sigterm_ends_a_rank_blocked_in_the_model_files_mpi_call(case, parts, tmp_path):
    """build calls a barrier on rank 0 only (and, barrier_raise, raises on rank 1: a failed start-up): rank 0
    never comes back from MPI; SIGTERM to mpiexec ends the job (rank 1 gives up its wait, the abort ends rank 0)
    within 15 s, one line, no rank left."""
    with started(parts, tmp_path, case, epochs=3) as p:
        err, took = sigterm(p)
    assert p.returncode != 0 and took < 15, (p.returncode, took, err)
    lines = own_lines(err)
    assert len(lines) == 1 and lines[0].startswith("g3-train: error: [rank 1] SIGTERM received: ") \
        and "waiting for rank 0 in the start-up check 'model file'" in lines[0], err
    left = left_after(rank_pids(tmp_path).values(), 30)
    assert not left, f"ranks {left} left 30 s after mpiexec"


def test_sigterm_to_the_blocked_rank_itself_ends_it(parts, tmp_path):
    """build calls a barrier on rank 0 only; SIGTERM to rank 0's process (not mpiexec): its Python handler cannot
    run while MPI blocks, so the watcher thread ends it STUCK_GRACE_S later, with one line, within 15 s."""
    with started(parts, tmp_path, "barrier:0", epochs=3) as p:
        rank0 = rank_pids(tmp_path)[0]
        t0 = time.monotonic()
        os.kill(rank0, signal.SIGTERM)
        while alive(rank0) and time.monotonic() - t0 < 30:
            time.sleep(0.1)
        took = time.monotonic() - t0
        _, err = p.communicate(timeout=30)
    assert took < 15 and p.returncode != 0, (took, p.returncode, err)
    assert "g3-train: error: [rank 0] SIGTERM received, but the main thread has been blocked in a C call" in err, err


@contextlib.contextmanager
def started(parts, tmp_path, case: str, epochs: int = 5):
    """mpiexec -n 2 g3-train with the model file failing as ``case`` asks, handed over once a rank has reached the
    failure (its stamp) and a second more; each rank's pid in tmp_path/pids. mpiexec is killed on leaving if it
    is still there."""
    (tmp_path / "pids").mkdir()
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", MOD, *FAST, "--parts", str(parts), "--out",
           str(tmp_path / "run"), "--model-file", f"{model_file(tmp_path)}:build", "--epochs", str(epochs),
           "--comm-timeout-floor", "120"]
    env = {**tool_env(), "G3_UF": case, "G3_TEST_PIDFILE": str(tmp_path / "pids")}
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    try:
        end = time.monotonic() + 120
        while not (tmp_path / "stamp").exists() and time.monotonic() < end and p.poll() is None:
            time.sleep(0.1)
        time.sleep(1.0)
        yield p
    finally:
        if p.poll() is None:
            p.kill()


def sigterm(p: subprocess.Popen, pid: int | None = None) -> tuple[str, float]:
    """SIGTERM to ``pid`` (None: to mpiexec, ``p``), then mpiexec's stderr once it has ended (30 s at most) and the
    seconds from the signal to its end."""
    t0 = time.monotonic()
    os.kill(p.pid if pid is None else pid, signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    return err, time.monotonic() - t0


def rank_pids(tmp_path) -> dict[int, int]:
    return {int(f.stem.split("-")[1]): int(f.read_text()) for f in (tmp_path / "pids").iterdir()}


def left_after(pids, seconds: float) -> list[int]:
    """The ranks of ``pids`` still alive after waiting up to ``seconds`` for them to end."""
    end = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.2)
    return [pid for pid in pids if alive(pid)]


@pytest.mark.parametrize("case, to", [("build_loop:*", "mpiexec"), ("loop:*", "mpiexec"), ("loop:1", "rank 1")])
def test_sigterm_ends_an_endless_loop_in_the_model(case, to, parts, tmp_path):
    """An endless Python loop in build or forward (on every rank, or on rank 1 only and SIGTERM to it): the
    Python handler runs, but the loop never reaches an epoch's end; the watcher thread ends the job
    STUCK_GRACE_S after the signal, one line naming the ranks, the file's line and the function, within 15 s,
    no rank left, nothing of a finished run written."""
    with started(parts, tmp_path, case) as p:
        pids = rank_pids(tmp_path)
        err, took = sigterm(p, None if to == "mpiexec" else pids[1])
    assert p.returncode != 0 and took < 15, (p.returncode, took, err)
    lines = own_lines(err)
    ranks, where = ("ranks 0-1", "m.py:50, in build") if case.startswith("build") else \
        ("ranks 0-1" if case.endswith("*") else "rank 1", "m.py:28, in forward")
    assert len(lines) == 1 and re.fullmatch(
        rf"g3-train: error: \[{ranks}\] SIGTERM received over 10 s ago, but the main thread is still running the "
        rf"model's code at {re.escape(str(tmp_path))}/{where} \(an endless loop\?\) and cannot reach the epoch's "
        rf"end: exiting", lines[0]), err
    assert not left_after(pids.values(), 5)
    run = tmp_path / "run"
    assert not any((run / f).exists() for f in ("model.pt", "summary.json", "predictions.h5", "checkpoint.pt"))


@pytest.mark.parametrize("case, killed", [("barrier:0", "mpiexec"), ("barrier:0", "mpiexec and proxy"),
                                          ("loop:*", "mpiexec and proxy")])
def test_no_rank_outlives_its_launcher(case, killed, parts, tmp_path):
    """SIGKILL to mpiexec (its proxy then kills the ranks), or to mpiexec and Hydra's proxy, the ranks' parent
    (a launcher that dies: nobody kills them), while rank 0 sits in a barrier of its own and rank 1 waits for
    it, or every rank loops in forward: no rank is left 30 s later."""
    try:
        with started(parts, tmp_path, case) as p:
            pids = rank_pids(tmp_path)
            proxy = int(Path(f"/proc/{pids[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
            t0 = time.monotonic()
            p.kill()
            if killed != "mpiexec":
                os.kill(proxy, signal.SIGKILL)
            p.communicate(timeout=30)
            left = left_after(pids.values(), 30)
    finally:
        for pid in rank_pids(tmp_path).values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"ranks {left} left {time.monotonic() - t0:.1f} s after the launcher"


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_c_library_exits_through_ctypes_raise_inside_the_guard():
    """ctypes.CDLL(None)._exit(0) from the model's code (here: this file) raises UserExit naming the C function;
    after the block the cached lookup is the real function again (not called here: it would end pytest)."""
    import ctypes
    from g3mpi.train.userfile import UserExit, exits_guarded
    libc = ctypes.CDLL(None)
    with exits_guarded():
        with pytest.raises(UserExit) as e:
            libc._exit(0)
        with pytest.raises(UserExit):
            ctypes.CDLL(None)["quick_exit"](ctypes.c_int(4))
    assert (e.value.code, e.value.via) == (0, "the C library's _exit")
    assert libc._exit._active() is False and ctypes.CDLL(None)._exit.__class__.__name__ != "_GuardedCExit"


LOOPING = '''import os, signal
from g3mpi.mpi.stop import StopSignals
with StopSignals(stuck_grace=0.5):
    os.kill(os.getpid(), signal.SIGUSR1)
    while True: pass  # noqa: E701
'''


def test_watcher_ends_a_main_thread_looping_in_code_outside_g3mpi(tmp_path):
    """No MPI: the handler runs, the loop (a file outside g3mpi and the Python installation) goes on; the watcher
    ends the process stuck_grace later (its checks are a second apart), status 128 + SIGUSR1, one line."""
    (tmp_path / "loop.py").write_text(LOOPING)
    p = subprocess.run([sys.executable, str(tmp_path / "loop.py")], capture_output=True, text=True, timeout=30,
                       env=tool_env())
    lines = p.stderr.splitlines()
    assert p.returncode == 128 + signal.SIGUSR1 and len(lines) == 1 and re.fullmatch(
        rf"g3-train: error: \[rank 0\] SIGUSR1 received over 0.5 s ago, but the main thread is still running the "
        rf"model's code at {re.escape(str(tmp_path / 'loop.py'))}:5, in <module> \(an endless loop\?\) and cannot "
        rf"reach the epoch's end: exiting", lines[0]), (p.returncode, p.stderr)
