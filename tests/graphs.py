"""Small in-memory graphs and partitions for the runtime tests (built with data_tools.build.write_partition)."""
from __future__ import annotations

import numpy as np

from data_tools.build import write_partition
from g3mpi.format import Graph


def csr_from_edges(src, dst, n):
    order = np.lexsort((src, dst))
    src, dst = np.asarray(src)[order], np.asarray(dst)[order]
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src.astype(np.int32)


def random_graph(n=150, deg=4, f=6, c=3, seed=0, directed_extra=40, multi: bool = False) -> Graph:
    """Random symmetric graph plus some one-way edges, a few isolated nodes, splits over labelled nodes.
    ``multi``: also duplicate edges and self loops (some doubled), as g3-prepare keeps them by default."""
    rng = np.random.default_rng(seed)
    e = n * deg // 2
    s, d = rng.integers(0, n - 5, e), rng.integers(0, n - 5, e)   # the last 5 nodes stay isolated
    s2, d2 = rng.integers(0, n - 5, directed_extra), rng.integers(0, n - 5, directed_extra)
    a = np.unique(np.stack([np.concatenate([s, d, s2]), np.concatenate([d, s, d2])], 1), axis=0)
    a = a[a[:, 0] != a[:, 1]]
    if multi:
        loops = np.repeat(rng.integers(0, n - 5, 12), rng.integers(1, 3, 12))[:, None].repeat(2, 1)
        a = np.concatenate([a, a[rng.integers(0, len(a), len(a) // 8)], loops])
    indptr, indices = csr_from_edges(a[:, 0], a[:, 1], n)
    x = rng.standard_normal((n, f)).astype(np.float32)
    y = rng.integers(0, c, n)
    y[rng.random(n) < 0.05] = -1
    m = rng.random(n)
    lab = y >= 0
    return Graph(indptr, indices, x, y, lab & (m < 0.5), lab & (m >= 0.5) & (m < 0.7), lab & (m >= 0.7),
                 dict(num_classes=c, source=f"random:n={n},seed={seed}"))


def cora_graph(path) -> Graph:
    """Cora from the shared npz, features row-normalised (as in the GCN paper)."""
    d = np.load(path)
    n = d["x"].shape[0]
    indptr, indices = csr_from_edges(d["edge_index"][0], d["edge_index"][1], n)
    x = d["x"] / np.maximum(d["x"].sum(1, keepdims=True), 1e-12)
    return Graph(indptr, indices, x.astype(np.float32), d["y"].astype(np.int64), d["train_mask"], d["val_mask"],
                 d["test_mask"], dict(num_classes=int(d["y"].max()) + 1, source="npz:cora"))


def partition(g: Graph, P: int, out, seed: int = 0) -> None:
    """A random node->part assignment (every part non-empty), written as a partition directory."""
    rng = np.random.default_rng(seed + 1000 * P)
    asg = rng.integers(0, P, g.num_nodes)
    asg[:P] = np.arange(P)
    write_partition(g, asg, P, out, method="random", seed=seed, force=True)


def typed_graph(n=150, R=4, seed=0, c=4) -> Graph:
    """:func:`random_graph` with duplicates and self loops, each edge of a random relation in [0, R - 1) (the
    last relation has no edge; relation R - 2 only a few), rows sorted by source then relation as the format
    keeps them; ``c`` classes."""
    g = random_graph(n=n, seed=seed, multi=True, c=c)
    rng = np.random.default_rng(seed + 7)
    typ = rng.integers(0, R - 2, g.num_edges)
    typ[rng.random(g.num_edges) < 0.05] = R - 2
    dst = np.repeat(np.arange(n), np.diff(g.indptr))
    order = np.lexsort((typ, g.indices, dst))
    g.indices, g.edge_type = g.indices[order], typ[order].astype(np.int32)
    g.attrs["num_relations"] = R
    return g
