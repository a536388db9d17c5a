"""``ogb`` importer: an OGB node-property-prediction dataset directory in its raw layout.

```
DATASET/raw/edge.csv.gz            "u,v" per line: edge u -> v
DATASET/raw/num-node-list.csv.gz   N (optional: default the lines of node-label)
DATASET/raw/num-edge-list.csv.gz   E (optional: if present, edge.csv.gz must have E lines)
DATASET/raw/node-feat.csv.gz       N lines of F comma-separated floats
DATASET/raw/node-label.csv.gz      N lines, one class each ("nan" or -1 = unlabelled)
DATASET/split/<scheme>/{train,valid,test}.csv.gz   one node index per line
```

Files may also be uncompressed (``edge.csv``). ``--split`` picks the scheme (default: the only, else the
first in sorted order); without a ``split/`` directory a seeded random split is drawn. OGB lists each edge
of an undirected dataset once (its loader adds the reverse when ``add_inverse_edge`` is set in master.csv,
e.g. ogbn-products) and ogbn-arxiv is directed: pass ``--symmetrize`` to get the undirected graph most
GNN papers train on. Multi-label datasets (ogbn-proteins) are refused with a message saying so. Heterogeneous
ones (ogbn-mag: raw/relations/) are read by ``ogb_hetero``, link-prediction ones (split/<scheme>/*.pt) by
``ogb_link``. A ``raw/`` without ``edge.csv.gz`` but with ``data.npz`` is OGB's binary
layout (ogbn-papers100M), read by ``ogb_binary``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError, index_dtype
from g3mpi.format.limits import check_finite_features

from .common import EdgeStream, RawGraph, check_labels, check_masks, progress
from .external import EdgeSpool
from .textio import _lines, data_line_number, open_text, read_table, split_fields

SPLIT_FILES = (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test"))


def find(directory: Path, name: str, required: bool = True) -> Path | None:
    for cand in (directory / f"{name}.csv.gz", directory / f"{name}.csv"):
        if cand.exists():
            return cand
    if required:
        raise FormatError(directory / f"{name}.csv.gz", "no such file")
    return None


def unsupported(raw_dir: Path) -> None:
    """FormatError for the OGB layouts this importer does not read, instead of 'raw/edge.csv.gz: no such file'."""
    if find(raw_dir, "edge", required=False) is not None:
        return
    if (raw_dir / "relations").is_dir() or find(raw_dir, "num-node-dict", required=False) is not None:
        raise FormatError(raw_dir, "heterogeneous OGB dataset (raw/relations/, as ogbn-mag) is not supported: "
                                   "only homogeneous graphs")


def read_count(path: Path, what: str) -> int:
    """The one non-negative integer of num-node-list / num-edge-list (a single graph)."""
    a = _concat(read_table(path, delimiter=",", dtype=np.int64, comments=None), 1, np.int64).reshape(-1)
    if len(a) != 1 or a[0] < 0:
        raise FormatError(path, f"expected one graph's {what} count, found {a.tolist()[:3]}")
    return int(a[0])


def first_fields(path: Path) -> list[str]:
    """The comma-separated fields of the first non-blank line of ``path`` ([] if none)."""
    with open_text(path) as f:
        for line in _lines(path, f):
            if line.strip():
                return split_fields(line.strip(), ",")
    return []


def line_of(path: Path, row: int) -> int:
    return data_line_number(path, row, comments=None)


def _concat(chunks, ncols: int, dtype) -> np.ndarray:
    chunks = list(chunks)
    return np.concatenate(chunks) if chunks else np.zeros((0, ncols), dtype=dtype)


def load_ogb(path, split: str | None = None, num_classes: int | None = None, quiet: bool = False,
             spool_dir: Path | None = None, spool_limit: int = 1 << 30) -> RawGraph:
    """``spool_dir``: where the parsed edges go beyond ``spool_limit`` bytes (None: kept in memory)."""
    root = Path(path)
    raw_dir = _raw_dir(root)
    from .ogb_link import link_scheme, load_ogb_link
    link_dir = link_scheme(root, split)
    if link_dir is not None:          # a link-prediction dataset: split/<scheme>/train.pt
        return load_ogb_link(root, link_dir, quiet, spool_dir, spool_limit)
    if (raw_dir / "relations").is_dir():   # heterogeneous: node and edge types (ogbn-mag)
        from .ogb_hetero import load_ogb_hetero
        return load_ogb_hetero(root, split, quiet)
    if find(raw_dir, "edge", required=False) is None and (raw_dir / "data.npz").exists():
        from .ogb_binary import load_ogb_binary
        return load_ogb_binary(root, split=split, num_classes=num_classes, quiet=quiet)
    raw_dir, edge_f, label_f, feat_f = _raw_files(root)
    nn_f = find(raw_dir, "num-node-list", required=False)
    n = None if nn_f is None else read_count(nn_f, "node")
    ne_f = find(raw_dir, "num-edge-list", required=False)
    num_edges = None if ne_f is None else read_count(ne_f, "edge")
    feature_dim = len(first_fields(feat_f))        # the features are streamed into graph.h5 once the CSR is written
    labels, origin = _read_labels(label_f, n, num_classes)
    n = len(labels)
    c = check_labels(label_f, labels, n, num_classes)
    edges = _read_edges(edge_f, n, origin, ne_f, num_edges, quiet, spool_dir, spool_limit)
    masks, scheme = read_split(root, split, n, origin)
    if masks is not None:
        masks = check_masks(root / "split" / scheme, masks, labels)
    return RawGraph(path=str(root), num_nodes=n, src=None, dst=None, edges=edges, feature_dim=feature_dim,
                    feature_blocks=feature_stream(feat_f, n, feature_dim, quiet, origin), labels=labels, num_classes=c,
                    masks=masks,
                    source=f"ogb:{root.name}" + (f",split={scheme}" if scheme else ""))


def _raw_files(root: Path) -> tuple[Path, Path, Path, Path]:
    """``root``/raw and its edge, node-label and node-feat files; FormatError for a layout this importer does not
    read."""
    raw_dir = _raw_dir(root)
    unsupported(raw_dir)
    edge_f = find(raw_dir, "edge")
    label_f = find(raw_dir, "node-label")
    ncols = len(first_fields(label_f))
    if ncols > 1:                                  # before node-feat: ogbn-proteins has none
        raise FormatError(label_f, f"{ncols} label columns: multi-label datasets (ogbn-proteins) are not supported")
    feat_f = find(raw_dir, "node-feat")
    return raw_dir, edge_f, label_f, feat_f


def _raw_dir(root: Path) -> Path:
    """``root``/raw, FormatError if ``root`` is no dataset directory."""
    if not root.exists():
        raise FormatError(root, "no such directory")
    if not root.is_dir():
        raise FormatError(root, "expected an OGB dataset directory (with raw/ and split/)")
    raw_dir = root / "raw"
    if not raw_dir.is_dir():
        raise FormatError(raw_dir, "no such directory (expected the OGB raw layout)")
    return raw_dir


def _read_labels(label_f: Path, n: int | None, num_classes: int | None) -> tuple[np.ndarray, str]:
    """The labels of node-label (-1 for NaN: unlabelled), checked to be integers in range, one per node (``n``,
    or as many as there are lines without a num-node-list); and where N comes from, for the errors that name
    another file than node-label (its edges, features, split)."""
    y = _concat(read_table(label_f, delimiter=",", dtype=np.float64, comments=None), 1, np.float64)
    if y.shape[1] != 1:
        raise FormatError(label_f, f"{y.shape[1]} label columns: multi-label datasets are not supported")
    return label_values(label_f, y[:, 0], n, num_classes, lambda i: f"line {line_of(label_f, i)}", "lines")


def label_values(label_f: Path, y: np.ndarray, n: int | None, num_classes: int | None, at, entries: str):
    """``y`` (float [N], NaN = unlabelled) as int64 labels (-1 for NaN), checked to be integers in [-1, C), one
    per node (``n``, or len(y) when None); ``at(i)`` names entry i in a message ("line 4", "entry 3"), ``entries``
    what len(y) counts; and where N comes from (see :func:`_read_labels`)."""
    origin = ""
    if n is None:
        n = len(y)
        origin = f" ({n} nodes: the {entries} of {label_f.name}, as there is no num-node-list)"
    if len(y) != n:
        raise FormatError(label_f, f"{len(y)} labels but the graph has {n} nodes")
    bad = np.isfinite(y) & (y != np.round(y))
    if bad.any():
        i = int(np.argmax(bad))
        raise FormatError(label_f, f"{at(i)}: label {y[i]} is not an integer")
    if np.isinf(y).any():
        i = int(np.argmax(np.isinf(y)))
        raise FormatError(label_f, f"{at(i)}: label {y[i]} is not an integer")
    # range-checked as floats: a label beyond int64 (1e30) must not reach the cast, which wraps it
    bad = ~np.isnan(y) & ((y < -1) | (y >= (num_classes if num_classes is not None else 2.0 ** 62)))
    if bad.any():
        i = int(np.argmax(bad))
        hi = "" if num_classes is None else f", {num_classes}"
        raise FormatError(label_f, f"{at(i)}: label {y[i]:g} out of range [-1{hi})")
    return np.where(np.isnan(y), -1, y).astype(np.int64), origin


def _read_edges(edge_f: Path, n: int, origin: str, ne_f: Path | None, num_edges: int | None, quiet: bool,
                spool_dir: Path | None, spool_limit: int) -> EdgeStream:
    """The edges of the edge file, spooled (to ``spool_dir`` beyond ``spool_limit`` bytes): FormatError for a
    count other than num-edge-list's, then for the first node ID outside [0, n)."""
    idt = index_dtype(n)
    spool = EdgeSpool(idt, spool_dir, spool_limit)     # its file, if any, goes with spool_dir
    bar = progress(desc="read edges", unit="lines", disable=True if quiet else None)
    first_bad, count = None, 0                     # (row, ID) of the first bad edge: reported after the count check
    for e in read_table(edge_f, delimiter=",", dtype=np.int64, usecols=(0, 1), comments=None, bar=bar):
        if first_bad is None:
            bad = (e < 0) | (e >= n)
            if bad.any():
                r, col = np.argwhere(bad)[0]
                first_bad = (count + int(r), int(e[r, col]))
            else:
                spool.append(e[:, 0], e[:, 1])
        count += len(e)
    bar.close()
    if num_edges is not None and count != num_edges:        # an uncompressed edge.csv cut short, or two appended
        raise FormatError(edge_f, f"{count} edges but {ne_f.name} says {num_edges} (truncated or extended file?)")
    if first_bad is not None:
        r, v = first_bad
        raise FormatError(edge_f, f"line {line_of(edge_f, r)}: node ID {v} out of range [0, {n}){origin}")
    return EdgeStream(spool.num_edges, spool.blocks, np.dtype(idt), spool.close)


