"""Serial pieces of the reliability layer: the watchdog's deadline, the abort's wait for stderr, checkpoint
atomicity and loading, the fault hooks' parsing, the soak's RSS analysis, the stop-signal handler (no mpiexec:
fast)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from g3mpi.mpi import abort as abort_mod
from g3mpi.mpi.watchdog import decode_text, encode_text
from g3mpi.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from g3mpi.train.faults import TestHooks, first_nonfinite
from g3mpi.train.soak import rss_growth
from g3mpi.mpi.stop import StopSignals
from tests.conftest import tool_env

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_a_full_disk_writing_model_or_checkpoint_says_so", "test_watchdog_collectives_and_point_to_point",
              "test_watchdog_fires_with_names")

#: the start of both watchdog scripts: a Watchdog on COMM_SELF whose abort raises Fired, and pickle refused (the
#: control messages travel as text: a pickle anywhere in them, mpi4py's lowercase calls included, fails the test)
WATCHDOG_PRELUDE = r"""
import numpy as np
from mpi4py import MPI
from g3mpi.mpi.watchdog import Watchdog, decode_text, encode_text
from tests.mpi_watchdog import refuse_pickle

refuse_pickle()

class Fired(Exception):
    pass

def boom(code):
    raise Fired

comm = MPI.COMM_SELF
"""

WATCHDOG = "import time\n" + WATCHDOG_PRELUDE + r"""
buf = np.zeros(4)
req = comm.Irecv(buf, source=0, tag=5)           # nobody ever sends
wd = Watchdog(comm, 0.5, prog="t", abort=boom)
wd.context = "epoch 9"
t0 = time.monotonic()
try:
    wd.waitsome([req], [3], "sage1.bwd")
except Fired:
    print("FIRED", round(time.monotonic() - t0, 2))
req.Cancel()
req.Wait()
# a request that completes is returned at once
sreq = comm.Isend(np.ones(4), dest=0, tag=6)
rreq = comm.Irecv(buf, source=0, tag=6)
print("DONE", wd.waitsome([rreq], [0], "x.fwd"), buf.sum())
sreq.Wait()
off = Watchdog(comm, 0.0)
print("ACTIVE", off.active, wd.active)
"""


def test_watchdog_fires_with_names():
    p = subprocess.run([sys.executable, "-c", WATCHDOG], capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    fired = [x for x in p.stdout.splitlines() if x.startswith("FIRED")]
    assert fired and 0.5 <= float(fired[0].split()[1]) < 5, p.stdout
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("t: error: [rank 0] communication timeout: blocked")
    assert "waiting for rank 3 in the halo exchange of layer 'sage1', backward direction, epoch 9" in line
    assert "DONE [0] 4.0" in p.stdout and "ACTIVE False True" in p.stdout


WATCHDOG_CALLS = WATCHDOG_PRELUDE + r"""
TEXTS = [None, "", "é", "→", "é→x" * 20000]     # None apart from "", non-ASCII, 120 kB
for timeout in (0.0, 5.0):                      # blocking calls, then the deadline-polled ones: same results
    wd = Watchdog(comm, timeout, prog="t", abort=boom)
    wd.barrier("b")
    got = np.zeros((1, 2), dtype=np.int64)
    wd.alltoall(np.array([[3, 4]], dtype=np.int64), got, "a")
    print("CALLS", timeout, got.tolist())
    for i, text in enumerate(TEXTS):
        buf, status = np.empty(1 << 20, dtype=np.uint8), MPI.Status()
        rreq = comm.Irecv([buf, MPI.BYTE], source=0, tag=9)     # a send to oneself needs its receive posted
        wd.send_text(text, 0, 9, "s")
        rreq.Wait(status)
        sent = decode_text(buf[:status.Get_count(MPI.BYTE)])
        data = encode_text(text)
        sreq = comm.Isend([data, MPI.BYTE], dest=0, tag=10)
        same = [wd.allgather_text(text, "g") == [text], wd.bcast_text(text, 0, "c") == text, sent == text,
                wd.recv_text(0, 10, "r") == text]
        sreq.Wait()
        print("TEXT", timeout, i, same)
wd = Watchdog(comm, 0.3, prog="t", abort=boom)
wd.context = "after epoch 2"
try:
    wd.recv_text(0, 11, "ranks' turns writing predictions.h5")   # nobody sends
