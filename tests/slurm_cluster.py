"""A local SLURM cluster for the tests (jobs/slurm/local-cluster.sh) under its own temporary directory and free
ports, so it cannot collide with a cluster somebody else started; always stopped at the end, with its daemons
checked to be gone. Needs root and slurm-wlm (installed with apt-get when missing); otherwise the caller skips and
says why (under G3_NO_SKIP=1, as in .ci/run, it fails instead)."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO, skip_or_fail, tool_env

JOBS = REPO / "jobs"
LOCAL_CLUSTER = JOBS / "slurm" / "local-cluster.sh"
DAEMONS = ("munged", "slurmctld", "slurmd")


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local SLURM needs root (SlurmUser=root, munged as user munge)"
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        return "slurm-wlm is not installed and apt-get is not available to install it"
    if not shutil.which("runuser"):
        return "runuser (util-linux) is missing: munged cannot be started as user munge"
    return None


def free_port() -> int:
    return free_ports(1)


def free_ports(n: int) -> int:
    """The first of n consecutive free TCP ports on 127.0.0.1 (node i's slurmd listens on the first + i - 1)."""
    for _ in range(100):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1]
            try:
                for port in range(base + 1, base + n):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"found no {n} consecutive free ports")


@dataclass
class Job:
    jobid: str
    returncode: int
    exit_code: str  # SLURM's ExitCode=status:signal
    log: str
    stderr: str


def mpich_segment(jobid: str, step: int) -> str:
    """MPICH's shared-memory segment of a SLURM job step: mpich_shm_<FNV-1a of "jobid.stepid">_<node>."""
    h = 2166136261
    for c in f"{jobid}.{step}".encode():
        h = ((h ^ c) * 16777619) & 0xFFFFFFFF
    return f"mpich_shm_{h:x}_0"


def alive(pid: int, name: str) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        state = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return comm == name and state != "Z"


@dataclass
class Cluster:
    dir: Path
    env: dict
    aborted_segments: list = field(default_factory=list)

    def run(self, *cmd, timeout: float = 60, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env or self.env,
                              timeout=timeout, **kw)

    def processes(self) -> list:
        """(daemon name, pid) of every daemon with a PID file: munged, slurmctld and one slurmd per node."""
        files = [("munged", self.dir / "munge" / "munged.pid"), ("slurmctld", self.dir / "run" / "slurmctld.pid")]
        files += [("slurmd", f) for f in sorted((self.dir / "run").glob("slurmd-*.pid"))]
        return [(name, int(f.read_text())) for name, f in files if f.exists() and f.read_text().strip()]

    def pids(self) -> dict:
        """Daemon name -> pid; on a cluster of one node that is every daemon (else see processes())."""
        return dict(self.processes())

    def job_env(self, **extra) -> dict:
        env = dict(self.env)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def submit(self, script, *args, opts=(), cwd: Path, env: dict | None = None) -> str:
        """sbatch without waiting; returns the job ID."""
        p = subprocess.run(["sbatch", "--parsable", *opts, str(script), *map(str, args)], capture_output=True,
                           text=True, env=env or self.env, cwd=cwd, timeout=60)
        assert p.returncode == 0, f"sbatch failed: {p.stderr}"
        return p.stdout.strip().split(";")[0]

    def sbatch_wait(self, script, *args, opts=(), cwd: Path, env: dict | None = None, timeout: float = 900,
                    name: str | None = None) -> Job:
        """sbatch --wait: the command's exit status is the job's."""
        cmd = ["sbatch", "--parsable", "--wait", *opts, str(script), *map(str, args)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env or self.env, cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel_all()
            raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout}s")
        jobid = p.stdout.strip().split(";")[0].strip()
        assert jobid.isdigit(), f"no job ID from sbatch: {p.stdout!r} {p.stderr!r}"
        return self.job(jobid, cwd, p.returncode, p.stderr, name or Path(script).stem)

    def fields(self, jobid: str) -> dict:
        """scontrol show job's KEY=VALUE fields of a job."""
        show = self.run("scontrol", "show", "job", jobid, "-o").stdout
        return dict(kv.split("=", 1) for kv in show.split() if "=" in kv)

    def job(self, jobid: str, cwd: Path, returncode: int = -1, stderr: str = "", name: str = "") -> Job:
        fields = self.fields(jobid)
        log_path = Path(fields.get("StdOut", cwd / f"{name}-{jobid}.out"))
        log = log_path.read_text() if log_path.exists() else f"<no log at {log_path}>"
        return Job(jobid, returncode, fields.get("ExitCode", "?"), log, stderr)

    def cancel_all(self):
        ids = self.run("squeue", "-h", "-o", "%i").stdout.split()
        if ids:
            self.run("scancel", *ids)


@contextlib.contextmanager
def local_cluster(nodes: int = 1, **settings):
    """Start a cluster of ``nodes`` nodes (``settings``: more G3_SLURM_* variables), yield it, stop it and check
    that no daemon, MPICH segment of an aborted step or link to its slurm.conf is left. The link the clients'
    default slurm.conf would get goes to a temporary path (G3_SLURM_CONF_LINK), never to /etc."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    d = Path(tempfile.mkdtemp(prefix="g3-slurm-test-", dir="/tmp"))
    d.chmod(0o755)  # munged runs as user munge and must reach its directory below this one
    link = Path(tempfile.mkdtemp(prefix="g3-slurm-link-", dir="/tmp")) / "slurm.conf"
    env = {k: v for k, v in tool_env().items() if not k.startswith("SLURM_")}
    env.update(G3_SLURM_DIR=str(d), G3_SLURM_CTLD_PORT=str(free_port()), G3_SLURM_SLURMD_PORT=str(free_ports(nodes)),
               G3_SLURM_NODES=str(nodes), G3_SLURM_CONF_LINK=str(link), SLURM_CONF=str(d / "slurm.conf"),
               G3_PYTHON=sys.executable)
    env.update({k: str(v) for k, v in settings.items()})
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    c = Cluster(d, env)
    try:
        p = c.run("bash", LOCAL_CLUSTER, "start", timeout=600)
        if p.returncode == 3:
            skip_or_fail(f"local SLURM unavailable: {p.stderr.strip().splitlines()[-1]}")
        assert p.returncode == 0, f"local-cluster.sh start failed:\n{p.stderr}"
        yield c
    finally:
        processes = c.processes()
        p = c.run("bash", LOCAL_CLUSTER, "stop", timeout=120)
        left = [f"{name} (pid {pid})" for name, pid in processes if alive(pid, name)]
        stale = [seg for seg in c.aborted_segments if Path("/dev/shm", seg).exists()]
        linked = link.is_symlink()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(link.parent, ignore_errors=True)
        assert p.returncode == 0, f"local-cluster.sh stop failed:\n{p.stderr}"
        assert not left, f"daemons still running after stop: {left}"
        assert not stale, f"MPICH segments of aborted steps left in /dev/shm: {stale}"
        assert not linked, f"local-cluster.sh stop left the link {link}"
