"""One rank of g3mpi against PyTorch Geometric with CSR input (``adj_t``), side by side in one process.

    python -m g3mpi.bench.vs_pyg [--nodes 200000] [--edges 4000000] [--dims 128,256,40] [--models gcn,sage]
        [--epochs 7] [--threads 1] [--dropout 0]

A random directed graph (uniform endpoints, duplicates and self loops removed), random features and labels,
half the nodes in training. Each epoch is forward, loss, backward and an Adam step; the two implementations
alternate epoch by epoch, from the same initial parameters, with the same thread count. Prints the median epoch
times and their ratio (g3mpi / PyG) per model, and the largest relative difference of the first epoch's logits.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F


def random_graph(n: int, e: int, f: int, c: int, seed: int = 0):
    from g3mpi.format import Graph
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e, dtype=np.int64)
    dst = rng.integers(0, n, e, dtype=np.int64)
    key = np.unique(dst * n + src)
    dst, src = key // n, key % n
    keep = src != dst
    src, dst = src[keep], dst[keep]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    x = rng.standard_normal((n, f), dtype=np.float32)
    y = rng.integers(0, c, n)
    m = rng.random(n)
    return Graph(indptr, src.astype(np.int32), x, y, m < 0.5, (m >= 0.5) & (m < 0.75), m >= 0.75,
                 dict(num_classes=c, source=f"random:n={n},e={e}"))


def g3_model(g, model, dims, dropout):
    from mpi4py import MPI

    from data_tools.build import build_parts
    from g3mpi.comm import CommContext
    from g3mpi.nn import GNN
    from g3mpi.ops import DistGraph
    part = next(build_parts(g, np.zeros(g.num_nodes, np.int64), 1, "bench"))[0]
    graph = DistGraph(part, CommContext(MPI.COMM_WORLD))
    torch.manual_seed(0)
    net = GNN(graph, model, dims[0], dims[1], dims[-1], layers=len(dims) - 1, dropout=dropout)
    order = torch.from_numpy(part.orig_ids)
    return net, order


class PyGNet(torch.nn.Module):
    def __init__(self, model, dims, dropout):
        super().__init__()
        from torch_geometric.nn import GCNConv, SAGEConv
        self.convs = torch.nn.ModuleList(
            [GCNConv(a, b, cached=True) if model == "gcn" else SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:])])
        self.dropout = dropout

    def forward(self, x, adj_t):
        for i, conv in enumerate(self.convs):
            x = F.dropout(x, self.dropout, self.training)
            x = conv(x, adj_t)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def epoch(net, x, y, train, opt, *args):
    t0 = time.perf_counter()
    net.train()
    opt.zero_grad()
    out = net(x, *args)
    loss = F.cross_entropy(out[train], y[train])
    loss.backward()
    opt.step()
    return time.perf_counter() - t0, out.detach()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="g3mpi.bench.vs_pyg", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=4_000_000)
    ap.add_argument("--dims", default="128,256,40")
    ap.add_argument("--models", default="gcn,sage")
    ap.add_argument("--epochs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--verbose", action="store_true", help="print every epoch time")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    dims = [int(d) for d in a.dims.split(",")]
    from torch_geometric.utils import to_torch_csr_tensor
    g = random_graph(a.nodes, a.edges, dims[0], dims[-1])
    x = torch.from_numpy(g.features)
    y = torch.from_numpy(g.labels)
    train = torch.from_numpy(g.train_mask)
    dst = np.repeat(np.arange(g.num_nodes), np.diff(g.indptr))
    adj_t = to_torch_csr_tensor(torch.from_numpy(np.stack([dst, g.indices.astype(np.int64)])),
                                size=(g.num_nodes, g.num_nodes))
    print(f"graph: {g.num_nodes} nodes, {g.num_edges} edges; dims {dims}; threads {a.threads}; "
          f"dropout {a.dropout}; {a.epochs} epochs each (first one excluded)")
    for model in a.models.split(","):
        ours, order = g3_model(g, model, dims, a.dropout)
        ref = PyGNet(model, dims, a.dropout)
        ref.load_state_dict(ours.state_dict())
        xo, yo, to = x[order], y[order], train[order]
        opt_o = torch.optim.Adam(ours.parameters(), lr=0.01)
        opt_r = torch.optim.Adam(ref.parameters(), lr=0.01)
        t_o, t_r = [], []
        for ep in range(a.epochs):
            dt_o, out_o = epoch(ours, xo, yo, to, opt_o)
            dt_r, out_r = epoch(ref, x, y, train, opt_r, adj_t)
            if ep == 0:
                diff = float((out_o - out_r[order]).norm() / out_r.norm())
            else:
                t_o.append(dt_o)
                t_r.append(dt_r)
        if a.verbose:
            print("  g3mpi", " ".join(f"{t:.3f}" for t in t_o), "\n  pyg  ", " ".join(f"{t:.3f}" for t in t_r))
        mo, mr = statistics.median(t_o), statistics.median(t_r)
        print(f"{model}: g3mpi {mo:.3f}s  pyg {mr:.3f}s  ratio {mo / mr:.3f}  (first-epoch logits rel diff {diff:.1e})",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
