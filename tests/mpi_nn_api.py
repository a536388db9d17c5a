"""MPI helper for tests/test_nn_api.py: one training-mode forward + backward of ``Probe``, a model that calls every
public primitive of ``g3mpi.nn`` (propagate of each reduction with and without self loops, attention with
dropout, node dropout, the global reductions).

mpiexec -n P python -m mpi4py -m tests.mpi_nn_api PARTS OUT.npz [--schedule S]
Rank 0 writes OUT.npz: the initial parameters (``init/<name>``), the logits by original node ID, the loss and every
parameter gradient summed over ranks (``grad/<name>``).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn
from g3mpi.comm import CommContext
from g3mpi.sched import Schedule
from tests.mpi_common import gather_rows, rank_part, summed_grads, training_rows

HID, HEADS, CH = 5, 2, 3
P_DROP, P_ATT = 0.4, 0.3
SEED, EPOCH = 7, 3
REDUCES = [(r, loops) for r in ("sum", "mean", "gcn") for loops in (False, True)]


class Probe(nn.Module):
    """x -> h = lin(x); every propagate of h, attention over h, global statistics of h, dropout -> out."""

    def __init__(self, graph, in_dim, out_dim):
        super().__init__()
        self.graph = graph
        self.lin = nn.Linear(in_dim, HID)
        self.props = nn.ModuleList([gnn.Propagate(graph, r, loops) for r, loops in REDUCES])
        self.att_lin = nn.Linear(HID, HEADS * CH, bias=False)
        self.att_src = nn.Parameter(torch.randn(1, HEADS, CH))
        self.att_dst = nn.Parameter(torch.randn(1, HEADS, CH))
        self.att = gnn.Attention(graph, HEADS, CH, dropout=P_ATT)     # dropout site 0
        self.drop = gnn.Dropout(graph, P_DROP)                         # dropout site 1
        self.out = nn.Linear(len(REDUCES) * HID + HEADS * CH + 3 * HID, out_dim)

    def forward(self, x, key=None):
        g = self.graph
        h = torch.tanh(self.lin(x))
        parts = [p(h) for p in self.props]
        z = self.att_lin(h).view(-1, HEADS, CH)
        a = self.att(z, (z * self.att_src).sum(-1), (z * self.att_dst).sum(-1), key)
        stats = torch.cat([gnn.global_sum(h, g) / g.num_nodes, gnn.global_mean(h * h, g), gnn.global_max(h, g)])
        feats = torch.cat(parts + [a.reshape(-1, HEADS * CH), stats.expand(len(h), -1)], dim=1)
        return self.out(self.drop(feats, key))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    ap.add_argument("--schedule", default="pipelined")
    a = ap.parse_args(argv)
    comm, meta, part = rank_part(a.parts)
    ctx = CommContext(comm)
    graph = gnn.Graph(part, ctx, Schedule(a.schedule))
    torch.manual_seed(0)
    net = Probe(graph, part.feature_dim, part.num_classes)
    init = {k: v.detach().clone().numpy() for k, v in net.state_dict().items()}
    x, y, train, n_train = training_rows(comm, part)
    net.train()
    logits = net(x, gnn.DropoutKey(SEED, EPOCH))
    loss = F.cross_entropy(logits[train], y[train], reduction="sum") / n_train
    loss.backward()
    res = {f"init/{k}": v for k, v in init.items()}
    res.update(summed_grads(comm, net))
    res["loss"] = np.array(comm.allreduce(float(loss.detach())))
    full = gather_rows(comm, part.orig_ids, logits.detach().numpy(), meta["num_nodes"])
    degs = comm.gather((graph.owned_ids.numpy(), graph.in_degree.numpy(), graph.out_degree.numpy(),
                        graph.halo_ids.numpy()), root=0)
    ctx.free()
    if comm.rank == 0:
        ind, outd = np.zeros(meta["num_nodes"], np.int64), np.zeros(meta["num_nodes"], np.int64)
        for own, di, do, _ in degs:
            ind[own], outd[own] = di, do
        res.update(logits=full, in_degree=ind, out_degree=outd,
                   halo_ids=np.concatenate([d[3] for d in degs]))
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
