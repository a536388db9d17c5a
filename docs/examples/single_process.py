"""The single-process reference of a model file: the same module, seed and split as ``g3-train --model-file``,
trained on the whole graph with plain PyTorch (a sparse matrix for ``Propagate``; no MPI, no partition).

    python docs/examples/single_process.py GRAPH.h5 docs/examples/resnet_gnn.py:build --hidden 64 --epochs 200

Before the model file is imported, ``g3mpi.nn``'s ``Propagate`` and ``Dropout`` (the primitives it covers) are
replaced by whole-graph versions with the same definitions (docs/MODELS.md); dropout keeps its masks keyed by (seed, epoch, site, node ID)
unless ``--torch-dropout`` (``torch.nn.functional.dropout``). Training follows g3-train: Adam, loss = mean cross
entropy over the training nodes, evaluation every epoch, the best validation accuracy's epoch (the first of
equals) reported. Prints one JSON line: best_epoch, train_acc, val_acc, test_acc.
"""
from __future__ import annotations

import argparse
import json
import math
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from g3mpi import nn as gnn
from g3mpi.format import load_graph
from g3mpi.ops.dropout import DropoutKey, node_dropout
from g3mpi.ops.graph import propagate_kind


class WholeGraph:
    """The graph handle of one process: every node owned, none in a halo."""

    def __init__(self, g):
        n = g.num_nodes
        dst = np.repeat(np.arange(n), np.diff(g.indptr))
        src = np.asarray(g.indices, np.int64)
        keep = src != dst                  # (the file's self loops are left out, as propagate does)
        self.src, self.dst = torch.from_numpy(src[keep]), torch.from_numpy(dst[keep])
        self.num_owned = self.num_nodes = n
        self.owned_ids = self.orig_ids = torch.arange(n)
        self.in_degree = torch.bincount(self.dst, minlength=n)
        self.out_degree = torch.bincount(self.src, minlength=n)
        self.sites = 0
        self.torch_dropout = False

    def new_site(self) -> int:
        self.sites += 1
        return self.sites - 1

    def matrix(self, kind: str) -> torch.Tensor:
        """The sparse [n, n] matrix of a propagate kind (ops.graph.propagate_kind)."""
        n, loops = self.num_nodes, kind.endswith("+loops") or kind == "gcn"
        deg = self.in_degree.double() + float(loops)
        if kind.startswith("gcn"):
            dinv = torch.where(deg > 0, deg.clamp(min=1) ** -0.5, torch.zeros_like(deg))
            w, diag = dinv[self.dst] * dinv[self.src], dinv * dinv
        elif kind.startswith("avg"):
            inv = 1.0 / deg.clamp(min=1)
            w, diag = inv[self.dst], inv
        else:
            w, diag = torch.ones(len(self.dst), dtype=torch.float64), torch.ones(n, dtype=torch.float64)
        rows, cols = self.dst, self.src
        if loops:
            rows, cols, w = torch.cat([rows, torch.arange(n)]), torch.cat([cols, torch.arange(n)]), torch.cat([w, diag])
        return torch.sparse_coo_tensor(torch.stack([rows, cols]), w.float(), (n, n)).coalesce().to_sparse_csr()


class Propagate(nn.Module):
    def __init__(self, graph, reduce="sum", self_loops=None, name=""):
        super().__init__()
        self.a = graph.matrix(propagate_kind(reduce, reduce == "gcn" if self_loops is None else self_loops))

    def forward(self, x):
        n = x.shape[0]
        return (self.a @ x.reshape(n, -1)).view(x.shape)


class Dropout(nn.Module):
    def __init__(self, graph, p=0.5):
        super().__init__()
        self.graph, self.p = graph, p
        self.site = gnn.primitives.SITE_BASE + graph.new_site()

    def forward(self, x, key=None):
        if not self.training or self.p <= 0 or key is None:
            return x
        if self.graph.torch_dropout:
            return F.dropout(x, self.p, True)
        n = x.shape[0]
        return node_dropout(x.reshape(n, -1), key, self.site, self.graph.orig_ids, self.p, True).view(x.shape)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("graph")
    ap.add_argument("model_file", metavar="PATH.py:FUNCTION")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dropout", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch-dropout", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    gnn.Propagate, gnn.Dropout = Propagate, Dropout    # before the model file is imported and built
    from g3mpi.train.userfile import build_user_model
    g = load_graph(a.graph)
    graph = WholeGraph(g)
    graph.torch_dropout = a.torch_dropout
    cfg = SimpleNamespace(**{k: v for k, v in vars(a).items() if k not in ("graph", "model_file")})
    torch.manual_seed(a.seed)
    model = build_user_model(a.model_file, graph, g.features.shape[1], int(g.attrs["num_classes"]), cfg)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    x, y = torch.from_numpy(g.features), torch.from_numpy(g.labels)
    masks = {s: torch.from_numpy(m) for s, m in (("train", g.train_mask), ("val", g.val_mask), ("test", g.test_mask))}
    best = dict(val_acc=-math.inf)
    for epoch in range(1, a.epochs + 1):
        model.train()
        opt.zero_grad()
        m = masks["train"]
        loss = F.cross_entropy(model(x, DropoutKey(a.seed, epoch))[m], y[m])
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            pred = model(x).argmax(1)
        accs = {f"{s}_acc": float((pred[m] == y[m]).float().mean()) for s, m in masks.items()}
        if accs["val_acc"] > best["val_acc"]:
            best = dict(best_epoch=epoch, **accs)
    print(json.dumps(best))
    return best


if __name__ == "__main__":
    main()
