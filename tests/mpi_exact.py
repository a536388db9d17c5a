"""MPI helper for the exactness tests: one forward + backward per model from a fixed initial state.

mpiexec -n P python -m mpi4py -m tests.mpi_exact PARTS OUT.npz [--models gcn,sage,gat]
    [--variants SCHEDULE:CHUNK_ROWS:JITTER[:nocache],...] [--sim-net SPEC] [--repeat K] [--hidden H]
Rank 0 writes OUT.npz with, per variant and model, the initial parameters, the logits by original node ID, the
loss and every parameter gradient (summed over ranks), so a test can compare with a single-process PyG
reference or variants with each other. A variant is a schedule, a chunk size (0 = automatic, -1 = none) and a
maximum random extra delay per message in seconds (random completion orders), ``nocache`` to turn the
model's input cache off, ``pieceN`` for messages in pieces of about N bytes (``Schedule.piece_bytes``), and
``staged`` for every layer's exchange staged through host buffers as on a GPU rank, the CPU standing in
(``g3mpi.ops.staging``), ``dropP`` for dropout P on every layer's input and GAT's attention (the passes keyed
by epoch 1, 2, ...), ``halo`` for the model keeping its input's halo rows (``GNN.keep_input_halo``, fetched once
as the part stores them; what the trainer does), ``rematN`` for the row-wise blocks between aggregations
recomputed in backward, N rows at a time, and GAT's per-edge terms, by chunks of about N edges (``remat``: the
default chunks), ``haloD`` for halo messages travelling as D (bfloat16, float16: ``--halo-dtype``) and ``bf16``
for the forward under bf16-mixed precision (``g3mpi.ops.precision``).
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
from g3mpi.format.features import widen
from g3mpi.ops import DistGraph, DropoutKey
from g3mpi.ops import gat as g3gat
from g3mpi.ops import remat as g3remat
from g3mpi.ops.precision import autocast
from g3mpi.ops.staging import Stager
from g3mpi.sched import Schedule
from g3mpi.sched.schedule import PIECE_BYTES

HIDDEN, HEADS = 8, 3
DEFAULT_REMAT_ROWS, DEFAULT_REMAT_EDGES = g3remat.CHUNK_ROWS, g3gat.REMAT_EDGES


#: the R-GCN variants (a typed partition): model name -> the built-in rgcn's settings
RGCN = {"rgcn": {}, "rgcn-basis": dict(num_bases=2), "rgcn-block": dict(num_blocks=2)}


def build(model, graph, part, seed=0, hidden=HIDDEN, input_cache=True, dropout=0.0, remat=False):
    """(GAT: ``dropout`` on the attention coefficients too.)"""
    torch.manual_seed(seed)
    settings = RGCN.get(model, {})
    return GNN(graph, "rgcn" if model in RGCN else model, part.feature_dim, hidden, part.num_classes,
               layers=3 if model != "gat" else 2, heads=HEADS, out_heads=2,
               activation="relu" if model != "gat" else "elu", input_cache=input_cache, dropout=dropout,
               attn_dropout=dropout, remat=remat, **settings)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    ap.add_argument("--models", default="gcn,sage,gat")
    ap.add_argument("--variants", default="pipelined:0:0")
    ap.add_argument("--sim-net", default=None)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    meta = read_meta(a.parts)
    part = read_part(a.parts, comm.rank, meta)
    x = torch.from_numpy(widen(part.features, part.feature_dtype))
    y = torch.from_numpy(part.labels)
    train = torch.from_numpy(part.train_mask)
    n_train = comm.allreduce(int(train.sum()))
    res = {}
    ctxs = []
    for variant in a.variants.split(","):
        schedule, chunk, jitter, *flags = variant.split(":")
        simnet = SimNet.from_spec(a.sim_net, jitter=float(jitter), seed=comm.rank + 17)
        halo_dtype = [f[len("halo"):] for f in flags if f.startswith("halo") and f != "halo"]
        ctx = CommContext(comm, simnet, halo_dtype=halo_dtype[0] if halo_dtype else "float32")
        ctxs.append(ctx)
        pieces = [int(f[len("piece"):]) for f in flags if f.startswith("piece")]
        stager = Stager.for_device("cpu") if "staged" in flags else None
        graph = DistGraph(part, ctx, Schedule(schedule, int(chunk), piece_bytes=pieces[0] if pieces else PIECE_BYTES),
                          stager=stager)
        drop = [float(f[len("drop"):]) for f in flags if f.startswith("drop")]
        remat = [f for f in flags if f.startswith("remat")]
        g3remat.CHUNK_ROWS = int(remat[0][len("remat"):] or DEFAULT_REMAT_ROWS) if remat else DEFAULT_REMAT_ROWS
        g3gat.REMAT_EDGES = int(remat[0][len("remat"):] or DEFAULT_REMAT_EDGES) if remat else DEFAULT_REMAT_EDGES
        for model in a.models.split(","):
            net = build(model, graph, part, hidden=a.hidden, input_cache="nocache" not in flags,
                        dropout=drop[0] if drop else 0.0, remat=bool(remat))
            if "halo" in flags and net.input_cache:
                net.keep_input_halo(x, graph.halo_rows(part.features, "input"), part.feature_dtype)
            init = {k: v.detach().clone() for k, v in net.state_dict().items()}
            for epoch in range(1, a.repeat + 1):
                net.zero_grad()
                with autocast("bf16-mixed" if "bf16" in flags else "fp32"):
                    logits = net(x, DropoutKey(5, epoch) if drop else None).float()
                loss = F.cross_entropy(logits[train], y[train], reduction="sum") / n_train
                loss.backward()
            pre = f"{variant}/{model}"
            for k, p in net.named_parameters():
                # a rank that owns no nodes reaches no parameter in backward: it adds zeros (as GradSync does)
                g = p.grad.numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
                comm.Allreduce(MPI.IN_PLACE, g)
                res[f"{pre}/grad/{k}"] = g
            for k, v in init.items():
                res[f"{pre}/init/{k}"] = v.numpy()
            res[f"{pre}/loss"] = np.array(comm.allreduce(float(loss.detach())))
            res[f"{pre}/bytes_sent"] = np.array(comm.allreduce(ctx.stats.bytes_sent))
            res[f"{pre}/messages_sent"] = np.array(comm.allreduce(ctx.stats.messages_sent))
            ids = comm.gather(part.orig_ids, root=0)
            lg = comm.gather(logits.detach().numpy(), root=0)
            if comm.rank == 0:
                full = np.zeros((meta["num_nodes"], lg[0].shape[1]), dtype=np.float32)
                for i, l in zip(ids, lg):
                    full[i] = l
                res[f"{pre}/logits"] = full
    for ctx in ctxs:
        ctx.free()
    if comm.rank == 0:
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
