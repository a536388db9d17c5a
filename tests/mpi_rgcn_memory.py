"""One rank's peak RSS in training against the memory model (tests/test_rgcn_memory.py): R-GCN or GCN, with or
without learned node embeddings, 2 steps, then this rank's figures as one JSON line (rank 0 prints every rank's).

    mpiexec -n 2 python -m mpi4py -m tests.mpi_rgcn_memory PARTS MODEL NODE_EMBEDDING"""
from __future__ import annotations

import json
import sys

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train import TrainConfig, Trainer
from g3mpi.train.memory import BASELINE_BYTES, rank_memory
from g3mpi.train.startup import read_rank_part, start_up_sums
from g3mpi.train.sysmem import peak_rss_bytes


def main() -> None:
    parts, model, emb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    base = peak_rss_bytes()
    meta, part = read_rank_part(parts, comm, verify=False)
    sizes, _ = start_up_sums(part, Watchdog(comm, 0))
    cfg = TrainConfig(parts=parts, out="", model=model, layers=2, hidden=32, dropout=0.5, node_embedding=emb,
                      epochs=3, verify=False, progress=False)
    tr = Trainer(cfg, comm, part, meta, sizes)
    for ep in (1, 2):
        tr.train_step(ep)
    pm = meta["parts"][comm.rank]
    mod = rank_memory(model, owned=part.num_owned, halo=part.num_halo, send=len(part.send_rows),
                      edges=int(part.num_local_edges), feature_dim=part.feature_dim, hidden=32,
                      num_classes=part.num_classes, cut_edges=int(pm.get("cut_edges", 0)),
                      relations=int(meta.get("num_relations", 0)) if model == "rgcn" else 0, node_embedding=emb)
    mine = np.array([peak_rss_bytes() - base, mod["peak"] - BASELINE_BYTES], dtype=np.int64)
    every = np.zeros((comm.size, 2), dtype=np.int64)
    comm.Allgather(mine, every)
    if comm.rank == 0:
        print(json.dumps([dict(measured=int(a), modelled=int(b)) for a, b in every]))


if __name__ == "__main__":
    main()
