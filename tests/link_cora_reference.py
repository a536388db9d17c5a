"""The single-process PyG run that docs/examples/link_prediction.py is compared with: the same split (the graph's
``link_*`` datasets), negatives (``g3mpi.ops.negatives``, keyed by position), model (GCNConv x 2 and the dot
decoder), optimiser and epochs on the whole graph; its own seeded initialisation (PyG's).

python -m tests.link_cora_reference GRAPH.h5 [--epochs 200] -> one JSON line: best_epoch, val_roc_auc, test_roc_auc
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from g3mpi.format import load_graph
from g3mpi.ops.negatives import negative_destinations
from tests.pyg_reference import PyGStack, edge_index_of

EVAL_EPOCH = {"val": -1, "test": -2}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    g = load_graph(a.graph)
    n = g.num_nodes
    torch.manual_seed(a.seed)
    enc = PyGStack("gcn", g.features.shape[1], a.hidden, a.out, 2)
    opt = torch.optim.Adam(enc.parameters(), lr=a.lr)
    x, ei = torch.from_numpy(g.features), edge_index_of(g.indptr, g.indices)
    tr = torch.from_numpy(g.links["link_train_edge"])
    ev = {}
    for s in ("val", "test"):
        e = torch.from_numpy(g.links[f"link_{s}_edge"])
        neg = torch.from_numpy(negative_destinations(a.seed, EVAL_EPOCH[s], np.arange(len(e)), 1, n)[:, 0])
        ev[s] = (torch.cat([e[:, 0], e[:, 0]]), torch.cat([e[:, 1], neg]), np.r_[np.ones(len(e)), np.zeros(len(e))])
    best = dict(val=-1.0, test=float("nan"), epoch=0)
    for epoch in range(1, a.epochs + 1):
        enc.train()
        opt.zero_grad()
        h = enc(x, ei)
        neg = torch.from_numpy(negative_destinations(a.seed, epoch, np.arange(len(tr)), 1, n)[:, 0])
        src, dst = torch.cat([tr[:, 0], tr[:, 0]]), torch.cat([tr[:, 1], neg])
        z = (h[src] * h[dst]).sum(-1)
        loss = F.binary_cross_entropy_with_logits(z, torch.cat([torch.ones(len(tr)), torch.zeros(len(tr))]))
        loss.backward()
        opt.step()
        enc.eval()
        with torch.no_grad():
            h = enc(x, ei)
            auc = {s: roc_auc_score(y, (h[s_] * h[d_]).sum(-1).numpy()) for s, (s_, d_, y) in ev.items()}
        if auc["val"] > best["val"]:
            best = dict(val=float(auc["val"]), test=float(auc["test"]), epoch=epoch)
    print(json.dumps(dict(best_epoch=best["epoch"], val_roc_auc=best["val"], test_roc_auc=best["test"])))


if __name__ == "__main__":
    main(sys.argv[1:])
