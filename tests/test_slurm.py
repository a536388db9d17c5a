"""jobs/ on a real SLURM started by the tests: the local cluster script itself, then the batch jobs.

One module-scoped cluster of one node (tests/slurm_cluster.py: its own temporary directory and free ports, always
stopped, its daemons checked to be gone). Needs root and slurm-wlm (installed with apt-get when missing); otherwise
every test here skips and says why (under G3_NO_SKIP=1, as in .ci/run, it fails instead).
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import CORA
from tests.slurm_cluster import (DAEMONS, JOBS, LOCAL_CLUSTER, Cluster, Job, free_port,  # noqa: F401 (for other tests)
                                 local_cluster, mpich_segment)
from tests.slurm_cluster import alive as _alive
from tests.test_jobs import small_partition


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(1, G3_SLURM_CPUS=max(2, len(os.sched_getaffinity(0)))) as c:
        yield c


# ---- the local cluster itself --------------------------------------------------------------------------------

def test_local_cluster_is_up_and_idempotent(cluster):
    pids = cluster.pids()
    assert set(pids) == set(DAEMONS) and all(_alive(pid, name) for name, pid in pids.items())
    p = cluster.run("sinfo", "-h", "-o", "%P %a %T %c")
    assert p.returncode == 0, p.stderr
    partition, avail, state, cpus = p.stdout.split()
    assert (partition, avail, state) == ("debug*", "up", "idle")
    assert int(cpus) >= 2
    p = cluster.run("bash", LOCAL_CLUSTER, "status")
    assert p.returncode == 0 and all(f"{name}: running (pid {pid})" in p.stdout for name, pid in pids.items())
    # a second start finds everything running and changes nothing
    p = cluster.run("bash", LOCAL_CLUSTER, "start", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "already running" in p.stderr and cluster.pids() == pids


def test_mpi_hello_job_has_world_size_two(cluster, tmp_path):
    script = tmp_path / "hello.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=hello\n#SBATCH --output=%x-%j.out\n#SBATCH --ntasks=2\n"
                      "#SBATCH --time=00:05:00\nset -euo pipefail\n"
                      "export MPIR_CVAR_CH4_NETMOD=ofi\n"  # the pip MPICH under srun: docs/JOBS.md
                      'srun --mpi=pmi2 "$G3_PYTHON" -m mpi4py -c "from mpi4py import MPI; c = MPI.COMM_WORLD; '
                      "assert c.size == 2, c.size; print('hello', c.rank, c.size, flush=True)\"\n")
    job = cluster.sbatch_wait(script, cwd=tmp_path, timeout=300)
    assert job.returncode == 0 and job.exit_code == "0:0", job.log
    assert sorted(line for line in job.log.splitlines() if line.startswith("hello")) == ["hello 0 2", "hello 1 2"]


def test_failing_job_exit_code_propagates(cluster, tmp_path):
    script = tmp_path / "fail.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --output=%x-%j.out\n#SBATCH --ntasks=1\n#SBATCH --time=00:05:00\n"
                      "exit 3\n")
    job = cluster.sbatch_wait(script, cwd=tmp_path, timeout=300)
    assert job.returncode == 3 and job.exit_code == "3:0"


@pytest.mark.parametrize("srun_mpi, ok", [("pmi2", True), ("none", False)])
def test_world_check_under_srun(cluster, tmp_path, srun_mpi, ok):
    """srun --mpi=none starts singletons with the pip MPICH: the job library must notice and fail the job."""
    script = tmp_path / "world.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=world\n#SBATCH --output=%x-%j.out\n#SBATCH --ntasks=2\n"
                      "#SBATCH --time=00:05:00\nset -euo pipefail\n"
                      f"source {JOBS / 'lib' / 'common.sh'}\ng3_setup_env\ng3_check_world \"$SLURM_NTASKS\"\n"
                      "echo reached the end\n")
    job = cluster.sbatch_wait(script, cwd=tmp_path, env=cluster.job_env(G3_SRUN_MPI=srun_mpi), timeout=300)
    if ok:
        assert job.returncode == 0, job.log
        assert "MPI world check passed: 2 ranks, one world of size 2" in job.log
    else:
        assert job.returncode == 1 and job.exit_code == "1:0", job.log
        assert "got 2 processes reporting world size 1" in job.log and "singletons" in job.log
        assert "reached the end" not in job.log


def test_train_job_refuses_rank_part_mismatch(cluster, tmp_path):
    """train.sbatch fails before starting any rank when SLURM_NTASKS differs from the partition's part count."""
    parts = small_partition(tmp_path / "parts3", 3)
    job = cluster.sbatch_wait(JOBS / "slurm" / "train.sbatch", "--epochs", 1, opts=("--ntasks-per-node=2",),
                              cwd=tmp_path, env=cluster.job_env(G3_PARTS=parts, G3_OUT=tmp_path / "run"), timeout=300)
    assert job.returncode == 1 and job.exit_code == "1:0", job.log
    assert f"{parts}/meta.json: the partition has 3 parts but 2 ranks were requested" in job.log
    assert not (tmp_path / "run").exists()


