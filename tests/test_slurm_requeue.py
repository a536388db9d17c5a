"""train.sbatch at its time limit and on scancel, and sweep.sbatch's job array, on the local SLURM of test_slurm.

A job that reaches its time limit stops with a checkpoint, requeues itself and its restart resumes the run, ending
bit for bit as an uninterrupted run; a job the user cancels is never requeued and leaves no process and a valid
checkpoint. SLURM holds a requeued job for 120 s before it may start again (its BeginTime); the tests release it
at once with ``scontrol update StartTime=now``, which a user may do too.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from tests.conftest import CORA, run_module, run_mpi
from tests.test_jobs import small_partition
from tests.test_slurm import JOBS, _job_state, _wait_done, cluster  # noqa: F401 - cluster: the module's own cluster

TRAIN = JOBS / "slurm" / "train.sbatch"
LAYOUT = ("--ntasks-per-node=2", "--cpus-per-task=1")
ARGS = ("--epochs", 130, "--seed", 4, "--dropout", 0.5, "--model", "sage", "--no-progress")


def _poll(cluster, jobid: str, until, timeout: float, what: str) -> dict:
    """scontrol's fields of the job once ``until(fields)`` holds; fails naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        fields = cluster.fields(jobid)
        if until(fields):
            return fields
        if time.monotonic() > deadline:
            cluster.run("scancel", jobid)
            raise AssertionError(f"job {jobid}: {what} not within {timeout}s: {fields.get('JobState')}")
        time.sleep(0.5)


def _job_processes(jobid: str) -> list[str]:
    """The processes of the job still alive on this machine (their environment has SLURM_JOB_ID=jobid)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
            if f"SLURM_JOB_ID={jobid}".encode() in env:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{proc.name} {cmd[:120]}")
        except OSError:
            pass
    return found


def _wait_step_daemons_gone(cluster, jobid: str, timeout: float) -> None:
    """While the requeued job is pending, until no ``slurmstepd: [JOBID.STEP]`` process of its first start is left
    (fails after ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while cluster.fields(jobid).get("JobState") == "PENDING":
        left = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and f"[{jobid}.".encode() in (proc / "cmdline").read_bytes():
                    left.append(proc.name)
            except OSError:
                pass
        if not left:
            return
        assert time.monotonic() < deadline, f"job {jobid}: step daemons {left} still there after {timeout}s"
        time.sleep(0.5)


def test_time_limit_stops_requeues_and_ends_bit_identical(cluster, tmp_path):
    """--time=1 (the shortest SLURM limit) on a run that needs more: 130 epochs of at least 0.5 s each (every rank
    sleeps that long at each epoch's start). g3-train stops 40 s before the job's end (G3_STOP_MARGIN, the
    --time-limit the script sets) or on the warning SIGUSR1 that SLURM sends the batch shell 40 s before it
    (whichever comes first: SLURM checks the limits every 30 s), writes its checkpoint, and the job requeues
    itself. Its restart, given a longer limit while it waits, resumes the run; model.pt is byte for byte that of
    an uninterrupted run with the same seed."""
    parts = small_partition(tmp_path / "parts", 2)
    run = tmp_path / "run"
    jobid = cluster.submit(TRAIN, *ARGS, opts=("--time=1", "--signal=B:USR1@40", *LAYOUT), cwd=tmp_path,
                           env=cluster.job_env(G3_PARTS=parts, G3_OUT=run, G3_STOP_MARGIN=40,
                                               G3_TEST_STALL="*:every:0.5"))
    fields = _poll(cluster, jobid, lambda f: int(f.get("Restarts", 0)) >= 1 or f.get("JobState") not in
                   ("PENDING", "RUNNING", "CONFIGURING"), 300, "a requeue")
    log = cluster.job(jobid, tmp_path, name="g3-train").log
    assert fields["Restarts"] == "1", log
    stopped = int(re.search(r"g3-train: stopped by .* after epoch (\d+) of 130", log).group(1))
    assert 1 <= stopped < 130 and (run / "checkpoint.pt").exists() and not (run / "summary.json").exists(), log
    assert re.search(f"stopped by (the time-limit warning \\(SIGUSR1\\)|the job's time limit \\(--time-limit \\d+, "
                     f"40 s before its end\\)) with {run}/checkpoint.pt written: job {jobid} requeued", log), log
    # the restart: a limit long enough for the rest of the run, and no 120 s hold (once the first start is gone)
    _poll(cluster, jobid, lambda f: f.get("JobState") in ("PENDING", "RUNNING"), 120, "pending again")
    # the restart's steps reuse the first start's step IDs: forced to start while a step daemon of the first is
    # still cleaning up, the new step lost its PMI2 socket (named by job and step) and failed at MPI_Finalize
    _wait_step_daemons_gone(cluster, jobid, timeout=120)
    p = cluster.run("scontrol", "update", f"JobId={jobid}", "TimeLimit=10", "StartTime=now")
    assert p.returncode == 0, p.stderr
    ref = tmp_path / "ref"
    run_mpi(2, "g3mpi.cli.train", "--parts", parts, "--out", ref, "--threads", 1, *ARGS, timeout=600)
    _wait_done(cluster, jobid, timeout=600)
    fields = cluster.fields(jobid)
    job = cluster.job(jobid, tmp_path, name="g3-train")
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), job.log
    assert f"restart 1 of job {jobid}: resuming {run} from its checkpoint" in job.log
    assert re.search(f"resuming from {run}/checkpoint.pt at epoch {stopped}", job.log), job.log
    epochs = [json.loads(x)["epoch"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 131))
    assert (run / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (run, ref))
    assert (a["best_epoch"], a["test_acc"], a["final_loss"]) == (b["best_epoch"], b["test_acc"], b["final_loss"])


