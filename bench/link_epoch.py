"""One task's training epochs on a partition, per rank: epoch time, the pair exchange's bytes against their lower
bound, peak RSS (issue 50's R-MAT link benchmark; the driver runs it for ``--task link`` and for the node task of
the same encoder, alternating, in separate processes so that each one's peak RSS is its own).

    mpiexec -n 2 python -m mpi4py bench/link_epoch.py --parts DIR --task link|multiclass --epochs 3 --json OUT

Epoch 1 is a warm-up (its pairs planned, buffers allocated) and is not reported. The lower bound of the pair
exchange: every distinct row a rank's pairs need from another rank, once forward (its embedding) and once backward
(its gradient), ``embed_dim`` float32 each; measured: the bytes the exchanges named ``train-pairs/*`` sent.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train import TrainConfig, Trainer
from g3mpi.train.memory import BASELINE_BYTES, pairs_split, rank_memory
from g3mpi.train.startup import read_rank_part, start_up_sums
from g3mpi.train.sysmem import peak_rss_bytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", required=True)
    ap.add_argument("--task", default="link")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=1)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    base = peak_rss_bytes()
    meta, part = read_rank_part(a.parts, comm, verify=False)
    sizes, _ = start_up_sums(part, Watchdog(comm, 0))
    link = a.task == "link"
    cfg = TrainConfig(parts=a.parts, out="", model="gcn", layers=2, hidden=a.hidden, dropout=0.0, weight_decay=0.0,
                      task=a.task, metric="roc_auc" if link else "accuracy", embed_dim=a.hidden,
                      negatives=a.negatives, epochs=a.epochs + 1, verify=False, progress=False)
    tr = Trainer(cfg, comm, part, meta, sizes)
    epochs = []
    for ep in range(1, a.epochs + 2):
        comm.Barrier()
        t0 = time.perf_counter()
        rec = tr.train_step(ep)
        wall = time.perf_counter() - t0
        per = tr.ctx.stats.per_exchange
        pair_bytes = sum(v.get("bytes_sent", 0) for k, v in per.items() if k.startswith("train-pairs"))
        fetched = tr.link.train_pairs(ep)[0].plan.num_fetched if link else 0
        pairs = tr.link.train_pairs(ep)[0].num_pairs if link else 0
        if ep > 1:
            epochs.append(dict(epoch_time_s=rec["epoch_time_s"], wall_s=wall, loss=rec["loss"],
                               bytes_sent=rec["bytes_sent"], pair_bytes_sent=int(pair_bytes),
                               pair_bytes_lower_bound=int(2 * fetched * a.hidden * 4), pairs=int(pairs),
                               fetched_rows=int(fetched)))
    # the memory model: the encoder's terms (its output as wide as the embedding or the classes) and the pairs'
    out_dim = a.hidden if link else part.num_classes
    pm = meta["parts"][comm.rank]
    enc = rank_memory("gcn", owned=part.num_owned, halo=part.num_halo, send=len(part.send_rows),
                      edges=int(part.num_local_edges), feature_dim=part.feature_dim, hidden=a.hidden,
                      num_classes=out_dim, layers=2, cut_edges=int(pm.get("cut_edges", 0)),
                      symmetric=bool(meta.get("symmetric", False)))
    model = enc["peak"]
    pairs_term = 0
    if link:
        px = tr.link.train_pairs(a.epochs + 1)[0]
        full = tr.link.ids._dir.full
        pairs_term = sum(pairs_split(pairs=px.num_pairs, fetched=px.plan.num_fetched,
                                     sent=sum(len(i) for i in px.plan.halo.send_idx), width=a.hidden,
                                     owned=part.num_owned, nodes=0 if full is None else len(full)).values())
        model += pairs_term
    mine = dict(rank=comm.rank, owned=part.num_owned, halo=part.num_halo, edges=int(part.num_local_edges),
                peak_rss_bytes=peak_rss_bytes(), rss_base_bytes=base, model_peak_bytes=int(model),
                model_pairs_bytes=int(pairs_term), model_baseline_bytes=BASELINE_BYTES,
                peak_over_model=peak_rss_bytes() / model, epochs=epochs)
    every = comm.gather(mine, root=0)
    tr.close()
    if comm.rank == 0:
        n = len(every[0]["epochs"])
        slowest = [max(r["epochs"][i]["epoch_time_s"] for r in every) for i in range(n)]
        out = dict(task=a.task, parts=a.parts, model="gcn", layers=2, hidden=a.hidden, negatives=a.negatives,
                   ranks=every, epoch_time_s=slowest, epoch_time_median_s=float(np.median(slowest)))
        if link:
            got = sum(r["epochs"][-1]["pair_bytes_sent"] for r in every)
            low = sum(r["epochs"][-1]["pair_bytes_lower_bound"] for r in every)
            out.update(pair_bytes_sent=got, pair_bytes_lower_bound=low, pair_bytes_ratio=got / max(low, 1))
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(json.dumps({k: v for k, v in out.items() if k != "ranks"}))


if __name__ == "__main__":
    main()
