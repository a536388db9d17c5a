"""Link prediction with your own training loop: a GCN encoder, a decoder on node pairs (``g3mpi.nn.Pairs``), BCE
over the training pairs and one sampled negative each, ROC-AUC of the val and test pairs against fixed negatives.

    g3-prepare npz data/cora.npz --link-split 0.85,0.05,0.1 --split-seed 0 --out cora_lp.h5
    g3-partition cora_lp.h5 --parts 2 --out parts
    mpiexec -n 2 python -m mpi4py docs/examples/link_prediction.py parts --epochs 200

Each rank scores the pairs whose source it owns (its part's ``link_*_edge``, new global IDs); ``Pairs`` fetches the
targets' embeddings from their owners and returns their gradients. The negatives are keyed by (seed, epoch, the
pair's position in the split), so every number of ranks trains the same model. Prints one JSON line on rank 0:
best_epoch (by validation ROC-AUC), val_roc_auc, test_roc_auc, pair_bytes (sent by the pair exchanges in the last
epoch) and pair_bytes_bound (the distinct target rows each rank lacks, times their bytes).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

from g3mpi import nn as gnn
from g3mpi.comm import CommContext
from g3mpi.format import read_meta, read_part
from g3mpi.mpi.watchdog import Watchdog
from g3mpi.ops.negatives import negative_destinations
from g3mpi.train.metrics import ranking_metrics

#: the "epochs" that key the fixed evaluation negatives (training epochs are 1, 2, ...)
EVAL_EPOCH = {"val": -1, "test": -2}


def negatives(ids: gnn.NodeIds, n: int, seed: int, epoch: int, index: np.ndarray) -> torch.Tensor:
    """New global IDs of one negative target per pair at ``index`` (its position in the split)."""
    return ids.to_new(negative_destinations(seed, epoch, index, 1, n)[:, 0])


def _pair_bytes(ctx, width: int) -> int:
    """Bytes the training pairs' forward messages have sent so far (every epoch's exchange has the same name)."""
    return ctx.stats.per_exchange.get(f"train-pairs/{width}.fwd", {}).get("bytes_sent", 0)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("parts")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decoder", choices=sorted(gnn.DECODERS), default="dot")
    a = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    meta = read_meta(a.parts)
    part = read_part(a.parts, comm.rank, meta)
    ctx = CommContext(comm)
    graph = gnn.Graph(part, ctx)
    ids = gnn.NodeIds(graph)
    n = graph.num_nodes
    torch.manual_seed(a.seed)
    encoder = gnn.GNN(graph, "gcn", part.feature_dim, a.hidden, a.out, layers=2)
    decoder = gnn.DECODERS[a.decoder](a.out, a.hidden, 2)
    params = list(encoder.parameters()) + list(decoder.parameters())
    opt = torch.optim.Adam(params, lr=a.lr)
    x = torch.from_numpy(part.features)
    links = part.links
    tr = torch.from_numpy(links["link_train_edge"])
    tr_index = links["link_train_edge_index"]
    n_train = comm.allreduce(len(tr))

    # evaluation pairs: planned once per run (positives, then one fixed negative each), val then test
    src, dst, label, group = [], [], [], []
    for g, s in enumerate(("val", "test")):
        e = torch.from_numpy(links[f"link_{s}_edge"])
        neg = negatives(ids, n, a.seed, EVAL_EPOCH[s], links[f"link_{s}_edge_index"])
        src += [e[:, 0], e[:, 0]]
        dst += [e[:, 1], neg]
        label += [np.ones(len(e), bool), np.zeros(len(e), bool)]
        group += [np.full(2 * len(e), g)]
    evaluation = gnn.Pairs(graph, torch.cat(src), torch.cat(dst), name="eval-pairs")
    label, group = np.concatenate(label), np.concatenate(group)
    wd = Watchdog(comm, 0)

    best = dict(val=-1.0, test=float("nan"), epoch=0)
    for epoch in range(1, a.epochs + 1):
        encoder.train()
        # the training pairs with this epoch's negatives: planned once per epoch
        neg = negatives(ids, n, a.seed, epoch, tr_index)
        dst = torch.cat([tr[:, 1], neg])
        pairs = gnn.Pairs(graph, torch.cat([tr[:, 0], tr[:, 0]]), dst, name="train-pairs")
        sent = _pair_bytes(ctx, a.out)
        opt.zero_grad()
        z = pairs(encoder(x, gnn.DropoutKey(a.seed, epoch)), decoder)
        y = torch.cat([torch.ones(len(tr)), torch.zeros(len(tr))])
        loss = F.binary_cross_entropy_with_logits(z, y, reduction="sum") / (2 * n_train)
        loss.backward()
        for p in params:        # the loss is a sum over ranks: summed gradients are the whole graph's
            comm.Allreduce(MPI.IN_PLACE, p.grad.numpy())
        opt.step()
        pair_bytes = _pair_bytes(ctx, a.out) - sent
        remote = dst[(dst < graph.owned_start) | (dst >= graph.owned_end)]
        bound = len(torch.unique(remote)) * a.out * 4
        pairs.free()
        encoder.eval()
        with torch.no_grad():
            scores = evaluation(encoder(x), decoder).numpy()
        auc, _ = ranking_metrics(wd, scores, label, group, 2)
        if auc[0] > best["val"]:
            best = dict(val=float(auc[0]), test=float(auc[1]), epoch=epoch)
    evaluation.free()
    ctx.free()
    # bytes of the last epoch: every rank's forward messages of the training pairs (backward returns as many)
    totals = comm.allreduce(np.array([pair_bytes, bound], dtype=np.int64))
    if comm.rank == 0:
        print(json.dumps(dict(best_epoch=best["epoch"], val_roc_auc=best["val"], test_roc_auc=best["test"],
                              pair_bytes=int(totals[0]), pair_bytes_bound=int(totals[1]))))


if __name__ == "__main__":
    main()