except Fired:
    print("FIRED")
"""


def test_watchdog_collectives_and_point_to_point():
    """The start-up's and the outputs' waits: with a deadline they return what the blocking calls return, text
    (None, empty, non-ASCII, long) arrives as sent without pickle, and a receive that never comes fires naming
    the sender and the wait."""
    p = subprocess.run([sys.executable, "-c", WATCHDOG_CALLS], capture_output=True, text=True, env=tool_env(),
                       timeout=120)
    assert p.returncode == 0, p.stderr
    calls = [x for x in p.stdout.splitlines() if x.startswith("CALLS")]
    assert calls == ["CALLS 0.0 [[3, 4]]", "CALLS 5.0 [[3, 4]]"], p.stdout
    texts = [x for x in p.stdout.splitlines() if x.startswith("TEXT ")]
    assert texts == [f"TEXT {t} {i} [True, True, True, True]" for t in (0.0, 5.0) for i in range(5)], p.stdout
    assert "FIRED" in p.stdout
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("t: error: [rank 0] communication timeout: blocked")
    assert "waiting for rank 0 in the ranks' turns writing predictions.h5, after epoch 2; aborting the job" in line


def test_watchdog_text_encoding():
    """One encoding for every text message: None and "" stay apart, UTF-8 round-trips, a foreign buffer is
    refused instead of read as text."""
    for text in (None, "", "é", "→", "x" * 100_000):
        data = encode_text(text)
        assert data.dtype == np.uint8 and data.flags.writeable
        assert decode_text(data) == text and type(decode_text(data)) is type(text)
    assert encode_text(None).tobytes() != encode_text("").tobytes()
    assert encode_text("→").size == 4                       # the flag byte and 3 bytes of UTF-8
    with pytest.raises(ValueError, match="not a watchdog text message"):
        decode_text(np.frombuffer(b"\x80\x04N.", dtype=np.uint8))   # a pickle of None


def test_abort_waits_until_stderr_is_read(tmp_path, monkeypatch):
    """abort_job writes its line in one write, aborts only after the pipe's reader took all of it (hydra would
    otherwise drop it when the job is torn down), and does not wait on a file."""
    r, w = os.pipe()
    assert abort_mod.unread_bytes(w) == 0
    os.write(w, b"12345")
    assert abort_mod.unread_bytes(w) == 5 and abort_mod.unread_bytes(r) == 5   # either end
    os.read(r, 5)
    assert abort_mod.unread_bytes(w) == 0
    with open(tmp_path / "f", "w") as f:
        assert abort_mod.unread_bytes(f.fileno()) is None

    saved = os.dup(2)
    calls = []
    try:
        os.dup2(w, 2)
        reader_done = threading.Event()
        got = []

        def reader():   # a slow reader, like a launcher proxy busy elsewhere
            time.sleep(0.3)
            got.append(os.read(r, 1 << 16))
            reader_done.set()
        threading.Thread(target=reader).start()

        class Comm:
            rank = 3
        abort_mod.abort_job(Comm(), "t: error: [rank 3] boom", code=7,
                            abort=lambda code: calls.append((code, reader_done.is_set())))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    assert calls == [(7, True)]            # aborted once, after the reader had the line
    assert got == [b"t: error: [rank 3] boom\n"]

    # not a pipe: no wait
    slept = []
    monkeypatch.setattr(abort_mod.time, "sleep", slept.append)
    with open(tmp_path / "err", "w") as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            abort_mod.abort_job(Comm(), "x", abort=lambda code: calls.append(code))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    assert calls[-1] == 1 and slept == []
    assert (tmp_path / "err").read_text() == "x\n"
    os.close(r)
    os.close(w)

def test_checkpoint_atomic_and_weights_only(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    good = dict(format="g3mpi-checkpoint", version=1, epoch=4, model={"w": torch.ones(3)}, optimizer={},
                rng=torch.get_rng_state(), best=dict(val_acc=0.5, epoch=3, accs={}, state=None), since_best=0,
                config={}, partition=dict(partition_id="x", num_parts=2, method="metis", files={}))
    save_checkpoint(path, good)
    before = path.read_bytes()
    # a write that dies half-way leaves the previous checkpoint and no temporary file
    real_save = torch.save

    def dying_save(obj, f):
        real_save({"half": torch.zeros(1000)}, f)
        raise OSError("disk full")
    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError):
        save_checkpoint(path, dict(good, epoch=6))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]
    assert load_checkpoint(path)["epoch"] == 4
    # truncated, pickled objects, wrong format: refused with the file named
    (tmp_path / "cut.pt").write_bytes(before[: len(before) // 2])
    with pytest.raises(CheckpointError, match="cut.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "cut.pt")
    # a flipped byte inside a tensor loaded silently (torch.load does not check the archive's CRC-32s; audit)
    flipped = bytearray(before)
    flipped[before.index(torch.ones(3).numpy().tobytes())] ^= 0xFF
    (tmp_path / "flip.pt").write_bytes(flipped)
    with pytest.raises(CheckpointError, match=r"flip.pt: checksum mismatch in record '.*/data/\d+' \(file corrupt\)"):
        load_checkpoint(tmp_path / "flip.pt")
    torch.save({"format": "g3mpi-checkpoint", "evil": Path("/")}, tmp_path / "pickle.pt")
    with pytest.raises(CheckpointError, match="pickle.pt: not a readable checkpoint"):
        load_checkpoint(tmp_path / "pickle.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a g3mpi checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")


def test_fault_hooks(tmp_path, monkeypatch):
    assert TestHooks.from_env(0, {}) == TestHooks(rank=0)
    h = TestHooks.from_env(1, {"G3_TEST_STALL": "1:3:2.5", "G3_TEST_NAN": "1:4:convs.0.bias",
                                "G3_TEST_PIDFILE": str(tmp_path)})
    assert h.stall == (3, 2.5) and h.nan == (4, "convs.0.bias")
    assert (tmp_path / "rank-1.pid").read_text().strip().isdigit()
    assert TestHooks.from_env(0, {"G3_TEST_STALL": "1:3:2.5"}).stall is None
    assert TestHooks.from_env(2, {"G3_TEST_STALL": "2:predictions:1"}).stall == ("predictions", 1.0)
    every = TestHooks.from_env(1, {"G3_TEST_STALL": "*:every:0.5"})
    slept = []
    monkeypatch.setattr("g3mpi.train.faults.time.sleep", slept.append)
    for epoch in (1, 2, 9):
        every.epoch_start(epoch)
    every.stall_at("predictions")
    assert slept == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="G3_TEST_STALL.*startup, evaluation, checkpoint, predictions"):
        TestHooks.from_env(0, {"G3_TEST_STALL": "1:later:2"})
    with pytest.raises(ValueError, match="G3_TEST_NAN"):
        TestHooks.from_env(0, {"G3_TEST_NAN": "x"})
    lin = torch.nn.Linear(2, 2)
    lin(torch.ones(1, 2)).sum().backward()
    named = list(lin.named_parameters())
    assert first_nonfinite(torch.tensor(1.0), named) is None
    assert first_nonfinite(torch.tensor(float("nan")), named) == "loss"
    TestHooks(nan=(2, "bias")).corrupt_grads(2, named)
    assert first_nonfinite(torch.tensor(1.0), named) == "bias"


def test_nonfinite_message_says_where():
    """The line about non-finite values says whether the logits were bad already, and names summed gradients beyond
    2^64 (finite, but their squares overflow Adam's second moments, which froze parameters silently)."""
    from g3mpi.train.trainer import Trainer
    msg = Trainer._nonfinite_message
    assert msg(3, "loss", 1, 1, logits=(2, 50)) == (
        "non-finite value (NaN or Inf) in the loss at epoch 3 on this rank (already in the logits of 2 of its 50 "
        "nodes); training stopped, the last good checkpoint is kept")
    assert "(its logits are finite: the loss itself is not)" in msg(3, "loss", 1, 1, logits=(0, 50))
    assert msg(4, None, 0, 0, 3e30) == (
        "the summed gradients reach 3e+30 at epoch 4, beyond 2^64 = 1.8e19 (their squares overflow float32: Adam's "
        "second moments would become infinite); training stopped, the last good checkpoint is kept")
    assert msg(4, None, 0, 0, float("inf")) == (
        "the summed gradients are not finite at epoch 4 (overflow); training stopped, the last good checkpoint is kept")


def test_soak_analysis():
    flat = [dict(epoch=e, rank_rss_bytes=[100 + (e % 3), 200]) for e in range(1, 301)]
    res = rss_growth(flat, warmup=50, window=50)
    assert res["max_growth"] == 0 and res["epochs"] == 300
    leak = [dict(epoch=e, rank_rss_bytes=[100 + e // 10, 200]) for e in range(1, 301)]
    assert rss_growth(leak, warmup=50, window=50)["ranks"][0]["growth"] > 0.15
    with pytest.raises(ValueError, match=r"need at least 100 epochs after the warm-up \(50\); the run has 70 after it"):
        rss_growth(flat[:120], warmup=50, window=50)


def test_soak_reads_a_run_cut_by_a_crash(tmp_path):
    """The soak check reads metrics.jsonl as the plots do: a last line cut short by a crash is skipped. Before,
    it stopped with a JSON error naming a wrong line."""
    from g3mpi.train.soak import main as soak
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(dict(epoch=e, rank_rss_bytes=[100, 200])) for e in range(1, 201)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n" + lines[0][:15])
    assert soak([str(run)]) == 0


STOP = r"""
import os, signal, sys, time
from g3mpi.mpi.stop import StopSignals
second = signal.SIGTERM if sys.argv[1] == "again" else signal.SIGUSR1
window = float(sys.argv[2])
with StopSignals(repeat_window=window) as stop:
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.1)
    print(stop.signal_name, flush=True)
    os.kill(os.getpid(), second)        # within the window: the same request (e.g. slurmstepd + mpiexec)
    time.sleep(0.1)
    print("still", stop.signal_name, flush=True)
    time.sleep(window)
    os.kill(os.getpid(), second)        # later: a deliberate second signal ends the process
    time.sleep(5)
    print("survived", flush=True)
"""

TWICE = r"""
import os, signal, time
from g3mpi.mpi.stop import StopSignals
with StopSignals() as stop:             # the default window
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print(stop.signal_name, flush=True)
"""


def test_time_limit_is_a_stop_request_without_a_signal():
    stop = StopSignals()
    stop.stop_after(0.3)
    assert not stop.time_up and stop.signal_name is None
    time.sleep(0.35)
    assert stop.time_up and stop.signal_name is None and stop.limit_text == "the time limit (--time-limit 0.3)"
    never = StopSignals()
    never.stop_after(0)
    assert not never.time_up


def test_stop_signals_record_then_restore():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    with StopSignals() as stop:
        assert stop.signal_name is None
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)   # the handler runs between bytecodes of the main thread
        assert stop.signal_name == "SIGTERM"
    assert {s: signal.getsignal(s) for s in before} == before
    # off the main thread nothing is installed (Python allows handlers only there)
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("s", StopSignals().__enter__()))
    t.start()
    t.join()
    assert out["s"].signal_name is None and not out["s"]._previous


def test_two_signals_together_are_one_stop_request():
    """SIGTERM from slurmstepd and the copy mpiexec forwards arrive together: one request, no exit at once."""
    p = subprocess.run([sys.executable, "-c", TWICE], capture_output=True, text=True, timeout=30, env=tool_env())
    assert p.returncode == 0 and p.stdout.splitlines() == ["SIGTERM"], (p.returncode, p.stdout, p.stderr)


@pytest.mark.parametrize("second", ["again", "same"])
def test_a_later_second_stop_signal_ends_the_process(second):
    p = subprocess.run([sys.executable, "-c", STOP, second, "0.5"], capture_output=True, text=True, timeout=30,
                       env=tool_env())
    assert p.stdout.splitlines() == ["SIGUSR1", "still SIGUSR1"], (p.stdout, p.stderr)
    assert p.returncode == -(signal.SIGTERM if second == "again" else signal.SIGUSR1)


def test_run_directory_write_failures_name_the_file(tmp_path, monkeypatch):
    """A full disk while writing metrics.jsonl, model.pt or summary.json gave tracebacks without the file's name
    (audit); each is now an OutputError naming it, which g3-train reports in one line per rank."""
    from g3mpi.train.rundir import MetricsLog, OutputError, save_state_dict, write_json_atomic
    log = MetricsLog("/dev/full")                     # every write: ENOSPC
    with pytest.raises(OutputError, match="/dev/full: cannot be written: No space left on device"):
        log.write({"epoch": 1})
    with pytest.raises(OutputError, match="nodir/summary.json: cannot be written"):
        write_json_atomic(tmp_path / "nodir" / "summary.json", {"a": 1})

    def full(*a, **k):
        raise RuntimeError("basic_ios::clear: iostream error")
    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OutputError, match="model.pt: cannot be written: basic_ios::clear"):
        save_state_dict(tmp_path / "model.pt", {"w": torch.ones(2)})
    assert not list(tmp_path.iterdir())               # nothing half-written left behind


def test_resume_rewinds_metrics_past_lines_that_are_not_records(tmp_path, monkeypatch):
    """A metrics.jsonl line that is valid JSON but not a record (``[1, 2]``, a string) stopped --resume with an
    AttributeError traceback on rank 0 while preparing the run directory, and the other ranks, waiting for rank 0's
    word, hung unless started with ``python -m mpi4py`` (audit). Such lines are skipped like a line cut short,
    and any other failure there is rank 0's one-line error, which every rank reports."""
    from mpi4py import MPI

    from g3mpi.train import TrainConfig, prepare_run_dir
    from g3mpi.train import rundir as rundir_mod
    from g3mpi.train.rundir import read_metrics, rewind_metrics
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps(dict(epoch=e, loss=1.0 / e)) for e in (1, 2, 3)]
    path.write_text("\n".join([lines[0], "[1, 2]", '"x"', lines[1], '{"epoch": "3"}', lines[2]]) + "\n")
    rewind_metrics(path, 2)
    assert path.read_text().splitlines() == lines[:2]
    assert [r["epoch"] for r in read_metrics(path)] == [1, 2]

    def broken(*a, **k):
        raise TypeError("unexpected")
    monkeypatch.setattr(rundir_mod, "rewind_metrics", broken)
    cfg = TrainConfig(parts=str(tmp_path), out=str(tmp_path), epochs=4)
    assert prepare_run_dir(MPI.COMM_SELF, cfg, resume_epoch=2) == (
        None, f"{tmp_path}: preparing the run directory failed: TypeError: unexpected")


