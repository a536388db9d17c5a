"""MPI helper for tests/test_recipe.py: one training-mode forward + backward, then one evaluation forward, of each
recipe stack and of appnp / gcn2 (``SPECS``), dropout off.

mpiexec -n P python -m mpi4py -m tests.mpi_recipe PARTS OUT.npz [--specs NAME,...] [--schedule S]
Rank 0 writes OUT.npz with, per spec, the initial state (parameters and buffers), the training-mode logits by
original node ID, the loss, every parameter gradient (summed over ranks), the buffers after the pass (BatchNorm's
running statistics) and the evaluation-mode logits, which use them.
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

HIDDEN, HEADS = 8, 3
#: name -> the TrainConfig settings of the model (dropout off); every block and both models appear
SPECS = {
    "gcn_all": dict(model="gcn", layers=3, residual=True, norm="batch", input_linear=True, output_linear=True,
                    ffn=True),
    "sage_layer_cat": dict(model="sage", layers=3, residual=True, norm="layer", jk="cat"),
    "gat_batch_max": dict(model="gat", layers=2, norm="batch", jk="max", ffn=True, activation="elu"),
    "gcn_batch_out": dict(model="gcn", layers=2, norm="batch", residual=True),
    # row-wise between the layers: the inter-layer pipeline (P > 1)
    "gcn_layer_pipe": dict(model="gcn", layers=3, residual=True, norm="layer", input_linear=True,
                           output_linear=True, ffn=True),
    "sage_res_pipe": dict(model="sage", layers=3, residual=True, ffn=True),
    "appnp": dict(model="appnp", layers=2, k=5, alpha=0.15),
    "gcn2": dict(model="gcn2", layers=4, alpha=0.2, theta=0.7),
}


def config(name: str) -> TrainConfig:
    return TrainConfig(hidden=HIDDEN, heads=HEADS, out_heads=2, dropout=0.0, **SPECS[name])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    ap.add_argument("--specs", default=",".join(SPECS))
    ap.add_argument("--schedule", default="pipelined")
    a = ap.parse_args(argv)
    comm, meta, part = rank_part(a.parts)
    x, y, train, n_train = training_rows(comm, part)
    ctx = CommContext(comm)
    graph = DistGraph(part, ctx, Schedule(a.schedule))
    res = {}
    for name in a.specs.split(","):
        torch.manual_seed(0)
        net = build_model(graph, config(name), part.feature_dim, part.num_classes)
        init = {k: v.detach().clone() for k, v in net.state_dict().items()}
        net.train()
        logits = net(x)
        loss = F.cross_entropy(logits[train], y[train], reduction="sum") / n_train
        loss.backward()
        res.update(summed_grads(comm, net, f"{name}/"))
        for k, v in init.items():
            res[f"{name}/init/{k}"] = v.numpy()
        for k, v in net.named_buffers():
            res[f"{name}/buffer/{k}"] = v.numpy().copy()
        net.eval()
        with torch.no_grad():
            evals = net(x)
        res[f"{name}/loss"] = np.array(comm.allreduce(float(loss.detach())))
        res[f"{name}/pipelined"] = np.array(bool(getattr(net, "pipelines", False)))
        for what, t in (("logits", logits), ("eval_logits", evals)):
            full = gather_rows(comm, part.orig_ids, t.detach().numpy(), meta["num_nodes"])
            if comm.rank == 0:
                res[f"{name}/{what}"] = full
    ctx.free()
    if comm.rank == 0:
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
