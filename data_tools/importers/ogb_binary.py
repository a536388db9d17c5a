"""``ogb`` importer, binary layout: the OGB node-property dataset as ogbn-papers100M ships it.

```
DATASET/raw/data.npz         edge_index int [2, E] (row 0 the source, row 1 the target of each edge),
                             node_feat float [N, F] (optional: F = 0), num_nodes_list [1], num_edges_list [1]
DATASET/raw/node-label.npz   node_label float [N] or [N, 1]: a class per node, NaN = unlabelled
DATASET/split/<scheme>/{train,valid,test}.csv.gz   one node index per line (as the CSV layout)
```

(``ogb/io/read_graph_raw.py``'s ``read_binary_graph_raw``.) Nothing large is held whole: edges and features are
read from the archive block by block (:class:`npzmember.NpyMember`: a stored member at its offset, a deflated one
decompressed in blocks), once to check every node ID before any kernel sees one and again for each pass of the
CSR build; features row block by row block as graph.h5 is written. Only the labels ([N]) are read whole.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError, index_dtype
from g3mpi.format.features import natural_dtype
from g3mpi.format.limits import check_finite_features

from .common import (EDGE_CHUNK, FEATURE_BLOCK_BYTES, EdgeStream, RawGraph, check_labels, check_masks,
                     progress)
from .npzmember import NpyMember, open_archive
from .ogb import label_values, read_split


def load_ogb_binary(root: Path, split: str | None = None, num_classes: int | None = None,
                    quiet: bool = False) -> RawGraph:
    raw_dir = root / "raw"
    data_f, label_f = raw_dir / "data.npz", raw_dir / "node-label.npz"
    with open_archive(data_f, "a graph (OGB binary layout)") as zf:
        ei = NpyMember(data_f, "edge_index", zf)
        n = _count(NpyMember(data_f, "num_nodes_list", zf), "node")
        has_e = "num_edges_list.npy" in zf.namelist()
        num_edges = _count(NpyMember(data_f, "num_edges_list", zf), "edge") if has_e else None
        feat = NpyMember(data_f, "node_feat", zf) if "node_feat.npy" in zf.namelist() else None
    if len(ei.shape) != 2 or ei.shape[0] != 2:
        raise FormatError(data_f, f"edge_index must have shape [2, E], got {list(ei.shape)}")
    if ei.dtype.kind not in "iu":
        raise FormatError(data_f, f"edge_index must be integers, got dtype {ei.dtype}")
    if num_edges is not None and ei.shape[1] != num_edges:
        raise FormatError(data_f, f"edge_index has {ei.shape[1]} edges but num_edges_list says {num_edges}")
    dim = 0
    if feat is not None:
        if len(feat.shape) != 2 or feat.shape[0] != n:
            raise FormatError(data_f, f"node_feat must have shape [{n}, F] (num_nodes_list: {n} nodes), got "
                                      f"{list(feat.shape)}")
        if feat.dtype.kind not in "iuf":
            raise FormatError(data_f, f"node_feat must be real numbers, got dtype {feat.dtype}")
        if feat.fortran and feat.shape[1] > 1:
            raise FormatError(data_f, "node_feat is stored in Fortran (column) order: rows cannot be read in "
                                      "blocks; save it C-contiguous (np.ascontiguousarray)")
        dim = feat.shape[1]
    labels = _read_labels(label_f, n, num_classes)
    c = check_labels(label_f, labels, n, num_classes)
    edges = _edge_stream(ei, n, quiet)
    masks, scheme = read_split(root, split, n)
    if masks is not None:
        masks = check_masks(root / "split" / scheme, masks, labels)
    blocks = _feature_blocks(feat, n, dim, quiet) if dim else None
    return RawGraph(path=str(root), num_nodes=n, src=None, dst=None, edges=edges, feature_dim=dim,
                    features=None if blocks else np.zeros((n, 0), np.float32), feature_blocks=blocks, labels=labels,
                    num_classes=c, masks=masks, feature_dtype=natural_dtype(feat.dtype) if dim else "float32",
                    source=f"ogb:{root.name}" + (f",split={scheme}" if scheme else ""))


def _count(m: NpyMember, what: str) -> int:
    """The one non-negative integer of num_nodes_list / num_edges_list (a single graph)."""
    a = m.read().reshape(-1)
    if m.dtype.kind not in "iu" or len(a) != 1 or a[0] < 0:
        raise FormatError(m.path, f"{m.key}: expected one graph's {what} count, found {a.tolist()[:3]}")
    return int(a[0])


def _read_labels(label_f: Path, n: int, num_classes: int | None) -> np.ndarray:
    with open_archive(label_f, "node labels (OGB binary layout)") as zf:
        m = NpyMember(label_f, "node_label", zf)
    if len(m.shape) == 2 and m.shape[1] != 1:
        raise FormatError(label_f, f"{m.shape[1]} label columns: multi-label datasets are not supported")
    if len(m.shape) not in (1, 2) or m.dtype.kind not in "iuf":
        raise FormatError(label_f, f"node_label must be numbers [N] or [N, 1], got {m.dtype} {list(m.shape)}")
    y = m.read().reshape(-1).astype(np.float64)
    return label_values(label_f, y, n, num_classes, lambda i: f"node_label entry {i}", "entries")[0]


def _edge_stream(ei: NpyMember, n: int, quiet: bool) -> EdgeStream:
    """The edges of ``edge_index`` as (src, dst) blocks, read from the archive at each pass; FormatError for the
    first node ID outside [0, n), found by a first pass before any kernel sees an edge."""
    e = ei.shape[1]
    idt = index_dtype(n)

    def raw_blocks():
        if ei.fortran:                       # [2, E] in column order: (source, target) pairs
            for pairs in ei.chunks(0, 2 * e, 2 * EDGE_CHUNK):
                pairs = pairs.reshape(-1, 2)
                yield pairs[:, 0], pairs[:, 1]
            return
        yield from zip(ei.chunks(0, e, EDGE_CHUNK), ei.chunks(e, 2 * e, EDGE_CHUNK))

    bar = progress(total=e, desc="check edges", unit="edges", disable=True if quiet else None)
    w = 0
    for s, d in raw_blocks():
        for row, a in (("source", s), ("target", d)):
            bad = (a < 0) | (a >= n)
            if bad.any():
                k = int(np.argmax(bad))
                raise FormatError(ei.path, f"edge_index column {w + k}: {row} node ID {int(a[k])} out of range "
                                           f"[0, {n})")
        w += len(s)
        bar.update(len(s))
    bar.close()

    def blocks():
        for s, d in raw_blocks():
            yield s.astype(idt), d.astype(idt)
    return EdgeStream(e, blocks, np.dtype(idt))


def _feature_blocks(feat: NpyMember, n: int, dim: int, quiet: bool):
    """Row blocks (start, [rows, dim] as stored) of ``node_feat``, read as graph.h5 is written; FormatError naming
    the first row that is not finite."""
    rows = max(1, FEATURE_BLOCK_BYTES // max(1, feat.dtype.itemsize * dim))

    def blocks():
        bar = progress(total=n, desc="read node_feat", unit="rows", disable=True if quiet else None)
        w = 0
        for flat in feat.chunks(0, n * dim, rows * dim):
            a = flat.reshape(-1, dim)
            check_finite_features(feat.path, a, w, rows=lambda r: f"node_feat row {r}")
            yield w, a                       # as stored: graph.h5 keeps it, or narrows it (--feature-dtype)
            w += len(a)
            bar.update(len(a))
        bar.close()
    return blocks
