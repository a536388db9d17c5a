"""Which device a training rank computes on (``--device cpu|cuda|auto``), and whether its MPI takes device
buffers (``--cuda-aware auto|on|off``).

A rank's GPU follows from its place among the ranks of its node: ``comm.Split_type(MPI.COMM_TYPE_SHARED)`` gives
the node-local rank r and the node's rank count n, and rank r takes GPU r (of the GPUs this process sees). Vendor
or launcher environment variables are never read for it. When n exceeds the node's GPUs the ranks would share
GPUs: an error unless ``--oversubscribe-gpus``, with which rank r takes GPU r mod count. ``auto`` is CUDA when
every rank sees a GPU, else the CPU on every rank (so that all ranks compute alike).

Every rank calls :func:`select_device` (it is collective); it raises :class:`~.config.ConfigError` naming the
option, on every rank that cannot have the device, only after the collectives, so that the caller's start-up
agreement reaches every rank.
"""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from .config import CUDA_AWARE, DEVICES, ConfigError


def node_rank(comm) -> tuple[int, int]:
    """(this rank's index among the ranks of ``comm`` on its node, how many ranks of ``comm`` the node has);
    collective."""
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        return local.rank, local.size
    finally:
        local.Free()


def choose_device(kind: str, local_rank: int, local_size: int, gpus: int, oversubscribe: bool = False,
                  wanted: str | None = None) -> torch.device:
    """The device of node-local rank ``local_rank`` of ``local_size`` on a node with ``gpus`` GPUs, for the device
    ``kind`` (``cpu`` or ``cuda``; ``wanted``: the setting as given, for messages). ConfigError when CUDA is asked
    for and there is no GPU, or when the ranks outnumber the GPUs and ``oversubscribe`` is off."""
    opt = f"--device {wanted or kind}"
    if kind == "cpu":
        return torch.device("cpu")
    if kind != "cuda":
        raise ConfigError(f"{opt}: expected one of {', '.join(DEVICES)}", "device")
    if gpus < 1:
        raise ConfigError(f"{opt}: this rank sees no CUDA GPU (torch {torch.__version__}, CUDA "
                          f"{torch.version.cuda or 'not built in'}); use --device cpu", "device")
    if local_size > gpus and not oversubscribe:
        raise ConfigError(f"{opt}: {local_size} ranks on this node but {gpus} GPU{'' if gpus == 1 else 's'}: start "
                          f"at most {gpus} per node, or give --oversubscribe-gpus to share them", "device")
    return torch.device("cuda", local_rank % gpus)


def select_device(comm, wanted: str, oversubscribe: bool = False, cuda_count: int | None = None) -> torch.device:
    """This rank's device for the setting ``wanted`` (one of DEVICES), on every rank of ``comm`` (collective).
    ``cuda_count``: the GPUs this process sees (default ``torch.cuda.device_count()``, which does not initialise
    CUDA)."""
    local_rank, local_size = node_rank(comm)
    gpus = torch.cuda.device_count() if cuda_count is None else int(cuda_count)
    kind = wanted
    if wanted == "auto":
        every = np.array([int(gpus > 0)], dtype=np.int32)    # (a buffer call: nothing pickled)
        comm.Allreduce(MPI.IN_PLACE, every, op=MPI.MIN)
        kind = "cuda" if every[0] else "cpu"
    return choose_device(kind, local_rank, local_size, gpus, oversubscribe, wanted)


def mpi_cuda_support(library_version: str | None = None) -> bool:
    """Whether this MPI reports that it takes CUDA device buffers: MPICH names its configure options in its
    library version (``MPI.Get_library_version()``, or ``library_version``), so a build ``--with-cuda`` reports
    it (not ``--without-cuda`` nor ``--with-cuda=no``); other MPIs report nothing here (mpi4py has no query), so
    ``--cuda-aware auto`` stages through host memory with them and ``on`` asserts the support."""
    text = MPI.Get_library_version() if library_version is None else library_version
    for line in text.splitlines():
        if line.startswith("MPICH configure:"):
            opts = line.split(":", 1)[1].split()
            return any(o == "--with-cuda" or o.startswith("--with-cuda=") and o != "--with-cuda=no" for o in opts)
    return False


def use_cuda_aware(setting: str, device: torch.device, reported: bool) -> bool:
    """Whether messages go from device memory straight to MPI (True) or through host staging buffers, for the
    ``--cuda-aware`` ``setting`` on ``device``, where the MPI ``reported`` CUDA support (:func:`mpi_cuda_support`):
    ``auto`` follows the report, ``on`` asserts the support, ``off`` stages; a CPU rank has no device buffers."""
    if setting not in CUDA_AWARE:
        raise ConfigError(f"--cuda-aware {setting}: expected one of {', '.join(CUDA_AWARE)}", "cuda_aware")
    if device.type != "cuda" or setting == "off":
        return False
    return setting == "on" or reported
