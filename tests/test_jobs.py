"""The mpirun launchers and the shell library behind every job script (jobs/), without SLURM.

These run the real scripts with bash and the real pip MPICH; the SLURM side is in test_slurm.py.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, mpiexec, run_mpi, tool_env

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_train_check_runs_g3_trains_checks_without_training",
              "test_resume_takes_the_runs_partition_and_directory", "test_threads_per_rank_reach_torch",
              "test_timeout_bounds_a_stage", "test_dry_run_checks_what_g3_train_checks_first")

JOBS = REPO / "jobs"
LIB = JOBS / "lib" / "common.sh"


def job_env(**extra) -> dict:
    env = tool_env()
    env["G3_PYTHON"] = sys.executable
    env["G3_MPIEXEC"] = mpiexec()
    for k in list(env):
        if k.startswith("SLURM_"):  # a test run inside a SLURM job must still test the mpiexec path
            del env[k]
    env.update({k: str(v) for k, v in extra.items()})
    return env


def bash(script: str, *args, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script, "bash", *map(str, args)], capture_output=True, text=True,
                          env=job_env(**env), timeout=timeout, cwd=REPO)


def launcher(stage: str, *args, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(JOBS / "mpirun" / f"{stage}.sh"), *map(str, args)], capture_output=True,
                          text=True, env=job_env(**env), timeout=timeout, cwd=REPO)


def small_partition(out: Path, num_parts: int, n: int = 60, seed: int = 0) -> Path:
    """A real partition directory (docs/FORMAT.md) of a small random graph, built by data_tools.build."""
    from data_tools.build import write_partition
    from g3mpi.format import Graph

    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, 4 * n)
    dst = rng.integers(0, n, 4 * n)
    keep = src != dst
    src, dst = np.concatenate([src[keep], dst[keep]]), np.concatenate([dst[keep], src[keep]])
    pairs = np.unique(np.stack([dst, src], 1), axis=0)  # sorted by (row=dst, col=src)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs[:, 0], minlength=n), out=indptr[1:])
    labels = rng.integers(0, 3, n).astype(np.int64)
    idx = rng.permutation(n)
    masks = [np.zeros(n, bool) for _ in range(3)]
    for m, sl in zip(masks, (idx[:20], idx[20:40], idx[40:])):
        m[sl] = True
    g = Graph(indptr=indptr, indices=pairs[:, 1].astype(np.int32), features=rng.random((n, 4), dtype=np.float32),
              labels=labels, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
              attrs=dict(num_classes=3, source="test:random"))
    assignment = (np.arange(n) * num_parts // n).astype(np.int64)
    write_partition(g, assignment, num_parts, out, method="random", seed=seed)
    return out


SCRIPTS = sorted([*JOBS.rglob("*.sh"), *JOBS.rglob("*.sbatch"), REPO / ".ci" / "run"])


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_scripts_parse(script):
    p = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_sbatch_scripts_have_logs_time_limits_and_no_hardcoded_paths():
    for name in ("prepare", "partition", "train", "bench"):
        text = (JOBS / "slurm" / f"{name}.sbatch").read_text()
        directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
        assert "#SBATCH --output=%x-%j.out" in directives, name
        assert any(d.startswith("#SBATCH --time=") for d in directives), name
        assert any(d.startswith("#SBATCH --job-name=g3-") for d in directives), name
        assert "set -euo pipefail" in text, name
        for bad in ("/work/", "/home/", "/tmp/", "/opt/"):
            assert bad not in text, (name, bad)


def test_dry_run_builds_the_mpi_command(tmp_path):
    parts = small_partition(tmp_path / "parts", 2)
    p = launcher("train", "-n", 2, "-t", 3, "--dry-run", "--", "--parts", parts, "--epochs", 5,
                 G3_OUT=tmp_path / "run")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[:3] == [mpiexec(), "-n", "2"]
    i = cmd.index(sys.executable)
    assert cmd[i + 1:i + 5] == ["-m", "mpi4py", "-m", "g3mpi.cli.train"]
    tool = cmd[i + 5:]
    assert tool == ["--parts", str(parts), "--epochs", "5", "--out", str(tmp_path / "run"), "--threads", "3"]
    assert "3 thread(s)" in p.stderr


def test_dry_run_checks_what_g3_train_checks_first(tmp_path):
    """A dry run refuses what the real run would: a rank count that is not the part count, a graph file given as
    the partition, a run directory in use (unless --force or --resume); a partition not written yet passes."""
    parts = small_partition(tmp_path / "parts", 2)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.toml").write_text("")
    (tmp_path / "g.h5").write_bytes(b"")
    for args, what in [(["-n", 3, "--", "--parts", parts], f"{parts}/meta.json: the partition has 2 parts but 3 ranks were requested"),
                       (["-n", 2, "--", "--parts", tmp_path / "g.h5"],
                        f"{tmp_path / 'g.h5'}: is a file, not a partition directory (meta.json + part-*.h5, written "
                        "by g3-partition)"),
                       (["-n", 2, "--", "--parts", parts, "--out", tmp_path / "run"],
                        f"{tmp_path / 'run'}: run directory exists and is not empty (use --force")]:
        p = launcher("train", "--dry-run", *args, G3_OUT=tmp_path / "new")
        assert p.returncode == 1 and f"g3-train launcher: error: {what}" in p.stderr, p.stderr
    for args in (["--parts", parts, "--out", tmp_path / "run", "--force"], ["--parts", tmp_path / "later"]):
        p = launcher("train", "-n", 2, "--dry-run", "--", *args, G3_OUT=tmp_path / "new")
        assert p.returncode == 0, p.stderr


def test_dry_run_fills_stage_defaults_from_environment(tmp_path):
    p = launcher("partition", "--dry-run", G3_GRAPH=tmp_path / "g.h5", G3_NUM_PARTS=8, G3_METHOD="random",
                 G3_PARTS=tmp_path / "p8", G3_FORCE=1)
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd == [sys.executable, "-m", "data_tools.partition", str(tmp_path / "g.h5"), "--parts", "8",
                   "--method", "random", "--out", str(tmp_path / "p8"), "--force"]
    # explicit arguments win over the environment
    p = launcher("prepare", "--dry-run", "--", "npz", "x.npz", "--out", "mine.h5", G3_GRAPH="other.h5")
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[-4:] == ["npz", "x.npz", "--out", "mine.h5"]
    p = launcher("prepare", "--dry-run", "--", "npz", "x.npz", "-o", "mine.h5", G3_GRAPH="other.h5")
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[-4:] == ["npz", "x.npz", "-o", "mine.h5"]
    # with no arguments prepare makes the embedded default graph (the quickstart's SBM, >= 50k nodes)
    p = launcher("prepare", "--dry-run", G3_GRAPH="g.h5")
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[3] == "sbm" and int(cmd[cmd.index("--nodes") + 1]) >= 50_000 and cmd[-2:] == ["--out", "g.h5"]


@pytest.mark.parametrize("given", [["-p8", "-oparts8"], ["--par", "8", "--ou=parts8"], ["--parts=8", "-o", "parts8"]])
def test_options_in_every_form_argparse_takes_are_seen(tmp_path, given):
    """An option the tool reads in another form than "--opt V" ("-p8", an abbreviation "--par 8", "--ou=V") is
    the caller's: the launcher adds no default of its own. Before, it appended "--parts 4 ... --out parts",
    which argparse took as the last word, silently overriding the caller."""
    p = launcher("partition", "--dry-run", "--", "g.h5", *given, "--method", "random")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[cmd.index("data_tools.partition") + 1:] == ["g.h5", *given, "--method", "random"]


def test_hostfile_and_ranks_per_node_reach_mpiexec(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:4\n")
    parts = small_partition(tmp_path / "parts", 2)
    p = launcher("train", "-n", 2, "-f", hosts, "--ppn", 2, "--dry-run", "--", "--parts", parts)
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[:7] == [mpiexec(), "-n", "2", "-f", str(hosts), "-ppn", "2"]
    p = launcher("train", "-n", 2, "-f", tmp_path / "missing", "--", "--parts", parts)
    assert p.returncode != 0 and "missing: no such readable file" in p.stderr


def test_ranks_must_match_parts(tmp_path):
    parts = small_partition(tmp_path / "parts", 3)
    p = launcher("train", "-n", 2, "--", "--parts", parts, "--out", tmp_path / "run")
    assert p.returncode == 1
    assert f"{parts}/meta.json: the partition has 3 parts but 2 ranks were requested" in p.stderr
    assert not (tmp_path / "run").exists()
    p = launcher("train", "-n", 2, "--", "--parts", tmp_path / "nowhere")
    assert p.returncode == 1 and "nowhere: no such partition directory" in p.stderr


def test_resume_takes_the_runs_partition_and_directory(tmp_path):
    """--resume RUN: the partition comes from RUN/config.toml (and is checked against the ranks), no --out or
    --config is added (g3-train continues in RUN with its own settings)."""
    parts = small_partition(tmp_path / "parts", 2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(f'parts = "{parts}"\nout = "{run}"\nepochs = 5\n')
    p = launcher("train", "-n", 2, "-t", 1, "--dry-run", "--", "--resume", run, "--epochs", 9,
                 G3_OUT=tmp_path / "other", G3_CONFIG=tmp_path / "other.toml")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    tool = cmd[cmd.index("g3mpi.cli.train") + 1:]
    assert tool == ["--parts", str(parts), "--resume", str(run), "--epochs", "9", "--threads", "1"]
    p = launcher("train", "-n", 3, "--", "--resume", run)
    assert p.returncode == 1 and f"{parts}/meta.json: the partition has 2 parts but 3 ranks were requested" in p.stderr
    p = launcher("train", "-n", 2, "--", "--resume", tmp_path / "nowhere")
    assert p.returncode == 1 and "nowhere/config.toml: no such file" in p.stderr


def test_serial_stages_refuse_several_ranks():
    p = launcher("partition", "-n", 2, "--", "g.h5")
    assert p.returncode == 1 and "g3-partition --method metis is a serial program" in p.stderr
    p = launcher("prepare", "-n", 2, "--", "npz", "x.npz")
    assert p.returncode == 1 and "g3-prepare is a serial program" in p.stderr


def test_stream_partition_runs_on_several_ranks(tmp_path):
    p = launcher("partition", "-n", 3, "--dry-run", "--", tmp_path / "g.h5", "--method", "stream")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[:3] == [mpiexec(), "-n", "3"]
    i = cmd.index(sys.executable)
    assert cmd[i + 1:i + 6] == ["-m", "mpi4py", "-m", "data_tools.partition", str(tmp_path / "g.h5")]
    assert "--method" in cmd and cmd[cmd.index("--method") + 1] == "stream"


def test_bad_arguments_fail_clearly():
    p = launcher("train", "-n", "zero")
    assert p.returncode == 1 and "ranks must be a positive integer" in p.stderr
    p = launcher("train", "-n", 2, "-t", 0)
    assert p.returncode == 1 and "G3_THREADS must be a positive integer" in p.stderr
    p = subprocess.run(["bash", str(JOBS / "mpirun" / "launch.sh"), "compile"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown stage 'compile'" in p.stderr
    p = launcher("bench", G3_PYTHON="/nonexistent/python")
    assert p.returncode == 1 and "no Python found" in p.stderr


def test_world_check_passes_with_the_pip_mpich():
    p = bash(f'set -euo pipefail; source {LIB}; g3_setup_env; g3_check_world 2', G3_THREADS=1)
    assert p.returncode == 0, p.stderr
    assert "MPI world check passed: 2 ranks, one world of size 2" in p.stderr


def test_world_check_catches_singletons(tmp_path):
    """An mpiexec that does not wire ranks together (another MPI's, or srun --mpi=none) starts N singletons."""
    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/bash\n# starts N unconnected copies, like a launcher of a different MPI\n'
                    '[ "$1" = --version ] && { echo "fake launcher"; exit 0; }\n'
                    'n=$2; shift 2\nfor ((i = 0; i < n; i++)); do "$@" & done\nwait\n')
    fake.chmod(0o755)
    p = bash(f'set -euo pipefail; source {LIB}; g3_setup_env; g3_check_world 2', G3_MPIEXEC=fake)
    assert p.returncode == 1
    assert "MPI world size mismatch" in p.stderr and "got 2 processes reporting world size 1" in p.stderr
    assert "singletons" in p.stderr


