"""--device, --cuda-aware, --oversubscribe-gpus: which device each rank takes (g3mpi.train.device) and how
start-up refuses what cannot run, with faked GPU counts on the CPU and under mpiexec."""
from __future__ import annotations

import pytest
import torch
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.config import ConfigError, TrainConfig
from g3mpi.train.device import choose_device, mpi_cuda_support, node_rank, select_device, use_cuda_aware
from g3mpi.train.startup import Protocol, StartupFailed, select_rank_device
from tests.conftest import run_mpi
from tests.job_report import job_errors
from tests.graphs import partition, random_graph

SLOW_TESTS = ("test_ranks_of_one_node_take_their_gpus", "test_g3_train_refuses_cuda_on_every_rank")
CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize("kind,rank,size,gpus,over,want", [
    ("cpu", 1, 2, 0, False, "cpu"),
    ("cuda", 0, 1, 1, False, "cuda:0"),
    ("cuda", 2, 4, 4, False, "cuda:2"),
    ("cuda", 1, 2, 1, True, "cuda:0"),     # shared: rank r takes GPU r mod count
    ("cuda", 3, 4, 2, True, "cuda:1"),
])
def test_a_rank_takes_the_gpu_of_its_place_on_the_node(kind, rank, size, gpus, over, want):
    assert choose_device(kind, rank, size, gpus, over) == torch.device(want)


def test_more_ranks_than_gpus_is_an_error_unless_oversubscribed():
    with pytest.raises(ConfigError) as e:
        choose_device("cuda", 1, 2, 1)
    assert str(e.value) == ("--device cuda: 2 ranks on this node but 1 GPU: start at most 1 per node, or give "
                            "--oversubscribe-gpus to share them") and e.value.key == "device"
    with pytest.raises(ConfigError, match="3 ranks on this node but 2 GPUs"):
        choose_device("cuda", 0, 3, 2, wanted="auto")


def test_cuda_without_a_gpu_is_an_error():
    with pytest.raises(ConfigError, match=r"^--device cuda: this rank sees no CUDA GPU \(torch .*\); use --device "
                                          r"cpu$"):
        choose_device("cuda", 0, 1, 0, oversubscribe=True)


def test_select_device_on_one_rank():
    comm = MPI.COMM_SELF
    assert node_rank(comm) == (0, 1)
    assert select_device(comm, "auto", cuda_count=0) == torch.device("cpu")
    assert select_device(comm, "auto", cuda_count=2) == CUDA
    assert select_device(comm, "cuda", cuda_count=1) == CUDA
    assert select_device(comm, "cpu", cuda_count=3) == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        select_device(comm, "cuda", cuda_count=0)
    with pytest.raises(ConfigError, match="--device gpu: expected one of cpu, cuda, auto"):
        select_device(comm, "gpu")
    # the default count is torch's own
    assert select_device(comm, "auto").type == ("cuda" if torch.cuda.device_count() else "cpu")


@pytest.mark.parametrize("args,lines", [
    (("cuda", 0, "1,1"), ["rank 0: error: --device cuda: 2 ranks on this node but 1 GPU: start at most 1 per node, "
                          "or give --oversubscribe-gpus to share them"] * 2),
    (("cuda", 1, "1,1"), ["rank 0: cuda:0", "rank 1: cuda:0"]),
    (("cuda", 0, "2,2"), ["rank 0: cuda:0", "rank 1: cuda:1"]),
    (("auto", 0, "2,0"), ["rank 0: cpu", "rank 1: cpu"]),      # a rank without a GPU: every rank on the CPU
    (("auto", 0, "2,2"), ["rank 0: cuda:0", "rank 1: cuda:1"]),
])
def test_ranks_of_one_node_take_their_gpus(args, lines):
    """Two ranks on one node (tests/mpi_device.py, with a faked GPU count per rank): the node-local rank picks the
    GPU, ``auto`` agrees on one kind of device."""
    out = run_mpi(2, "tests.mpi_device", *args, timeout=120).stdout.splitlines()
    want = [line.replace("rank 0", f"rank {r}", 1) if ": error: " in line else line for r, line in enumerate(lines)]
    assert out == want


@pytest.mark.parametrize("setting,device,reported,direct", [
    ("auto", CUDA, True, True), ("auto", CUDA, False, False), ("on", CUDA, False, True), ("off", CUDA, True, False),
    ("on", torch.device("cpu"), True, False), ("auto", torch.device("cpu"), True, False),
])
def test_cuda_aware_messages(setting, device, reported, direct):
    assert use_cuda_aware(setting, device, reported) is direct


def test_cuda_aware_refuses_a_bad_setting():
    with pytest.raises(ConfigError, match="--cuda-aware yes: expected one of auto, on, off"):
        use_cuda_aware("yes", CUDA, True)


