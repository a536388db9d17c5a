"""Suite ``vs-pyg``: one rank of g3mpi against PyTorch Geometric, side by side in one process.

For each model (GCN, SAGE, GAT) three systems train the same model from the same initial parameters with the
same thread count on the same random graph (:func:`random_graph`: uniform endpoints, duplicates and self
loops removed): g3mpi on one rank, PyG with the ``edge_index`` input and PyG with a CSR ``adj_t``
(``torch.sparse_csr_tensor``). Epochs (forward, loss, backward, Adam step) alternate system by system, so
every system sees the same machine load; the first epoch is a warm-up. Reported: median epoch time per system,
the ratios g3mpi / PyG-CSR and g3mpi / PyG-edge_index, and the relative difference of the first epoch's logits
(the systems compute the same function). ``g3mpi-nocache`` is g3mpi with its input cache off
(``GNN(input_cache=False)``): the first layer's aggregation of the constant input, which g3mpi computes once
when there is no input dropout (as here), is then recomputed every epoch, as PyG does (GCN and SAGE only).
``g3mpi-bf16`` is g3mpi under ``--precision bf16-mixed`` (``g3mpi.ops.precision.autocast``, logits cast to float32
before the loss, as the trainer does), against PyG in float32.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from g3mpi.format.features import widen
from g3mpi.nn import specs

from .common import SYSTEMS, Sizes, check_systems, median, progress, ratio


def random_graph(n: int, e: int, f: int, c: int, seed: int = 0):
    """A random directed graph of ``n`` nodes: ``e`` uniform (source, destination) pairs, duplicates and self
    loops removed; standard normal features of width ``f``, uniform labels of ``c`` classes, half the nodes in
    training, a quarter each in validation and test."""
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


def epoch(net, x, y, train, opt, *args, precision: str = "fp32"):
    """One training epoch (forward, loss over the training rows, backward, optimiser step); returns (seconds,
    detached logits). ``precision``: the forward's (``g3mpi.ops.precision.autocast``)."""
    from g3mpi.ops.precision import autocast
    t0 = time.perf_counter()
    net.train()
    opt.zero_grad()
    with autocast(precision):
        out = net(x, *args)
    out = out.float()
    loss = F.cross_entropy(out[train], y[train])
    loss.backward()
    opt.step()
    return time.perf_counter() - t0, out.detach()


class PyGNet(torch.nn.Module):
    """PyG's GCNConv / SAGEConv / GATConv stack with the state_dict keys of g3mpi's GNN."""

    def __init__(self, model, dims, heads):
        super().__init__()
        import torch_geometric.nn as pyg_nn
        sp = specs.spec(model)
        Conv = getattr(pyg_nn, sp.pyg)     # (the registry's counterpart: GCNConv, SAGEConv, GATConv)
        convs = []
        d = dims[0]
        for i, o in enumerate(dims[1:]):
            last = i == len(dims) - 2
            if sp.attention:
                h = 1 if last else heads
                ch = o if last else o // heads
                convs.append(Conv(d, ch, heads=h, concat=not last))
                o = ch * h if not last else ch
            else:   # (GCNConv caches its normalisation, as g3mpi's blocks are built once)
                convs.append(Conv(d, o, **({"cached": True} if sp.aggregation == "gcn" else {})))
            d = o
        self.convs = torch.nn.ModuleList(convs)

    def forward(self, x, adj):
        for i, conv in enumerate(self.convs):
            x = conv(x, adj)
            if i < len(self.convs) - 1:
                x = F.relu(x)
        return x


def g3_net(g, model, dims, heads, input_cache=True):
    """g3mpi's GNN on one rank (its own communicator), seeded with 0; returns (net, orig_ids order, graph).
    The caller frees ``graph.ctx`` (its exchanges and communicator) when done with the net."""
    from mpi4py import MPI

    from data_tools.build import build_parts
    from g3mpi.comm import CommContext
    from g3mpi.nn import GNN
    from g3mpi.ops import DistGraph
    part = next(build_parts(g, np.zeros(g.num_nodes, np.int64), 1, "bench"))[0]
    ctx = CommContext(MPI.COMM_SELF)
    try:
        graph = DistGraph(part, ctx)
        torch.manual_seed(0)
        hidden = dims[1] // heads if specs.spec(model).attention else dims[1]
        net = GNN(graph, model, dims[0], hidden, dims[-1], layers=len(dims) - 1, heads=heads,
                  input_cache=input_cache)
    except BaseException:
        ctx.free()
        raise
    return net, torch.from_numpy(part.orig_ids), graph