def test_threads_per_rank_reach_torch(tmp_path):
    probe = tmp_path / "threads.py"
    probe.write_text("import os, torch\nfrom mpi4py import MPI\nc = MPI.COMM_WORLD\n"
                     "rows = c.gather(f\"{c.rank} {os.environ['OMP_NUM_THREADS']} "
                     "{torch.get_num_threads()}\", root=0)\n"
                     "if c.rank == 0:\n    print('\\n'.join(rows), flush=True)\n")
    script = f'set -euo pipefail; source {LIB}; g3_setup_env; g3_mpi_command 2; "${{G3_LAUNCH[@]}}" "$G3_PY" {probe}'
    threads = min(2, len(os.sched_getaffinity(0)))
    p = bash(script, G3_THREADS=threads, OMP_NUM_THREADS=7, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = sorted(line.split() for line in p.stdout.splitlines() if line.strip())
    assert rows == [["0", str(threads), str(threads)], ["1", str(threads), str(threads)]]


def test_failure_on_one_rank_fails_the_launch(tmp_path):
    """python -m mpi4py: an exception on one rank aborts every rank, and the status reaches the caller."""
    script = (f'set -euo pipefail; source {LIB}; g3_setup_env; g3_mpi_command 2; '
              'g3_run timeout 120 "${G3_LAUNCH[@]}" "$G3_PY" -m mpi4py -c '
              '"from mpi4py import MPI; import time; c = MPI.COMM_WORLD\n'
              'if c.rank == 1: raise SystemExit(\'rank 1 fails\')\ntime.sleep(100)"')
    p = bash(script, timeout=200)
    assert p.returncode not in (0, 124), p.stderr  # not a timeout: rank 0 was aborted, not left sleeping
    assert "exited with status" in p.stderr


def test_timeout_bounds_a_stage():
    script = f'set -euo pipefail; source {LIB}; g3_setup_env; g3_run sleep 30'
    p = bash(script, G3_TIMEOUT="1s", timeout=60)
    assert p.returncode == 124, p.stderr


def test_site_setup_file_and_modules(tmp_path):
    setup = tmp_path / "site.sh"
    setup.write_text('module() { echo "module $*" >&2; }\nexport G3_SITE_MARK=$UNSET_VARIABLE_OF_THE_SITE\n')
    p = bash(f'set -euo pipefail; source {LIB}; g3_setup_env; echo "mark=[$G3_SITE_MARK]"',
             G3_SETUP=setup, G3_MODULES="gcc/12 openmpi/4.1")
    assert p.returncode == 0, p.stderr
    assert "module load gcc/12 openmpi/4.1" in p.stderr and "mark=[]" in p.stdout
    p = bash(f'set -euo pipefail; source {LIB}; g3_setup_env', G3_MODULES="openmpi")
    assert p.returncode == 1 and "'module' command is not available" in p.stderr


def test_relative_venv_is_made_absolute(tmp_path):
    """G3_VENV=.venv (relative): the install step must name the same venv after the callers cd elsewhere, and a
    second run must reuse the installation (the check ran from / with the relative path, so pip ran every time)."""
    venv = tmp_path / "work" / ".venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls"
    # a stand-in python that records its calls and succeeds at everything (pip --version, pip install, imports)
    (venv / "bin" / "python").write_text(f'#!/bin/bash\necho "$*" >> {calls}\nexit 0\n')
    (venv / "bin" / "python").chmod(0o755)
    script = (f'set -euo pipefail; source {JOBS / "lib" / "venv.sh"}; cd "$1"; '
              f'g3_venv_install {REPO} ""; echo "venv=$G3_VENV py=$G3_PY"; G3_VENV=.venv; g3_venv_install {REPO} ""')
    p = bash(script, tmp_path / "work", G3_VENV=".venv")
    assert p.returncode == 0, p.stderr
    assert f"venv={venv} py={venv}/bin/python" in p.stdout, p.stdout
    assert p.stdout.count("pip install") == 2 and "already installed" in p.stdout, p.stdout  # torch + package, once


@pytest.mark.parametrize("on", ["1", "yes", "True", "on"])
def test_on_off_variables_accept_the_usual_words(tmp_path, on):
    p = launcher("partition", G3_DRY_RUN=on, G3_FORCE=on, G3_GRAPH=tmp_path / "g.h5", G3_PARTS=tmp_path / "p")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])   # printed, not run
    assert cmd[:3] == [sys.executable, "-m", "data_tools.partition"] and cmd[-1] == "--force"
    p = launcher("partition", "--dry-run", G3_FORCE="no", G3_GRAPH=tmp_path / "g.h5")
    assert p.returncode == 0 and "--force" not in p.stdout, p.stderr