# ---- the real chain on Cora ------------------------------------------------------------------------------------

TRAIN_ARGS = ("--model", "gcn", "--epochs", 200, "--hidden", 16, "--dropout", 0.5, "--lr", 0.01,
              "--weight-decay", 5e-4, "--seed", 0)


@pytest.fixture(scope="module")
def cora_chain(cluster, tmp_path_factory):
    """prepare -> partition -> train on Cora with 2 tasks, chained by SLURM dependencies."""
    work = tmp_path_factory.mktemp("cora-chain")
    env = cluster.job_env(G3_GRAPH="cora.h5", G3_NUM_PARTS=2, G3_METHOD="metis", G3_PARTS="parts", G3_OUT="run")
    dep = ("--kill-on-invalid-dep=yes",)
    prep = cluster.submit(JOBS / "slurm" / "prepare.sbatch", "npz", CORA, "--normalize-features",
                          opts=("--cpus-per-task=1",), cwd=work, env=env)
    part = cluster.submit(JOBS / "slurm" / "partition.sbatch",
                          opts=("--cpus-per-task=1", f"--dependency=afterok:{prep}", *dep), cwd=work, env=env)
    train = cluster.sbatch_wait(JOBS / "slurm" / "train.sbatch", *TRAIN_ARGS,
                                opts=("--ntasks-per-node=2", "--cpus-per-task=1", f"--dependency=afterok:{part}", *dep),
                                cwd=work, env=env, timeout=1200, name="g3-train")
    jobs = {"prepare": cluster.job(prep, work, name="g3-prepare"),
            "partition": cluster.job(part, work, name="g3-partition"), "train": train}
    return work, env, jobs


def test_cora_chain_trains_to_accuracy(cora_chain):
    import json

    work, _, jobs = cora_chain
    for stage, job in jobs.items():
        assert job.exit_code == "0:0", f"{stage} job {job.jobid} ExitCode={job.exit_code}\n{job.log}"
    assert jobs["train"].returncode == 0, jobs["train"].log
    assert "MPI world check passed: 2 ranks, one world of size 2" in jobs["train"].log
    meta = json.loads((work / "parts" / "meta.json").read_text())
    assert meta["num_parts"] == 2 and meta["num_nodes"] == 2708
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["test_acc"] >= 0.78, summary


def test_corrupt_partition_fails_the_train_job(cluster, cora_chain):
    work, env, jobs = cora_chain
    assert jobs["partition"].exit_code == "0:0", jobs["partition"].log
    bad = work / "parts-corrupt"
    shutil.copytree(work / "parts", bad)
    victim = bad / "part-00001.h5"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    job = cluster.sbatch_wait(JOBS / "slurm" / "train.sbatch", *TRAIN_ARGS,
                              opts=("--ntasks-per-node=2", "--cpus-per-task=1"), cwd=work,
                              env=dict(env, G3_PARTS=str(bad), G3_OUT="run-corrupt"), timeout=600, name="g3-train")
    assert job.returncode != 0 and job.exit_code != "0:0", job.log
    assert "part-00001.h5" in job.log, job.log
    assert not (work / "run-corrupt" / "summary.json").exists()
    # the aborted training step (step 1, after the world-check probe) leaves its segment until the cluster stops
    cluster.aborted_segments.append(mpich_segment(job.jobid, 1))


def _job_state(cluster, jobid: str) -> str:
    return cluster.fields(jobid).get("JobState", "?")