def test_json_outputs_are_strict_and_atomic(tmp_path, monkeypatch):
    """Every JSON file (summary.json, g3-bench's results, bench_partition's tables) is written by one function:
    non-finite floats become null instead of ``NaN`` (not JSON) or a ValueError after a whole benchmark (g3-bench
    refused them), and a write that fails leaves the previous file as it was (bench_partition rewrote its file in
    place after every graph, so an interrupt there lost every earlier row)."""
    import json as jsonlib

    from g3mpi.bench.common import write_json as bench_write_json
    from g3mpi.format import json_text, write_json
    doc = {"b": [1.5, float("nan"), {"x": float("inf")}], "a": (float("-inf"), "é")}
    assert jsonlib.loads(json_text(doc)) == {"a": [None, "é"], "b": [1.5, None, {"x": None}]}
    assert json_text({"b": 1, "a": 2}, indent=None, sort_keys=False) == '{"b": 1, "a": 2}'
    path = tmp_path / "out.json"
    bench_write_json(path, doc)
    assert jsonlib.loads(path.read_text(encoding="utf-8"))["b"][1] is None
    before = path.read_bytes()

    class Unwritable:
        pass
    with pytest.raises(TypeError):
        write_json(path, {"rows": [1, 2], "z": Unwritable()})
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_full_disk_writing_model_or_checkpoint_says_so(tmp_path):
    """torch.save writing straight to a file that cannot grow (here the file-size limit, EFBIG, as a full disk is
    ENOSPC) failed with its own words, "[enforce fail at inline_container.cc:672] . unexpected pos 832 vs 726",
    for model.pt and checkpoint.pt. The archive is now made in memory and written as bytes: the system's words,
    and no file or temporary left behind."""
    code = ("import resource, sys, torch\n"
            "from g3mpi.train.rundir import OutputError, save_state_dict\n"
            "from g3mpi.train.checkpoint import save_checkpoint\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (10000, resource.RLIM_INFINITY))\n"
            "d = sys.argv[1]\n"
            "try:\n"
            "    save_state_dict(d + '/model.pt', {'w': torch.ones(100000)})\n"
            "except OutputError as e:\n"
            "    print(e)\n"
            "try:\n"
            "    save_checkpoint(d + '/checkpoint.pt', {'w': torch.ones(100000)})\n"
            "except OSError as e:\n"
            "    from g3mpi.format.errors import failure_reason\n"
            "    print(failure_reason(e))\n")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=tool_env(),
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [f"{tmp_path / 'model.pt'}: cannot be written: File too large", "File too large"]
    assert list(tmp_path.iterdir()) == []


