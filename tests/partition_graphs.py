"""Small in-memory graphs for the partitioner and inspector tests (Cora from cora.npz, random directed graphs)."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from g3mpi.format import Graph, write_graph


def graph_from_edges(src, dst, features, labels, masks, source: str, symmetric: bool = False) -> Graph:
    n = len(labels)
    a = sp.csr_matrix((np.ones(len(src), dtype=np.int8), (np.asarray(dst), np.asarray(src))), shape=(n, n))
    a.sum_duplicates()
    a.sort_indices()
    attrs = dict(num_nodes=n, num_edges=int(a.nnz), feature_dim=features.shape[1], num_classes=int(labels.max()) + 1,
                 symmetric=symmetric, self_loops="keep", source=source)
    return Graph(indptr=a.indptr.astype(np.int64), indices=a.indices.astype(np.int32),
                 features=np.ascontiguousarray(features, dtype=np.float32), labels=np.asarray(labels, dtype=np.int64),
                 train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], attrs=attrs)


def cora_graph(npz_path) -> Graph:
    z = np.load(npz_path)
    ei = z["edge_index"]
    return graph_from_edges(ei[0], ei[1], z["x"], z["y"], (z["train_mask"], z["val_mask"], z["test_mask"]),
                            source=f"npz:{npz_path}", symmetric=True)


def random_graph(n: int = 300, m: int = 1500, feature_dim: int = 5, classes: int = 3, seed: int = 0,
                 self_loops: int = 10, isolated: int = 5) -> Graph:
    """A random directed graph with duplicate-free edges, a few self loops and a few isolated nodes."""
    rng = np.random.default_rng(seed)
    live = n - isolated
    src = rng.integers(0, live, m)
    dst = (src + rng.zipf(1.6, m)) % live  # some locality, heavy-tailed offsets
    loops = rng.integers(0, live, self_loops)
    src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
    labels = rng.integers(-1, classes, n)
    labels[0] = classes - 1
    split = rng.integers(0, 3, n)
    lab = labels >= 0
    masks = tuple((split == i) & lab for i in range(3))
    x = rng.standard_normal((n, feature_dim)).astype(np.float32)
    return graph_from_edges(src, dst, x, labels, masks, source=f"random:n={n},m={m},seed={seed}")


def write(g: Graph, path) -> None:
    write_graph(path, g)
