"""MPI helper for tests/test_embedding.py: the trainer (``--node-embedding``) trains a GCN on learned node
embeddings for a few steps; rank 0 gathers the tables and their Adam moments by original node ID.

mpiexec -n P python -m mpi4py -m tests.mpi_embed PARTS OUT.npz STEPS [--dropout P]
OUT.npz: ``init/<name>`` the replicated initial parameters, ``emb``, ``emb_m``, ``emb_v`` (table, Adam's first
and second moments) [N, DIM] and ``emb_step`` after STEPS steps, ``final/<name>``, ``loss`` per step.
"""
from __future__ import annotations

import argparse

import numpy as np

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.nn import sharded_parameters
from g3mpi.train.config import TrainConfig
from g3mpi.train.startup import start_up_sums
from g3mpi.train.trainer import Trainer
from tests.mpi_common import gather_rows, rank_part

DIM, HID, SEED, LR = 6, 5, 3, 0.05


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("out")
    ap.add_argument("steps", type=int)
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args(argv)
    comm, meta, part = rank_part(a.parts, threads=None)
    cfg = TrainConfig(parts=a.parts, model="gcn", node_embedding=DIM, hidden=HID, layers=2, dropout=a.dropout,
                      lr=LR, epochs=a.steps, seed=SEED, progress=False, plots=False, timeline_epoch=0,
                      comm_timeout=0)
    wd = Watchdog(comm, 0)
    sizes, _ = start_up_sums(part, wd)
    tr = Trainer(cfg, comm, part, meta, sizes, watchdog=wd, release_edges=False)
    (name, emb), = sharded_parameters(tr.model).items()
    res = {f"init/{k}": v.detach().numpy().copy() for k, v in tr.model.state_dict().items() if k != name}
    res["emb_init"] = gather_rows(comm, part.orig_ids, emb.detach().numpy(), meta["num_nodes"], np.nan)
    res["loss"] = np.array([tr.train_step(e)["loss"] for e in range(1, a.steps + 1)])
    st = tr.opt.state[emb]
    for k, t in (("emb", emb.detach()), ("emb_m", st["exp_avg"]), ("emb_v", st["exp_avg_sq"])):
        res[k] = gather_rows(comm, part.orig_ids, t.numpy(), meta["num_nodes"], np.nan)
    res["emb_step"] = np.array(float(st["step"]))
    res["name"] = np.array(name)
    res.update({f"final/{k}": v.detach().numpy().copy() for k, v in tr.model.state_dict().items() if k != name})
    tr.close()
    if comm.rank == 0:
        np.savez(a.out, **res)


if __name__ == "__main__":
    main()
