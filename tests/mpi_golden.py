"""MPI helper for tests/test_golden.py: logits and parameter gradients of every built-in model, one training-mode
forward + backward from a fixed seed (dropout off), as ``build_model`` makes it from a ``TrainConfig``.

mpiexec -n P python -m mpi4py -m tests.mpi_golden PARTS OUT.npz
Rank 0 writes OUT.npz: ``<spec>/logits`` by original node ID and ``<spec>/grad/<param>`` summed over ranks.
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from g3mpi.comm import CommContext
from g3mpi.nn import build_model
from g3mpi.ops import DistGraph
from g3mpi.sched import Schedule
from g3mpi.train.config import TrainConfig
from tests.mpi_common import gather_rows, rank_part, summed_grads, training_rows
from tests.mpi_recipe import HEADS, HIDDEN, SPECS

#: every built-in model: the plain stacks and the recipe stacks and appnp / gcn2 of tests/mpi_recipe.py
GOLDEN = {"gcn": dict(model="gcn", layers=3), "sage": dict(model="sage", layers=3),
          "gat": dict(model="gat", layers=2, activation="elu"), **SPECS}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    a = ap.parse_args(argv)
    comm, meta, part = rank_part(a.parts)
    x, y, train, n_train = training_rows(comm, part)
    ctx = CommContext(comm)
    graph = DistGraph(part, ctx, Schedule("pipelined"))
    res = {}
    for name, spec in GOLDEN.items():
        torch.manual_seed(0)
        cfg = TrainConfig(hidden=HIDDEN, heads=HEADS, out_heads=2, dropout=0.0, **spec)
        net = build_model(graph, cfg, part.feature_dim, part.num_classes)
        net.train()
        logits = net(x)
        loss = F.cross_entropy(logits[train], y[train], reduction="sum") / n_train
        loss.backward()
        res.update(summed_grads(comm, net, f"{name}/"))
        full = gather_rows(comm, part.orig_ids, logits.detach().numpy(), meta["num_nodes"])
        if comm.rank == 0:
            res[f"{name}/logits"] = full
    ctx.free()
    if comm.rank == 0:
        np.savez_compressed(a.out, **res)


if __name__ == "__main__":
    main()
