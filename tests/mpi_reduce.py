"""MPI helper of tests/test_reduce.py: global sum, mean and max of every rank's rows, forward and backward.

mpiexec -n P python -m mpi4py -m tests.mpi_reduce PARTS OUT.npz
Each rank reduces its owned rows of a fixed [N, 5] tensor (a function of the original node ID, with ties for the
max), takes a loss of the three results and runs backward; rank 0 writes the reduced values and every node's
gradient (by original ID) to OUT.npz.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.comm import CommContext
from g3mpi.format import read_meta, read_part
from g3mpi.ops import DistGraph
from g3mpi.ops.reduce import global_max, global_mean, global_sum


def values(ids: np.ndarray) -> torch.Tensor:
    """[len(ids), 5] float32, the same rows for the same IDs on every rank (column 4: a few tied maxima)."""
    rng = np.random.default_rng(7)
    n = int(ids.max()) + 1 if len(ids) else 0
    full = rng.standard_normal((max(n, 1) + 200, 5)).astype(np.float32)
    full[::3, 4] = 3.0
    return torch.from_numpy(full[ids])


def loss_of(x: torch.Tensor, sum_fn, mean_fn, max_fn):
    s, m, mx = sum_fn(x), mean_fn(x * x), max_fn(x)
    w = torch.arange(1, 6, dtype=torch.float32)
    return (s * w).sum() + (m * w.flip(0)).sum() + (mx * mx).sum(), (s, m, mx)


def main(argv=None):
    parts, out = (argv or sys.argv[1:])[:2]
    comm = MPI.COMM_WORLD
    part = read_part(parts, comm.rank, read_meta(parts))
    ctx = CommContext(comm)
    g = DistGraph(part, ctx)
    ids = np.asarray(part.orig_ids, dtype=np.int64)
    n_all = part.num_nodes
    x = values(np.arange(n_all))[torch.from_numpy(ids)].clone().requires_grad_(True)
    loss, (s, m, mx) = loss_of(x, lambda t: global_sum(t, g), lambda t: global_mean(t, g),
                               lambda t: global_max(t, g))
    # the job's loss is the sum of the ranks' losses: each rank takes 1/P of it, so the gradients add up to one
    (loss / comm.size).backward()
    grads = comm.gather((ids, x.grad.numpy()), root=0)
    vals = comm.gather(np.concatenate([s.detach().numpy(), m.detach().numpy(), mx.detach().numpy()]), root=0)
    ctx.free()
    if comm.rank == 0:
        grad = np.zeros((n_all, 5), dtype=np.float32)
        for i, gr in grads:
            grad[i] = gr
        assert all(np.array_equal(vals[0], v) for v in vals), "ranks disagree on the reduced values"
        np.savez(out, vals=vals[0], grad=grad)
        print("reduce ok")


if __name__ == "__main__":
    main()
