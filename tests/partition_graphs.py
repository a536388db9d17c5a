"""Small in-memory graphs for the partitioner and inspector tests (Cora from cora.npz, random directed graphs), and
g3-partition run on them: the command, the input reassembled from the parts, the one-line error."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from data_tools.partition import main as partition_main
from data_tools.partitioners.metis import strip_self_loops
from g3mpi.format import Graph, read_meta, read_node_map, read_part, write_graph
from tests.conftest import run_module


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


def partition(graph_path, out, parts, method, balance=None, seed=0, *extra, check=True, inproc=False, cwd=None,
              **kw):
    """Run g3-partition as a command (default; ``kw`` for subprocess.run), or in this process (``inproc``: same
    code, no interpreter start)."""
    args = [graph_path, "--parts", parts, "--method", method, "--out", out, "--seed", seed, "--no-progress", *extra]
    if balance:
        args += ["--balance", balance]
    if inproc:
        assert partition_main([str(x) for x in args]) == 0
        return None
    return run_module("data_tools.partition", *args, check=check, cwd=cwd, **kw)


def reassemble(parts_dir):
    """Edges (as a sorted (src, dst) list), features, labels and masks by ORIGINAL node ID, from the parts alone."""
    meta = read_meta(parts_dir)
    n, P = meta["num_nodes"], meta["num_parts"]
    new_to_orig = read_node_map(parts_dir, meta)
    feats = np.full((n, meta["feature_dim"]), np.nan, dtype=np.float32)
    labels = np.full(n, -2, dtype=np.int64)
    masks = {k: np.zeros(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
    owned_count = np.zeros(n, dtype=np.int64)
    src, dst = [], []
    for p in range(P):
        part = read_part(parts_dir, p, meta)
        orig = part.orig_ids
        owned_count[orig] += 1
        feats[orig] = part.features
        labels[orig] = part.labels
        for k in masks:
            masks[k][orig] = getattr(part, k)
        gid = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])
        rows = np.repeat(np.arange(part.num_owned), np.diff(part.indptr))
        src.append(new_to_orig[gid[part.indices]])
        dst.append(orig[rows])
    assert np.all(owned_count == 1), "every node must be owned exactly once"
    src, dst = np.concatenate(src), np.concatenate(dst)
    order = np.lexsort((src, dst))
    return src[order], dst[order], feats, labels, masks


def expected_edges(g):
    indptr, indices, _ = strip_self_loops(g.indptr, g.indices.astype(np.int64))
    dst = np.repeat(np.arange(g.num_nodes), np.diff(indptr))
    order = np.lexsort((indices, dst))
    return indices[order], dst[order]


def assert_fails(p, path_fragment, what):
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.strip().splitlines() if ln]
    assert lines and lines[-1].startswith("g3-partition: error:"), p.stderr
    assert path_fragment in lines[-1] and what in lines[-1], lines[-1]
    assert "Traceback" not in p.stderr


def assignment_of(parts_dir) -> np.ndarray:
    """Every node's part, from a partition directory's offsets and node map."""
    meta = read_meta(parts_dir)
    new_to_orig = read_node_map(parts_dir, meta)
    a = np.empty(meta["num_nodes"], dtype=np.int64)
    a[new_to_orig] = np.repeat(np.arange(meta["num_parts"]), np.diff(meta["offsets"]))
    return a


def assert_as_serial_writer(graph_path, out, ref) -> None:
    """The partition at ``out`` holds the files that the one-process writer writes at ``ref`` for its assignment:
    the same offsets, statistics, node map and every array of every part, dtypes included."""
    from data_tools.build import write_partition
    from g3mpi.format import load_graph
    from g3mpi.format.partition import ARRAYS, SCALARS

    meta = read_meta(out)
    P = meta["num_parts"]
    ref_meta = write_partition(load_graph(graph_path), assignment_of(out), P, ref, method=meta["method"], seed=0)
    assert ref_meta["offsets"] == meta["offsets"] and ref_meta["quality"] == meta["quality"]
    assert ref_meta["parts"] == meta["parts"]
    assert np.array_equal(read_node_map(ref), read_node_map(out))
    for q in range(P):
        a, b = read_part(out, q), read_part(ref, q)
        for k in ARRAYS:
            x, y = getattr(a, k), getattr(b, k)
            assert x.dtype == y.dtype and np.array_equal(x, y), (q, k)
        for k in SCALARS:
            assert k == "partition_id" or getattr(a, k) == getattr(b, k), (q, k)