def test_scancel_does_not_requeue_and_keeps_a_valid_checkpoint(cluster, tmp_path):
    """scancel of a running (requeueable) train job: it ends CANCELLED and stays so (the batch shell took the
    SIGTERM as a cancel, not as a time limit), no process of it is left, and RUN/checkpoint.pt (written every 5
    epochs) passes the checkpoint reader's checks (CRC of every record, its format) and resumes."""
    from g3mpi.train.checkpoint import load_checkpoint

    parts = small_partition(tmp_path / "parts", 2)
    run = tmp_path / "run"
    jobid = cluster.submit(TRAIN, "--epochs", 10**7, "--checkpoint-every", 5, "--no-progress", opts=LAYOUT,
                           cwd=tmp_path, env=cluster.job_env(G3_PARTS=parts, G3_OUT=run))
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not ((run / "checkpoint.pt").exists() and len(metrics.read_text().splitlines()) >= 8):
        assert time.monotonic() < deadline and _job_state(cluster, jobid) in ("PENDING", "RUNNING"), \
            cluster.job(jobid, tmp_path, name="g3-train").log
        time.sleep(0.2)
    assert cluster.run("scancel", jobid).returncode == 0
    _wait_done(cluster, jobid)
    time.sleep(3)   # a requeue would show as PENDING with Restarts=1 by now
    fields = cluster.fields(jobid)
    job = cluster.job(jobid, tmp_path, name="g3-train")
    assert (fields["JobState"], fields["Restarts"]) == ("CANCELLED", "0"), job.log
    assert "SIGTERM (scancel or the job's end): the job will not be requeued" in job.log
    assert "requeued" not in job.log.replace("will not be requeued", "").replace("not requeued", "")
    assert not _job_processes(jobid)
    ckpt = load_checkpoint(run / "checkpoint.pt")
    assert 5 <= ckpt["epoch"] <= len(metrics.read_text().splitlines())
    e = ckpt["epoch"]
    run_mpi(2, "g3mpi.cli.train", "--resume", run, "--epochs", e + 2, "--no-progress", timeout=300)
    assert [json.loads(x)["epoch"] for x in metrics.read_text().splitlines()] == list(range(1, e + 3))


GRID = """# two seeds of GCN on Cora
model = "gcn"
seed = [0, 1]
lr = 0.01
epochs = 30
"""


def test_array_sweep_over_a_grid_and_its_report(cluster, tmp_path):
    """sweep.sbatch over a TOML grid of 2 combinations: g3-sweep gives the array size, each element trains its
    combination in its own run directory, and g3-report tabulates both runs and plots accuracy vs the seed."""
    run_module("data_tools.prepare", "npz", CORA, "--normalize-features", "--out", tmp_path / "cora.h5")
    run_module("data_tools.partition", tmp_path / "cora.h5", "--parts", 1, "--out", tmp_path / "parts")
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    size = run_module("g3mpi.cli.sweep", "size", grid).stdout.strip()
    assert size == "2"
    jobid = cluster.submit(JOBS / "slurm" / "sweep.sbatch", grid, "--no-progress",
                           opts=(f"--array=0-{int(size) - 1}", "--ntasks-per-node=1", "--cpus-per-task=1"),
                           cwd=tmp_path,
                           env=cluster.job_env(G3_PARTS=tmp_path / "parts", G3_OUT=tmp_path / "sweep"))
    for i in range(2):
        _wait_done(cluster, f"{jobid}_{i}", timeout=600)
    runs = sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert runs == ["0-seed-0", "1-seed-1"], runs
    for i, name in enumerate(runs):
        job = cluster.fields(f"{jobid}_{i}")
        assert job["ExitCode"] == "0:0", cluster.job(f"{jobid}_{i}", tmp_path, name=f"g3-sweep").log
        summary = json.loads((tmp_path / "sweep" / name / "summary.json").read_text())
        assert summary["epochs"] == 30 and summary["test_acc"] > 0.5, summary
    plot = tmp_path / "acc-vs-seed.png"
    p = run_module("g3mpi.cli.report", tmp_path / "sweep", "--plot", "seed", "--plot-out", plot)
    rows = [line.split() for line in p.stdout.splitlines()]
    assert rows[0][:4] == ["run", "model", "seed", "lr"], p.stdout
    for name, row in zip(runs, rows[1:]):
        summary = json.loads((tmp_path / "sweep" / name / "summary.json").read_text())
        assert row[0].endswith(name) and row[1:4] == ["gcn", name[-1], "0.01"], p.stdout
        assert f"{summary['test_acc']:.4f}" in row and str(summary["epochs"]) in row, p.stdout
    assert plot.stat().st_size > 0