def test_train_job_stops_on_a_signal_then_resumes(cluster, cora_chain):
    """scancel --signal=USR1 (what train.sbatch's --signal=USR1@120 sends before the time limit): the ranks stop
    after an epoch with a checkpoint and the job exits 75; a job with --resume RUN finishes the run. Rank 1 is
    made 1 s late to exit (G3_TEST_STALL=1:exit:1): srun's --kill-on-bad-exit then terminates it when rank 0 has
    exited with 75, which turned the job's 75 into 143 (seen in CI under load) until the ranks ignored stop
    signals once the run was over."""
    import json
    import time

    work, env, jobs = cora_chain
    assert jobs["partition"].exit_code == "0:0", jobs["partition"].log
    run = work / "run-stop"
    args = list(TRAIN_ARGS)
    args[args.index("--epochs") + 1] = 100000
    jobid = cluster.submit(JOBS / "slurm" / "train.sbatch", *args, opts=("--ntasks-per-node=2", "--cpus-per-task=1"),
                           cwd=work, env=dict(env, G3_OUT=str(run), G3_TEST_STALL="1:exit:1"))
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert _job_state(cluster, jobid) in ("PENDING", "RUNNING"), cluster.job(jobid, work, name="g3-train").log
        time.sleep(0.2)
    p = cluster.run("scancel", "--signal=USR1", jobid)
    assert p.returncode == 0, p.stderr
    while time.monotonic() < deadline and _job_state(cluster, jobid) in ("PENDING", "RUNNING", "COMPLETING"):
        time.sleep(0.2)
    job = cluster.job(jobid, work, name="g3-train")
    assert job.exit_code == "75:0", job.log
    assert not Path("/dev/shm", mpich_segment(jobid, 1)).exists()   # a clean exit (MPI_Finalize), no abort
    e = len(metrics.read_text().splitlines())
    # scancel signals the ranks one by one: at an epoch end only one may have it, and the line says so
    assert re.search(f"g3-train: stopped by SIGUSR1( on 1 of 2 ranks)? after epoch {e} of 100000", job.log), job.log
    assert not (run / "summary.json").exists()
    resumed = cluster.sbatch_wait(JOBS / "slurm" / "train.sbatch", "--resume", run, "--epochs", e + 3,
                                  opts=("--ntasks-per-node=2", "--cpus-per-task=1"), cwd=work, env=env, timeout=600,
                                  name="g3-train")
    assert resumed.returncode == 0 and resumed.exit_code == "0:0", resumed.log
    assert [json.loads(x)["epoch"] for x in metrics.read_text().splitlines()] == list(range(1, e + 4))
    assert json.loads((run / "summary.json").read_text())["epochs"] == e + 3


# ---- stopping a train job cleanly (a small partition, so these take seconds) -----------------------------------

def _wait_done(cluster, jobid: str, timeout: float = 180) -> None:
    import time

    deadline = time.monotonic() + timeout
    while _job_state(cluster, jobid) in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
        if time.monotonic() > deadline:
            cluster.run("scancel", jobid)
            raise AssertionError(f"job {jobid} did not end within {timeout}s")
        time.sleep(0.2)


def _submit_endless_train(cluster, tmp_path, **env) -> tuple[str, Path]:
    """A 2-rank train.sbatch job of 10**7 epochs on a small partition (stopped by the test); (job ID, run dir)."""
    parts = small_partition(tmp_path / "parts", 2)
    run = tmp_path / "run"
    jobid = cluster.submit(JOBS / "slurm" / "train.sbatch", "--epochs", 10**7, "--no-progress",
                           opts=("--ntasks-per-node=2", "--cpus-per-task=1"), cwd=tmp_path,
                           env=cluster.job_env(G3_PARTS=parts, G3_OUT=run, **env))
    return jobid, run


def test_g3_timeout_under_srun_stops_with_a_checkpoint(cluster, tmp_path):
    """G3_TIMEOUT with the srun launcher: srun takes SIGTERM as 'abort the step' (tasks SIGKILLed, no checkpoint),
    so the time limit reaches the ranks as SIGUSR1: checkpoint.pt is written, the job's status is timeout's 124.
    G3_KILL_AFTER gives the stopped ranks 240 s before SIGKILL instead of 60 (under heavy load in CI the start-up,
    the first epoch and the exit took 66 s: SIGKILL, status 137, though the checkpoint and stop line were out)."""
    jobid, run = _submit_endless_train(cluster, tmp_path, G3_TIMEOUT="6s", G3_KILL_AFTER="240s")
    _wait_done(cluster, jobid, timeout=360)
    job = cluster.job(jobid, tmp_path, name="g3-train")
    assert job.exit_code == "124:0", job.log
    # timeout's SIGUSR1, or g3-train's own --time-limit (set from G3_TIMEOUT) where srun dropped the signal because
    # the tasks were not running yet (seen in CI under heavy load: the job ran on until the SIGKILL, status 137)
    assert "timeout --signal=USR1 --kill-after=240s" in job.log and "--time-limit 6" in job.log, job.log
    # srun signals the ranks one by one: at an epoch end only some may have it, and the line says so
    assert re.search(r"g3-train: stopped by (SIGUSR1( on 1 of 2 ranks)?|the time limit \(--time-limit 6\)) after "
                     "epoch", job.log), job.log
    assert (run / "checkpoint.pt").exists() and not (run / "summary.json").exists()