@pytest.mark.parametrize("name, value", [("G3_DRY_RUN", "ye"), ("G3_CHECK_WORLD", "2"), ("G3_FORCE", "force")])
def test_on_off_variables_refuse_anything_else(tmp_path, name, value):
    """G3_DRY_RUN=ye ran the job for real, G3_CHECK_WORLD=2 skipped the check, G3_FORCE=yes was ignored."""
    parts = small_partition(tmp_path / "parts", 2)
    p = launcher("train", "-n", 2, "--", "--parts", parts, "--out", tmp_path / "run", **{name: value})
    assert p.returncode == 1, p.stderr
    assert p.stderr.strip().splitlines() == [f"g3-train launcher: error: {name} must be 1 or 0 (or true/false, "
                                             f"yes/no, on/off), got '{value}'"]
    assert not (tmp_path / "run").exists()


def test_bad_launcher_and_timeout_fail_once_before_anything_runs(tmp_path):
    parts = small_partition(tmp_path / "parts", 2)
    p = launcher("train", "-n", 2, "--", "--parts", parts, G3_LAUNCHER="foo")
    assert p.returncode == 1
    assert p.stderr.strip().splitlines() == ["g3-train launcher: error: G3_LAUNCHER must be srun or mpiexec, got 'foo'"]
    p = launcher("train", "-n", 2, "--", "--parts", parts, G3_TIMEOUT="abc")
    assert p.returncode == 1 and "MPI world check" not in p.stderr   # refused before the probe, not timeout's 125
    assert p.stderr.strip().splitlines() == ["g3-train launcher: error: G3_TIMEOUT must be a duration for timeout(1) "
                                             "(a number with an optional unit s, m, h or d, e.g. 90m), got 'abc'"]
    p = launcher("train", "-n", 2, "--", "--parts", parts, G3_TIMEOUT="1h", G3_KILL_AFTER="-5")
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        "g3-train launcher: error: G3_KILL_AFTER must be a duration for timeout(1) (a number with an optional unit "
        "s, m, h or d, e.g. 90m), got '-5'"]
    for good in ("90m", "1.5h", "30", "2d"):
        p = launcher("prepare", "--dry-run", G3_TIMEOUT=good)
        assert p.returncode == 0, (good, p.stderr)