#: a value other than TrainConfig's default for every setting that trains another model (a resume must refuse it)
MODEL_SETTINGS = dict(model="sage", layers=3, hidden=32, heads=4, out_heads=2, dropout=0.25, attn_dropout=0.1,
                      activation="elu", optimizer="sgd", lr=0.1, weight_decay=0.0, momentum=0.9, seed=4,
                      residual=True, norm="batch", input_linear=True, output_linear=True, ffn=True, jk="cat", k=3,
                      alpha=0.2, theta=0.9, task="binary", metric="f1_macro",
                      model_file="model.py:build", decoder="hadamard", embed_dim=32, negatives=3,
                      node_embedding=8, num_bases=2, num_blocks=2)
#: settings a resume may change (how fast, how long, what is written): the model trained stays the same
RUN_SETTINGS = dict(epochs=30, eval_every=3, patience=5, threads=2, schedule="blocking", chunk_rows=7,
                    sim_net="10Gbit,20us", input_cache=False, remat="cheap", release_memory=True, verify=False,
                    progress=False, plots=False, log_level="WARNING", checkpoint_every=2, comm_timeout=5.0,
                    time_limit=60.0, timeline_epoch=0, device="auto", cuda_aware="off", oversubscribe_gpus=True,
                    comm_timeout_floor=5.0, comm_timeout_factor=3.0, precision="bf16-mixed", halo_dtype="float16",
                    debug=True, model_file_sha256="f" * 64, allow_changed_model=True)


