"""MPI helper for the exactness tests: one forward + backward per model from a fixed initial state.

mpiexec -n P python -m mpi4py -m tests.mpi_exact PARTS OUT.npz [--models gcn,sage,gat] [--schedule S]
    [--chunk-rows N] [--jitter SECONDS] [--sim-net SPEC]
Rank 0 writes OUT.npz with, per model, the initial parameters, the logits by original node ID, the loss and
every parameter gradient (summed over ranks), so the test can compare with a single-process PyG reference.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from g3mpi.comm import CommContext, SimNet
from g3mpi.format import read_meta, read_part
from g3mpi.nn import GNN
from g3mpi.sched import Schedule

HIDDEN, HEADS = 8, 3


def build(model, graph, part, seed=0):
    torch.manual_seed(seed)
    return GNN(graph, model, part.feature_dim, HIDDEN, part.num_classes, layers=3 if model != "gat" else 2,
               heads=HEADS, out_heads=2, activation="relu" if model != "gat" else "elu")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--schedule", default="pipelined")
    ap.add_argument("--chunk-rows", type=int, default=0)
    ap.add_argument("--jitter", type=float, default=0.0)
    ap.add_argument("--sim-net", default=None)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    meta = read_meta(a.parts)
    part = read_part(a.parts, comm.rank, meta)
    simnet = SimNet.from_spec(a.sim_net, jitter=a.jitter, seed=comm.rank + 17)
    ctx = CommContext(comm, simnet)
    from g3mpi.ops import DistGraph
    graph = DistGraph(part, ctx, Schedule(a.schedule, a.chunk_rows))
    x = torch.from_numpy(part.features)
    y = torch.from_numpy(part.labels)
    train = torch.from_numpy(part.train_mask)
    n_train = comm.allreduce(int(train.sum()))
    res = {}
    for model in a.models.split(","):
        net = build(model, graph, part)
        init = {k: v.detach().clone() for k, v in net.state_dict().items()}
        for _ in range(a.repeat):
            net.zero_grad()
            logits = net(x)
            loss = F.cross_entropy(logits[train], y[train], reduction="sum") / n_train
            loss.backward()
        for k, p in net.named_parameters():
            g = p.grad.numpy().copy()
            comm.Allreduce(MPI.IN_PLACE, g)
            res[f"{model}/grad/{k}"] = g
        for k, v in init.items():
            res[f"{model}/init/{k}"] = v.numpy()
        res[f"{model}/loss"] = np.array(comm.allreduce(float(loss.detach())))
        ids = comm.gather(part.orig_ids, root=0)
        lg = comm.gather(logits.detach().numpy(), root=0)
        if comm.rank == 0:
            full = np.zeros((meta["num_nodes"], lg[0].shape[1]), dtype=np.float32)
            for i, l in zip(ids, lg):
                full[i] = l
            res[f"{model}/logits"] = full
    ctx.free()
    if comm.rank == 0:
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
