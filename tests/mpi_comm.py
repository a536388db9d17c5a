"""MPI helper for tests/test_comm.py: the halo exchange moves exactly the right rows, both directions.

mpiexec -n P python -m mpi4py -m tests.mpi_comm PARTS [--sim-net SPEC] [--piece-rows N]
Forward: every owned row carries its global ID; each halo row must receive its own ID. Backward: each halo row
sends back 1 + its global ID; owners must accumulate, per row, the sum over the ranks that hold it as halo.
With --sim-net, no message may land before its simulated arrival time; with --piece-rows, messages travel in
pieces. Exits non-zero on any mismatch.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.comm import CommContext, HaloPlan, SimNet
from g3mpi.format import read_meta, read_part


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("--sim-net", default=None)
    ap.add_argument("--piece-rows", type=int, default=0)
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    meta = read_meta(a.parts)
    part = read_part(a.parts, comm.rank, meta)
    ctx = CommContext(comm, SimNet.from_spec(a.sim_net))
    plan = HaloPlan.from_part(part)
    width = 3
    ex = ctx.exchange(plan, width, piece_rows=a.piece_rows)
    gids = np.arange(part.owned_start, part.owned_end, dtype=np.float32)
    h = np.repeat(gids[:, None], width, axis=1) + np.arange(width, dtype=np.float32)
    for rnd in range(3):                        # persistent requests: the same plan runs again and again
        t0 = time.perf_counter()
        ex.start_forward(h + rnd)
        landed = ex.forward.wait_all()
        dt = time.perf_counter() - t0
        assert sorted(landed) == list(range(ex.forward.num_recvs)), landed
        want = np.repeat(part.halo_ids.astype(np.float32)[:, None], width, axis=1) + np.arange(width) + rnd
        assert np.array_equal(ex.halo, want), "halo rows differ from their owners' rows"
        if a.sim_net and len(plan.recv_parts):
            # every message became visible no earlier than its sender's post time + size/bandwidth + latency
            # (the stamp its sender computed; perf_counter is CLOCK_MONOTONIC, shared on one node)
            stamps = [float(st[0]) for st in ex.forward._stamp_in]
            assert time.perf_counter() >= max(stamps), "a message landed before its simulated arrival"
            assert dt > 0
        # backward
        ex.halo_grad[:] = (1.0 + part.halo_ids.astype(np.float32))[:, None]
        tr = ex.backward
        tr.begin()
        tr.send_all()
        tr.wait_all()
        grad = torch.zeros(part.num_owned, width)
        for i, idx in enumerate(plan.send_idx):
            grad.index_add_(0, torch.from_numpy(idx), torch.from_numpy(ex.grad_bufs[i]))
        copies = np.zeros(part.num_owned)
        for idx in plan.send_idx:
            np.add.at(copies, idx, 1)
        assert np.array_equal(grad[:, 0].numpy(), (copies * (1 + gids)).astype(np.float32))
    st = ctx.stats
    sent = comm.allreduce(st.bytes_sent)
    recv = comm.allreduce(st.bytes_recv)
    halo_total = comm.allreduce(part.num_halo)
    assert sent == recv == 2 * 3 * halo_total * width * 4, (sent, recv, halo_total)
    pieces = sum(len(b) - 1 for b in ex.recv_pieces)
    assert pieces == ex.forward.num_recvs
    if a.piece_rows > 0:    # every message of more than piece_rows rows travels in pieces
        assert all(len(b) - 1 == max(1, -(-int(b[-1]) // a.piece_rows)) for b in ex.recv_pieces + ex.send_pieces)
    assert comm.allreduce(st.messages_sent) == 2 * 3 * comm.allreduce(pieces)
    ctx.free()


if __name__ == "__main__":
    main()