def test_scancel_with_mpiexec_launcher_stops_with_a_checkpoint(cluster, tmp_path):
    """G3_LAUNCHER=mpiexec in an allocation: scancel's SIGTERM reaches each rank twice (slurmstepd, and Hydra's
    forwarding); g3-train takes the two as one stop request and writes its checkpoint instead of dying at once."""
    import time

    jobid, run = _submit_endless_train(cluster, tmp_path, G3_LAUNCHER="mpiexec")
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
        assert time.monotonic() < deadline and _job_state(cluster, jobid) in ("PENDING", "RUNNING"), \
            cluster.job(jobid, tmp_path, name="g3-train").log
        time.sleep(0.2)
    assert cluster.run("scancel", jobid).returncode == 0
    _wait_done(cluster, jobid)
    job = cluster.job(jobid, tmp_path, name="g3-train")
    assert re.search(r"g3-train: stopped by SIGTERM( on 1 of 2 ranks)? after epoch", job.log), job.log
    assert (run / "checkpoint.pt").exists()


CHILD_MPIEXEC = r"""
import subprocess, sys
from g3mpi.bench.common import child_env, mpiexec
p = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-c",
                    "from mpi4py import MPI; c = MPI.COMM_WORLD; r = c.gather(c.rank)\n"
                    "if c.rank == 0: print('child ranks', *r, 'of', c.size, flush=True)"],
                   env=child_env(1), capture_output=True, text=True, timeout=20)
print(p.stdout, p.stderr, "status", p.returncode, flush=True)
"""


def test_bench_child_mpiexec_inside_a_one_task_job(cluster, tmp_path):
    """g3-bench as one task (bench.sbatch's default) starts `mpiexec -n P` for multi-rank suites; inside the
    allocation Hydra would bootstrap through srun, whose step waits for the CPUs the running step holds (the job
    hung until its time limit). child_env makes the child fork its ranks on this node."""
    (tmp_path / "child.py").write_text(CHILD_MPIEXEC)
    script = tmp_path / "child.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --output=%x-%j.out\n#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=1\n"
                      "#SBATCH --time=00:05:00\nset -euo pipefail\n"
                      f'srun --mpi=pmi2 "$G3_PYTHON" {tmp_path / "child.py"}\n')
    jobid = cluster.submit(script, cwd=tmp_path)
    _wait_done(cluster, jobid)
    job = cluster.job(jobid, tmp_path, name="child")
    assert job.exit_code == "0:0" and "status 0" in job.log, job.log
    assert "child ranks 0 1 of 2" in job.log, job.log


def test_a_failed_stage_cancels_the_chain(cluster, tmp_path):
    """afterok on a failed job: the local cluster cancels the dependent job (DependencyParameters=
    kill_invalid_depend) instead of leaving it pending for ever, and the documented recipe's state check reports
    CANCELLED for a job that sbatch --wait returned 0 for."""
    fail = tmp_path / "fail.sbatch"
    fail.write_text("#!/bin/bash\n#SBATCH --output=%x-%j.out\n#SBATCH --time=00:01:00\nexit 3\n")
    ok = tmp_path / "ok.sbatch"
    ok.write_text("#!/bin/bash\n#SBATCH --output=%x-%j.out\n#SBATCH --time=00:01:00\necho ran\n")
    first = cluster.submit(fail, cwd=tmp_path)
    plain = cluster.submit(ok, opts=(f"--dependency=afterok:{first}",), cwd=tmp_path)   # no --kill-on-invalid-dep
    recipe = ('train=$(sbatch --parsable --wait --dependency=afterok:"$1" --kill-on-invalid-dep=yes "$2"); rc=$?\n'
              "state=$(scontrol show job \"$train\" -o | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)\n"
              'echo "train: ${state:-unknown}, exit status $rc"; [[ $state == COMPLETED ]]\n')
    p = cluster.run("bash", "-c", recipe, "bash", first, ok, cwd=tmp_path, timeout=120)
    assert p.returncode == 1 and "train: CANCELLED, exit status 0" in p.stdout, (p.stdout, p.stderr)
    _wait_done(cluster, plain, timeout=60)
    fields = cluster.fields(plain)
    assert fields["JobState"] == "CANCELLED" and fields["Reason"] == "DependencyNeverSatisfied", fields
    assert cluster.fields(first)["JobState"] == "FAILED"


def test_batch_scripts_find_jobs_lib_in_a_path_with_spaces(cluster, tmp_path):
    """sbatch runs a copy of the script from the spool directory; the script finds jobs/lib through the path it
    was submitted with (scontrol's Command=), which may contain spaces, also when submitted from elsewhere."""
    repo = tmp_path / "my repo" / "g3 mpi"
    shutil.copytree(JOBS, repo / "jobs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    jobid = cluster.submit(repo / "jobs" / "slurm" / "prepare.sbatch", "sbm", "--nodes", 100,
                           opts=("--cpus-per-task=1",), cwd=elsewhere, env=cluster.job_env(G3_DRY_RUN=1))
    _wait_done(cluster, jobid, timeout=60)
    job = cluster.job(jobid, elsewhere, name="g3-prepare")
    assert job.exit_code == "0:0", job.log
    assert "cannot find jobs/lib/common.sh" not in job.log and "data_tools.prepare sbm --nodes 100" in job.log