def feature_stream(feat_f: Path, n: int, dim: int, quiet: bool, origin: str = ""):
    """Row blocks (start, float32 [rows, dim]) of node-feat, parsed chunk by chunk as graph.h5 is written: the
    [n, dim] matrix is never held whole. Errors name the file: a bad line, NaN/Inf (first row), rows != n (``origin``
    ends that message: where n came from)."""
    def blocks():
        bar = progress(total=n, desc="read node-feat", unit="rows", disable=True if quiet else None)
        w = 0
        for a in read_table(feat_f, delimiter=",", dtype=np.float32, ncols=dim, comments=None):
            if w + len(a) > n:
                raise FormatError(feat_f, f"more than {n} rows: the graph has {n} nodes{origin}")
            check_finite_features(feat_f, a, w, rows=lambda r: f"row {r} (line {line_of(feat_f, r)})")
            yield w, a
            w += len(a)
            bar.update(len(a))
        bar.close()
        if w != n:
            raise FormatError(feat_f, f"features have {w} rows but the graph has {n} nodes{origin}")
    return blocks


def read_split(root: Path, scheme: str | None, n: int, origin: str = ""):
    """(masks or None, scheme name) from split/<scheme>/{train,valid,test}.csv.gz; ``origin`` ends the message of
    an index out of range: where n came from."""
    split_dir = root / "split"
    schemes = sorted(p.name for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if scheme is None:
        if not schemes:
            return None, None
        scheme = schemes[0]
    elif scheme not in schemes:
        raise FormatError(split_dir / scheme, f"no such split scheme (available: {', '.join(schemes) or 'none'})")
    d = split_dir / scheme
    masks = {}
    for key, name in SPLIT_FILES:
        f = find(d, name)
        idx = _concat(read_table(f, delimiter=",", dtype=np.int64, usecols=(0,), comments=None), 1,
                      np.int64).reshape(-1)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            i = int(np.argmax(bad))
            raise FormatError(f, f"line {line_of(f, i)}: node index {int(idx[i])} out of range [0, {n}){origin}")
        order = np.argsort(idx, kind="stable")
        dup = np.flatnonzero(idx[order][1:] == idx[order][:-1])
        if len(dup):                               # a mask would silently count the node once
            first, again = sorted((int(order[dup[0]]), int(order[dup[0] + 1])))
            raise FormatError(f, f"line {line_of(f, again)}: node index {int(idx[again])} listed twice "
                                 f"(also on line {line_of(f, first)})")
        m = np.zeros(n, dtype=bool)
        m[idx] = True
        masks[key] = m
    return masks, scheme