def run(sz: Sizes, models=("gcn", "sage", "gat"), seed: int = 0, gat_epochs: int | None = None,
        systems=SYSTEMS) -> dict:
    """``systems``: g3mpi and the PyG variants to compare (PyG with ``edge_index`` materialises one message per
    edge and feature: at 200k nodes / 4M edges x 128 it needs several GiB, so it can be left out)."""
    systems = check_systems(systems)
    torch.set_num_threads(sz.threads)
    dims = list(sz.dims)
    g = random_graph(sz.nodes, sz.edges, dims[0], dims[-1], seed)
    data = _tensors(g)
    res = dict(graph=dict(nodes=g.num_nodes, edges=g.num_edges, generator="uniform random (pyg.random_graph)"),
               models={})
    for model in models:
        att = specs.spec(model).attention      # (no input cache to turn off; slower epochs)
        these = tuple(s for s in systems if not (att and s == "g3mpi-nocache"))
        n_ep = sz.epochs if not att or gat_epochs is None else gat_epochs
        progress(f"vs-pyg: {model}, {n_ep} epochs per system")
        res["models"][model] = r = _compare(g, data, model, dims, sz.heads, these, n_ep)
        progress(f"vs-pyg: {model}: " + ", ".join(f"{s} {r['median_epoch_s'][s]:.3f}s" for s in these) +
                 f", ratio vs csr {r['ratio_vs_pyg_csr']:.3f}")
    return res


def _tensors(g) -> dict:
    """The graph's features, labels, training mask, ``edge_index`` and CSR ``adj_t`` as PyG takes them."""
    from torch_geometric.utils import to_torch_csr_tensor
    dst = torch.from_numpy(np.repeat(np.arange(g.num_nodes), np.diff(g.indptr)))
    src = torch.from_numpy(g.indices.astype(np.int64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adj_t = to_torch_csr_tensor(torch.stack([dst, src]), size=(g.num_nodes, g.num_nodes))
    return dict(x=torch.from_numpy(widen(g.features, g.feature_dtype)), y=torch.from_numpy(g.labels), train=torch.from_numpy(g.train_mask),
                edge_index=torch.stack([src, dst]), adj_t=adj_t)


def _compare(g, data: dict, model: str, dims, heads: int, systems: tuple, n_ep: int) -> dict:
    """The systems training ``model`` from the same initial parameters, epoch by epoch in turn after a warm-up
    epoch: their epoch times, medians, ratios and the first epoch's logits' differences from PyG-CSR's."""
    graphs = []   # each g3mpi net's graph: its exchanges and communicator are freed after the model
    try:
        ours, order, graph = g3_net(g, model, dims, heads)
        graphs.append(graph)
        nets = {"g3mpi": ours}
        for s in systems[1:]:
            if s in ("g3mpi-nocache", "g3mpi-bf16"):
                nets[s], _, gr = g3_net(g, model, dims, heads, input_cache=s != "g3mpi-nocache")
                graphs.append(gr)
            else:
                nets[s] = PyGNet(model, dims, heads)
            nets[s].load_state_dict(ours.state_dict())
        x, y, train = data["x"], data["y"], data["train"]
        mine = (x[order], y[order], train[order], ())
        inputs = {"g3mpi": mine, "g3mpi-nocache": mine, "g3mpi-bf16": mine, "pyg-csr": (x, y, train, (data["adj_t"],)),
                  "pyg-edge_index": (x, y, train, (data["edge_index"],))}
        opts = {s: torch.optim.Adam(nets[s].parameters(), lr=0.01) for s in systems}
        times = {s: [] for s in systems}
        diff = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for ep in range(n_ep + 1):
                outs = {}
                for s in systems:
                    xs, ys, ts, extra = inputs[s]
                    dt, outs[s] = epoch(nets[s], xs, ys, ts, opts[s], *extra,
                                        precision="bf16-mixed" if s == "g3mpi-bf16" else "fp32")
                    if ep > 0:
                        times[s].append(dt)
                if ep == 0:
                    ref = outs["pyg-csr"][order]
                    diff = {s: float((outs[s] - ref).norm() / ref.norm()) if s.startswith("g3mpi") else
                            float((outs[s][order] - ref).norm() / ref.norm()) for s in systems if s != "pyg-csr"}
        med = {s: median(times[s]) for s in systems}
        return dict(epochs=n_ep, epoch_times_s=times, median_epoch_s=med,
                    ratio_vs_pyg_csr=ratio(med["g3mpi"], med["pyg-csr"]),
                    ratio_vs_pyg_edge_index=ratio(med["g3mpi"], med.get("pyg-edge_index")),
                    ratio_nocache_vs_pyg_csr=ratio(med.get("g3mpi-nocache"), med["pyg-csr"]),
                    ratio_bf16_vs_pyg_csr=ratio(med.get("g3mpi-bf16"), med["pyg-csr"]),
                    first_epoch_logits_rel_diff=diff)
    finally:
        for gr in graphs:
            gr.ctx.free()