def test_logged_commands_are_shell_quoted(tmp_path):
    out = tmp_path / "my parts"
    p = launcher("partition", "--dry-run", "--", "g.h5", "--out", out)
    assert p.returncode == 0, p.stderr
    running = next(line for line in p.stderr.splitlines() if "running: " in line)
    words = shlex.split(running.split("running: ", 1)[1])
    assert words[words.index("--out") + 1] == str(out), running


def test_srun_command_in_an_allocation(tmp_path):
    """Inside SLURM (dry run, no real srun): srun gets the job's --cpus-per-task, not G3_THREADS (a step cannot ask
    for more CPUs than the allocation holds; G3_THREADS overrides the threads, with a warning when they exceed the
    CPUs), and G3_TIMEOUT reaches srun as SIGUSR1 (srun takes SIGTERM as 'kill the step')."""
    parts = small_partition(tmp_path / "parts", 2)
    p = launcher("train", "-n", 2, "--dry-run", "--", "--parts", parts, SLURM_JOB_ID=1, SLURM_CPUS_PER_TASK=1,
                 G3_THREADS=2, G3_TIMEOUT="10m")
    assert p.returncode == 0, p.stderr
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[:4] == ["timeout", "--signal=USR1", "--kill-after=60s", "10m"]
    # G3_TIMEOUT is g3-train's own time limit too (srun drops a stop signal that arrives before the tasks run)
    assert cmd[4] == "srun" and "--cpus-per-task=1" in cmd and cmd[-4:] == ["--threads", "2", "--time-limit", "600"]
    assert "warning: G3_THREADS=2 threads per rank on 1 CPU(s) per task" in p.stderr
    # a job that declared no --cpus-per-task (whole --exclusive nodes): srun asks for G3_THREADS, no warning
    p = launcher("train", "-n", 2, "--dry-run", "--", "--parts", parts, SLURM_JOB_ID=1, G3_THREADS=2)
    assert p.returncode == 0, p.stderr
    assert "--cpus-per-task=2" in shlex.split(p.stdout.strip().splitlines()[-1]) and "warning" not in p.stderr
    p = launcher("train", "-n", 2, "--dry-run", "--", "--parts", parts, G3_TIMEOUT="10m")   # mpiexec: SIGTERM
    assert shlex.split(p.stdout.strip().splitlines()[-1])[:2] == ["timeout", "--signal=TERM"]
    # G3_KILL_AFTER: the grace before SIGKILL, for runs whose epoch (and checkpoint) takes longer than a minute
    p = launcher("train", "-n", 2, "--dry-run", "--", "--parts", parts, G3_TIMEOUT="10m", G3_KILL_AFTER="5m")
    assert shlex.split(p.stdout.strip().splitlines()[-1])[:4] == ["timeout", "--signal=TERM", "--kill-after=5m", "10m"]
    p = launcher("train", "-n", 2, "--dry-run", "--", "--parts", parts, "--time-limit=30", G3_TIMEOUT="1.5h")
    cmd = shlex.split(p.stdout.strip().splitlines()[-1])
    assert cmd[cmd.index("1.5h") + 1:].count("--time-limit=30") == 1 and "--time-limit" not in cmd   # the caller's