MPICH = "MPICH Version:      5.0.2\nMPICH Device:       ch4:ucx\nMPICH configure:    --prefix=/x {}\nMPICH CC: cc"


@pytest.mark.parametrize("text,reported", [
    (MPICH.format("--with-cuda=/usr/local/cuda --with-device=ch4:ucx"), True),
    (MPICH.format("--with-cuda"), True),
    (MPICH.format("--with-device=ch4:ucx --without-cuda"), False),
    (MPICH.format("--with-cuda=no"), False),
    (MPICH.format("--with-cudart=/x"), False),
    ("Open MPI v4.1.6, package: Open MPI builder, ident: 4.1.6, repo rev: v4.1.6, Sep 30, 2023", False),
])
def test_mpi_cuda_support_from_the_library_version(text, reported):
    assert mpi_cuda_support(text) is reported
    assert isinstance(mpi_cuda_support(), bool)


def _protocol():
    return Protocol(Watchdog(MPI.COMM_SELF, 0.0, prog="g3-train"))


def test_start_up_refuses_a_device_the_runtime_does_not_compute_on(capfd):
    """A rank that has a GPU (faked here) stops at the start-up check 'device': the runtime computes on the CPU
    only so far."""
    with pytest.raises(StartupFailed):
        select_rank_device(_protocol(), TrainConfig(device="cuda"), cuda_count=1)
    assert capfd.readouterr().err == (
        "g3-train: error: [rank 0] --device cuda: this rank would compute on cuda:0, but the training runtime "
        "computes on the cpu only so far (its CUDA path is not in yet); use --device cpu\n")
    with pytest.raises(StartupFailed):
        select_rank_device(_protocol(), TrainConfig(device="cuda"), cuda_count=0)
    assert "--device cuda: this rank sees no CUDA GPU" in capfd.readouterr().err


def test_start_up_on_the_cpu():
    assert select_rank_device(_protocol(), TrainConfig()) == (torch.device("cpu"), False)
    assert select_rank_device(_protocol(), TrainConfig(device="auto"), cuda_count=0) == (torch.device("cpu"), False)


def test_g3_train_refuses_cuda_on_every_rank(tmp_path):
    """g3-train --device cuda: the job's line (no GPU here; on a one-GPU machine two ranks outnumber it; with
    more, the runtime's CPU-only refusal), exit status 1, no run directory; no rank waits for another."""
    partition(random_graph(n=60, f=4, c=3, seed=1), 2, tmp_path / "p2", seed=2)
    p = run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / "p2", "--out", tmp_path / "run", "--no-progress",
                "--device", "cuda", check=False, timeout=120)
    assert p.returncode == 1, p.stderr
    gpus = torch.cuda.device_count()
    why = ("this rank sees no CUDA GPU" if gpus == 0 else "2 ranks on this node but 1 GPU" if gpus == 1
           else "this rank would compute on cuda:")
    lines = job_errors(p.stderr, "g3-train")   # one for both ranks, or one each where they differ (cuda:0, cuda:1)
    assert all(f"] --device cuda: {why}" in x for x in lines), p.stderr
    assert lines[0].startswith("g3-train: error: [ranks 0-1] ") if len(lines) == 1 else len(lines) == 2, p.stderr
    assert not (tmp_path / "run").exists()


def test_link_task_refused_on_a_gpu_at_start_up(capfd, monkeypatch):
    """Where the runtime computes on a GPU (faked: the CUDA path of issue 28 lets it), --task link still stops at
    the start-up check 'device', one line: the pair exchange moves host rows only. The node tasks go on."""
    from g3mpi.train import startup
    monkeypatch.setattr(startup, "RUNTIME_DEVICES", ("cpu", "cuda"))
    cfg = TrainConfig(device="cuda", task="link", metric="roc_auc")
    with pytest.raises(StartupFailed):
        select_rank_device(_protocol(), cfg, cuda_count=1)
    assert capfd.readouterr().err == (
        "g3-train: error: [rank 0] --device cuda with --task link: this rank would compute on cuda:0, but the pair "
        "exchange that scores node pairs runs on the cpu only so far; use --device cpu\n")
    assert select_rank_device(_protocol(), TrainConfig(device="cuda"), cuda_count=1)[0] == torch.device("cuda:0")


def test_pair_exchange_refuses_device_embeddings():
    """The library check under the start-up one: a graph with a device stager, or embeddings off the host."""
    from types import SimpleNamespace

    from g3mpi.ops.pairs import PairExchange
    with pytest.raises(NotImplementedError, match="ranks computing on a device are not supported yet"):
        PairExchange(SimpleNamespace(stager=object()), [0], [0])
