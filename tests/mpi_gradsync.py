"""MPI helper for tests/test_gradsync.py: bucketed gradient allreduce == one plain Allreduce of every gradient.

mpiexec -n P python -m mpi4py -m tests.mpi_gradsync [DEVICE [direct]]
A three-layer stack on DEVICE (default cpu; on a GPU staged through pinned host memory, or with ``direct`` the
device buffer handed to MPI) with rank-dependent inputs (so gradients differ per rank) and one parameter that gets no
gradient; two backward passes. Checks, on every rank: the summed gradients equal a reference ``Allreduce`` of
the local gradients bit for bit, the buckets of layers backward reaches started during backward (before
``flush``), the unused parameter's bucket is still reduced, and after ``close`` a backward pass starts nothing.
Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.train.gradsync import GradSync


def main(argv):
    device = torch.device(argv[0] if argv else "cpu")
    direct = argv[1:] == ["direct"]
    comm = MPI.COMM_WORLD
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(5, 7), torch.nn.Linear(7, 6), torch.nn.Linear(6, 3)]).to(device)
    unused = torch.nn.Parameter(torch.ones(4, device=device))
    buckets = [list(m.parameters()) for m in reversed(layers)] + [[unused]]
    sync = GradSync(comm, buckets, direct=direct)
    assert sync.buf.device.type == ("cuda" if direct else "cpu") and sync.direct == direct
    assert sync.buf.is_pinned() == (device.type == "cuda" and not direct)
    params = [p for b in buckets for p in b]
    gen = torch.Generator().manual_seed(100 + comm.rank)
    for step in range(2):
        for p in params:
            p.grad = torch.zeros_like(p)
        x = torch.randn(11, 5, generator=gen).to(device)
        h = x
        for i, m in enumerate(layers):
            h = m(h)
            if i < 2:
                h = torch.relu(h)
        sync.begin()
        (h ** 2).sum().backward()
        during = sync.started_during_backward
        sync.flush()
        local = [p.grad.detach().clone() for p in params]
        sync.wait()
        sync.unpack()
        for p, g in zip(params, local):
            ref = g.cpu().numpy().copy()
            comm.Allreduce(MPI.IN_PLACE, ref)
            assert p.grad.device == device and np.array_equal(p.grad.cpu().numpy(), ref), (step, p.shape)
        # the three layer buckets left during backward; the unused parameter's only at flush
        assert during == 3, during
    sync.close()
    # closed: the hooks are gone, so a later backward of the same model starts no allreduce
    sync.begin()
    sum(p.sum() for p in layers.parameters()).backward()
    assert sync.started_during_backward == 0 and all(r == MPI.REQUEST_NULL for r in sync.reqs)
    if comm.rank == 0:
        print("gradsync ok")


if __name__ == "__main__":
    main(sys.argv[1:])