def test_requeued_train_job_restarts_by_its_checkpoint(tmp_path):
    """A requeued train.sbatch (SLURM_RESTART_COUNT > 0; dry run, no SLURM) resumes RUN from its checkpoint; when the
    first start stopped before writing one, it starts as submitted with --force: RUN holds that start's files."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('parts = "p"\n')
    env = dict(G3_DRY_RUN=1, SLURM_JOB_ID=7, SLURM_NTASKS=2, SLURM_RESTART_COUNT=1)

    def command():
        p = subprocess.run(["bash", str(JOBS / "slurm" / "train.sbatch"), "--parts", "p", "--out", "run"],
                           capture_output=True, text=True, env=job_env(**env), timeout=120, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        return shlex.split(p.stdout.strip().splitlines()[-1]), p.stderr

    cmd, log = command()
    assert cmd.count("--force") == 1 and "--resume" not in cmd and "has no checkpoint yet" in log, log
    (run / "checkpoint.pt").write_bytes(b"")
    cmd, log = command()
    assert cmd[cmd.index("--resume") + 1] == "run" and "--force" not in cmd and "--out" not in cmd, log


def test_train_check_runs_g3_trains_checks_without_training(tmp_path):
    """g3-train --check P (what the launchers run first) and under mpiexec --check: the start-up checks, exit 0
    with one line and no run directory; a failed one is one error line and exit 1 (2 for bad settings)."""
    parts = small_partition(tmp_path / "parts", 2)
    base = [sys.executable, "-m", "g3mpi.cli.train", "--parts", str(parts), "--out", str(tmp_path / "run")]
    p = subprocess.run(base + ["--check", "2"], capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0 and p.stdout.startswith("g3-train: check passed:") and not p.stderr, p.stderr
    (tmp_path / "mine.py").write_text("x = 1\n")
    for extra, code, want in [(["--check", "3"], 1, "the partition has 2 parts but 3 ranks were requested"),
                              (["--check", "2", "--epoch", "3"], 2, "--epoch 3 (did you mean '--epochs'?)"),
                              (["--check", "2", "--model-file", f"{tmp_path / 'mine.py'}:build"], 1,
                               "no function 'build' in it")]:
        p = subprocess.run(base + extra, capture_output=True, text=True, env=tool_env())
        assert p.returncode == code and p.stderr.count("\n") == 1 and want in p.stderr, (extra, p.stderr)
    assert not (tmp_path / "run").exists()
    p = run_mpi(2, "g3mpi.cli.train", "--check", "--parts", parts, "--out", tmp_path / "run", "--log-level",
                "WARNING")
    assert "g3-train: check passed:" in p.stdout + p.stderr and not (tmp_path / "run").exists()