def test_check_compatible_refuses_each_model_setting_and_changed_part_files():
    """``--resume`` refuses a checkpoint whose configuration trains another model, naming the setting, for each of
    those settings (the seed too: it keys dropout), accepts changes to every other setting, and refuses a
    partition of the same ID whose part files changed (a mutation run found both checks untested: dropping the
    seed from the checked settings, or the file comparison, passed every test)."""
    from dataclasses import replace

    from g3mpi.train.checkpoint import check_compatible, make_checkpoint
    from g3mpi.train.config import TrainConfig
    meta = dict(partition_id="p1", num_parts=2, method="metis", graph_sha256="g" * 64,
                files={"node_map.h5": "a" * 64, "part-00000.h5": "b" * 64, "part-00001.h5": "c" * 64})
    cfg = TrainConfig(parts="PARTS", epochs=10)
    ck = make_checkpoint(epoch=4, model={}, optimizer={}, best=dict(score=0.5, epoch=4, accs={}, state=None),
                         since_best=0, last_loss=1.0, cfg=cfg, meta=meta)
    assert set(MODEL_SETTINGS) | set(RUN_SETTINGS) | {"parts", "out", "force", "init_from"} == \
        {f for f in TrainConfig.__dataclass_fields__}
    check_compatible("ck.pt", ck, cfg, meta)
    check_compatible("ck.pt", ck, replace(cfg, **RUN_SETTINGS), meta)
    for k, v in MODEL_SETTINGS.items():
        want = f"ck.pt: incompatible configuration: {k} = {getattr(cfg, k)!r} in the checkpoint but {v!r} now"
        with pytest.raises(CheckpointError) as e:
            check_compatible("ck.pt", ck, replace(cfg, **{k: v}), meta)
        assert str(e.value) == want
    changed = dict(meta, files=dict(meta["files"], **{"part-00001.h5": "d" * 64}))
    with pytest.raises(CheckpointError) as e:
        check_compatible("ck.pt", ck, cfg, changed)
    assert str(e.value) == "ck.pt: the partition's files changed since the checkpoint: part-00001.h5"
    with pytest.raises(CheckpointError) as e:
        check_compatible("ck.pt", ck, replace(cfg, epochs=3), meta)
    assert str(e.value) == "ck.pt: already at epoch 4, beyond --epochs 3"


