"""The local SLURM cluster with two nodes (two slurmd on this host), started as a user on an HPC system would:
OMP_NUM_THREADS=1 exported, no CPU count given. A first sbatch runs at once, a job that can never run is refused
at submission, and prepare -> partition -> train on Cora runs with ranks on both nodes."""
from __future__ import annotations

import json
import os
import re
from collections import Counter

import pytest

from tests.conftest import CORA
from tests.slurm_cluster import JOBS, LOCAL_CLUSTER, local_cluster

NODES = 2
# the CPUs the node must advertise: the hardware's, whatever OMP_NUM_THREADS says (2 on a one-core machine, where
# the -N 2 job would not fit otherwise)
HW_CPUS = len(os.sched_getaffinity(0))
CPUS = max(2, HW_CPUS)
# the pip MPICH under srun runs OFI (docs/JOBS.md, "srun or mpiexec")
HELLO = ('MPIR_CVAR_CH4_NETMOD=ofi srun --mpi=pmi2 "$G3_PYTHON" -m mpi4py -c '
         '"import os; from mpi4py import MPI; c = MPI.COMM_WORLD; '
         "print('hello', c.rank, c.size, os.environ['SLURMD_NODENAME'], flush=True)\"")


@pytest.fixture(scope="module")
def cluster():
    settings = {} if HW_CPUS >= 2 else {"G3_SLURM_CPUS": CPUS}
    with local_cluster(NODES, OMP_NUM_THREADS=1, **settings) as c:
        yield c


def _node_names(cluster) -> list:
    return cluster.run("sinfo", "-h", "-N", "-o", "%N").stdout.split()


def test_two_nodes_with_the_hardware_cpus(cluster):
    assert cluster.env["OMP_NUM_THREADS"] == "1"
    p = cluster.run("sinfo", "-h", "-N", "-o", "%N %T %c")
    assert p.returncode == 0, p.stderr
    nodes = [line.split() for line in p.stdout.splitlines()]
    assert len(nodes) == NODES and all(state == "idle" and int(cpus) == CPUS for _, state, cpus in nodes), nodes
    names = [name for name, _, _ in nodes]
    status = cluster.run("bash", LOCAL_CLUSTER, "status").stdout
    slurmd = [pid for name, pid in cluster.processes() if name == "slurmd"]
    assert len(set(slurmd)) == NODES
    for name in names:
        assert re.search(rf"slurmd: running \(pid \d+\) as node {re.escape(name)}$", status, re.M), status
    # a new shell finds the cluster: through the link start made (the clients' default slurm.conf; a temporary
    # path here), or through `env`
    assert os.readlink(cluster.env["G3_SLURM_CONF_LINK"]) == str(cluster.dir / "slurm.conf")
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_CONF"}
    p = cluster.run("bash", "-c", f'eval "$(bash {LOCAL_CLUSTER} env)" && sinfo -h -N -o %N', env=env)
    assert p.returncode == 0 and p.stdout.split() == names, p.stderr
    # start again: everything is running, nothing changes; another node count is refused while it runs
    before = cluster.processes()
    p = cluster.run("bash", LOCAL_CLUSTER, "start", timeout=120)
    assert p.returncode == 0 and "already running" in p.stderr and cluster.processes() == before, p.stderr
    p = cluster.run("bash", LOCAL_CLUSTER, "start", env=cluster.job_env(G3_SLURM_NODES=NODES + 1), timeout=120)
    assert p.returncode == 1 and f"runs with {NODES} node(s), not {NODES + 1}" in p.stderr, p.stderr
    assert cluster.processes() == before


def test_plain_sbatch_of_all_cpus_runs_at_once(cluster, tmp_path):
    """sbatch -n CPUS on one node: with CPUs=1 written for the node (nproc under OMP_NUM_THREADS=1) it pended for
    ever (Reason=PartitionConfig)."""
    job = cluster.sbatch_wait("--wrap", HELLO, opts=("-N1", f"-n{CPUS}", "--output=hello-%j.out"), cwd=tmp_path,
                              timeout=300, name="hello")
    assert job.returncode == 0 and job.exit_code == "0:0", job.log
    hello = [line.split() for line in job.log.splitlines() if line.startswith("hello")]
    assert sorted(int(rank) for _, rank, _, _ in hello) == list(range(CPUS)), job.log
    assert len({node for *_, node in hello}) == 1


@pytest.mark.parametrize("opts, why", [
    (("-N", 1, "-n", CPUS + 1), "Requested node configuration is not available"),
    (("-N", NODES + 1, "-n", NODES + 1), "Node count specification invalid"),
    (("-n", NODES * CPUS + 1), "More processors requested than permitted"),
])
def test_job_that_can_never_run_is_refused(cluster, tmp_path, opts, why):
    p = cluster.run("sbatch", "--parsable", *opts, "--wrap", "true", cwd=tmp_path, timeout=30)
    assert p.returncode != 0 and why in p.stderr, (p.returncode, p.stdout, p.stderr)
    assert not p.stdout.strip() and not cluster.run("squeue", "-h").stdout.strip()


def test_cora_trains_on_two_nodes(cluster, tmp_path):
    """prepare -> partition into 4 -> train with a plain sbatch -N 2 -n 4 (2 ranks per node) under srun --mpi=pmi2."""
    env = cluster.job_env(G3_GRAPH="cora.h5", G3_NUM_PARTS=4, G3_PARTS="parts", G3_OUT="run")
    dep = ("--kill-on-invalid-dep=yes",)
    prep = cluster.submit(JOBS / "slurm" / "prepare.sbatch", "npz", CORA, "--normalize-features",
                          opts=("--cpus-per-task=1",), cwd=tmp_path, env=env)
    part = cluster.submit(JOBS / "slurm" / "partition.sbatch",
                          opts=("--cpus-per-task=1", f"--dependency=afterok:{prep}", *dep), cwd=tmp_path, env=env)
    train = cluster.sbatch_wait(JOBS / "slurm" / "train.sbatch", "--model", "gcn", "--epochs", 200, "--hidden", 16,
                                "--dropout", 0.5, "--lr", 0.01, "--weight-decay", 5e-4, "--seed", 0,
                                opts=(f"--nodes={NODES}", "--ntasks=4",
                                      f"--dependency=afterok:{part}", *dep),
                                cwd=tmp_path, env=env, timeout=1200, name="g3-train")
    for stage, job in (("prepare", cluster.job(prep, tmp_path, name="g3-prepare")),
                       ("partition", cluster.job(part, tmp_path, name="g3-partition")), ("train", train)):
        assert job.exit_code == "0:0", f"{stage} job {job.jobid} ExitCode={job.exit_code}\n{job.log}"
    assert train.returncode == 0, train.log
    names = _node_names(cluster)
    # each rank (its rank from the communicator, in the log prefix) names the SLURM node it runs on
    placed = dict(re.findall(r"\[rank (\d)/4\] INFO g3mpi: part \1 on node (\S+):", train.log))
    assert sorted(placed) == ["0", "1", "2", "3"], train.log
    assert Counter(placed.values()) == {name: 2 for name in names}, placed
    world = re.search(r"MPI world check passed: 4 ranks, one world of size 4 \((.*)\)", train.log)
    assert world and sorted(world.group(1).split()) == sorted(f"{name}:2" for name in names), train.log
    # the pip MPICH's UCX addresses overflow Slurm's 1024-byte PMI-1 read at random: the job picks OFI
    assert "srun: MPICH netmod ofi" in train.log, train.log
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["test_acc"] >= 0.79, summary
