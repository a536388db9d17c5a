"""What the tests' MPI helpers (tests/mpi_*.py) share: this rank's part, its training rows, parameter gradients
summed over ranks, and rows gathered by original node ID on rank 0."""
from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.format import read_meta, read_part
from g3mpi.format.features import widen


def rank_part(parts, threads: int | None = 1):
    """(MPI.COMM_WORLD, meta.json, this rank's part) of the partition ``parts``; torch on ``threads`` threads (None:
    as it is)."""
    comm = MPI.COMM_WORLD
    if threads is not None:
        torch.set_num_threads(threads)
    meta = read_meta(parts)
    return comm, meta, read_part(parts, comm.rank, meta)


def training_rows(comm, part):
    """(x: the features as float32, y: the labels, the training mask, the training rows of every rank)."""
    train = torch.from_numpy(part.train_mask)
    return (torch.from_numpy(widen(part.features, part.feature_dtype)), torch.from_numpy(part.labels), train,
            comm.allreduce(int(train.sum())))


def summed_grads(comm, net, prefix: str = "") -> dict:
    """{``prefix`` + "grad/" + name: the parameter's gradient summed over ranks}; a rank whose backward reached
    no parameter (it owns no nodes) adds zeros, as GradSync does."""
    res = {}
    for k, p in net.named_parameters():
        g = p.grad.numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
        comm.Allreduce(MPI.IN_PLACE, g)
        res[f"{prefix}grad/{k}"] = g
    return res


def gather_rows(comm, ids, rows: np.ndarray, n: int, fill: float = 0.0):
    """The rows (or values) of every rank at their indices ``ids`` of ``n`` on rank 0, ``fill`` where no rank has
    one (None on the other ranks)."""
    got = comm.gather((ids, rows), root=0)
    if comm.rank:
        return None
    full = np.full((n,) + rows.shape[1:], fill, dtype=np.float32)
    for i, r in got:
        full[i] = r
    return full