def test_run_lock_one_holder_at_a_time(tmp_path, monkeypatch, caplog):
    """RUN/.g3-train.lock (flock): a second holder is refused naming the first one's process; a lock file left
    by a killed run (not locked) is taken over; a directory holding only such a file is an empty run directory; a
    file removed by its holder while we locked it is not held; where the file system has no locks, the run goes
    on with a warning and leaves no file."""
    import errno
    import fcntl
    import socket

    from mpi4py import MPI

    from g3mpi.train import TrainConfig, prepare_run_dir
    from g3mpi.train.rundir import LOCK_NAME, RunDirBusy, RunLock
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text("4242 gone-host\n")          # left by a run that was killed
    with RunLock() as first:
        first.acquire(run)
        assert (run / LOCK_NAME).read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        with pytest.raises(RunDirBusy) as e:
            RunLock().acquire(run)
        assert str(e.value) == (f"{run}: another g3-train run is using this run directory (process {os.getpid()} on "
                                f"{socket.gethostname()} holds {LOCK_NAME}); wait for it to end, or choose another "
                                "--out")
        cfg = TrainConfig(parts=str(tmp_path), out=str(run), epochs=4, force=True)
        with RunLock() as second:
            assert prepare_run_dir(MPI.COMM_SELF, cfg, lock=second) == (None, str(e.value))
            assert prepare_run_dir(MPI.COMM_SELF, cfg, resume_epoch=2, lock=second) == (None, str(e.value))
    assert list(run.iterdir()) == []
    (run / LOCK_NAME).write_text("4242 gone-host\n")
    with RunLock() as lock:   # a new run (no --force) in a directory with only a stale lock file in it
        assert prepare_run_dir(MPI.COMM_SELF, cfg.replace(force=False), lock=lock) == (run, None)
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME, "config.toml"]
    assert [p.name for p in run.iterdir()] == ["config.toml"]

    real_flock, removed = fcntl.flock, []

    def holder_leaves(fd, op):   # the previous holder removes the file between our open and our lock
        real_flock(fd, op)
        if not removed:
            removed.append((run / LOCK_NAME).unlink())
    monkeypatch.setattr(fcntl, "flock", holder_leaves)
    with RunLock() as lock:
        lock.acquire(run)         # the file it locked was gone: it locks the one in place instead
        monkeypatch.setattr(fcntl, "flock", real_flock)
        assert removed and (run / LOCK_NAME).exists()
        with pytest.raises(RunDirBusy):
            RunLock().acquire(run)

    def no_locks(fd, op):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))
    monkeypatch.setattr(fcntl, "flock", no_locks)
    with RunLock() as lock:
        lock.acquire(run)
    assert [p.name for p in run.iterdir()] == ["config.toml"]
    assert f"{run / LOCK_NAME}: cannot be locked (Function not implemented)" in caplog.text


def test_a_run_directory_that_cannot_be_made_is_named_with_the_reason(tmp_path):
    """--out below a file (or on a read-only file system: a real run on a tmpfs remounted read-only said
    "[Errno 30] Read-only file system: 'fs/run'" on every rank) gave Python's repr of the OSError; now the line
    every rank prints names the path as every other output failure does."""
    from mpi4py import MPI

    from g3mpi.train import TrainConfig, prepare_run_dir
    from g3mpi.train.rundir import RunLock
    (tmp_path / "afile").write_text("x")
    cfg = TrainConfig(parts=str(tmp_path), out=str(tmp_path / "afile" / "run"), epochs=4)
    with RunLock() as lock:
        assert prepare_run_dir(MPI.COMM_SELF, cfg, lock=lock) == (
            None, f"{tmp_path}/afile/run: cannot be written: Not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_predictions_that_cannot_be_put_in_place_are_an_output_error(tmp_path, monkeypatch):
    """Rank 0 syncs and renames predictions.h5 once every rank has written: a failure there (an fsync that
    reports the full disk late, as NFS does) left the whole-size temporary and an OSError on rank 0 alone (the
    job ended with its traceback); now it is the rank's OutputError naming the file, told to every rank, and
    nothing is left."""
    from mpi4py import MPI

    from g3mpi.train.rundir import OutputError, write_predictions

    def late_full_disk(fd):
        raise OSError(28, os.strerror(28))
    monkeypatch.setattr(os, "fsync", late_full_disk)
    with pytest.raises(OutputError) as e:
        write_predictions(MPI.COMM_SELF, tmp_path / "predictions.h5", np.array([1, 0]), np.ones((2, 3)), 2)
    assert str(e.value) == (f"{tmp_path / 'predictions.h5'}: cannot be written: No space left on device (on rank 0, "
                            "putting the file in place)")
    assert list(tmp_path.iterdir()) == []
