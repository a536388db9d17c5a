"""OGB's heterogeneous node-property layout (ogbn-mag), read by ``g3-prepare ogb`` when ``raw/relations/`` exists:

```
DATASET/raw/num-node-dict.csv.gz                       a header of node type names, then one line of their counts
DATASET/raw/relations/<src>___<rel>___<dst>/edge.csv.gz  "u,v" per line, IDs local to the src and dst types
DATASET/raw/node-feat/<type>/node-feat.csv.gz          features of the nodes of a type (optional per type)
DATASET/raw/node-label/<type>/node-label.csv.gz        labels of the nodes of a type (optional per type)
DATASET/split/<scheme>/<type>/{train,valid,test}.csv.gz
```

One graph of all types: the nodes of the types in the order of num-node-dict, each type a contiguous ID range; one
relation per directory of raw/relations (sorted by name, stored as ``relation_names``), each node's type in
``node_type``. Features are as wide as the widest type's; a type's columns beyond its own width (all of them for a
type without features) are zero, and ``node_type_feature_dim`` records each width. Labels and splits of the types
that have them; the other nodes are unlabelled."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError

from .common import RawGraph, check_labels, check_masks
from .ogb import SPLIT_FILES, _concat, _read_labels, feature_stream, find, first_fields, line_of
from .textio import read_table


def read_node_dict(raw_dir: Path) -> tuple[list[str], list[int]]:
    f = find(raw_dir, "num-node-dict")
    with_header = list(read_lines(f))
    if len(with_header) != 2:
        raise FormatError(f, f"expected a header of node types and one line of counts, got {len(with_header)} lines")
    names = [x.strip() for x in with_header[0].split(",")]
    try:
        counts = [int(x) for x in with_header[1].split(",")]
    except ValueError:
        raise FormatError(f, f"line 2: node counts must be integers, got {with_header[1][:60]!r}") from None
    if len(counts) != len(names) or any(c < 0 for c in counts) or len(set(names)) != len(names):
        raise FormatError(f, "needs one count >= 0 per distinct node type name")
    return names, counts


def read_lines(f: Path):
    from .textio import open_text
    with open_text(f) as fh:
        for line in fh:
            if line.strip():
                yield line.strip()


def load_ogb_hetero(root: Path, scheme: str | None, quiet: bool) -> RawGraph:
    raw_dir = root / "raw"
    types, counts = read_node_dict(raw_dir)
    offset = dict(zip(types, np.concatenate([[0], np.cumsum(counts)]).tolist()))
    size = dict(zip(types, counts))
    n = int(sum(counts))
    rel_dirs = sorted(d for d in (raw_dir / "relations").iterdir() if d.is_dir())
    src, dst, typ, names = [], [], [], []
    for r, d in enumerate(rel_dirs):
        parts = d.name.split("___")
        if len(parts) != 3 or parts[0] not in size or parts[2] not in size:
            raise FormatError(d, f"expected <src>___<relation>___<dst> of node types {', '.join(types)}")
        f = find(d, "edge", required=False)
        if f is None:
            raise FormatError(d / "edge.csv.gz", "no such file (heterogeneous OGB layout, as ogbn-mag: every "
                                                 "raw/relations/<src>___<rel>___<dst>/ holds edge.csv.gz)")
        e = _concat(read_table(f, delimiter=",", dtype=np.int64, usecols=(0, 1), comments=None), 2, np.int64)
        for col, t in ((0, parts[0]), (1, parts[2])):
            bad = (e[:, col] < 0) | (e[:, col] >= size[t])
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(f, f"line {line_of(f, i)}: {t} ID {int(e[i, col])} out of range [0, {size[t]})")
        src.append(e[:, 0] + offset[parts[0]])
        dst.append(e[:, 1] + offset[parts[2]])
        typ.append(np.full(len(e), r, np.int64))
        names.append(d.name)
    cat = (lambda a: np.concatenate(a) if a else np.zeros(0, np.int64))
    node_type = np.repeat(np.arange(len(types), dtype=np.int64), counts)
    widths = {t: _width(raw_dir, t) for t in types}
    labels, c = _labels(raw_dir, types, offset, size, n)
    masks, scheme_name = _masks(root, scheme, types, offset, size, n)
    if masks is not None:
        masks = check_masks(root / "split" / scheme_name, masks, labels)
    F = max(widths.values(), default=0)
    return RawGraph(path=str(root), num_nodes=n, src=cat(src), dst=cat(dst), feature_dim=F,
                    feature_blocks=lambda: _features(raw_dir, types, size, widths, F, quiet), labels=labels,
                    num_classes=c, masks=masks, source=f"ogb:{root.name},hetero" + (f",split={scheme_name}"
                                                                                     if scheme_name else ""),
                    edge_type=cat(typ), num_relations=max(1, len(names)), relation_names=names or None,
                    node_type=node_type, num_node_types=len(types), node_type_names=types,
                    node_type_feature_dim=np.array([widths[t] for t in types], np.int64))


def _width(raw_dir: Path, t: str) -> int:
    f = find(raw_dir / "node-feat" / t, "node-feat", required=False)
    return len(first_fields(f)) if f is not None else 0


def _features(raw_dir, types, size, widths, F, quiet):
    """Row blocks of every type's features, padded with zeros to F columns (zeros for a type without any)."""
    start = 0
    for t in types:
        if widths[t]:
            f = find(raw_dir / "node-feat" / t, "node-feat")
            for s, a in feature_stream(f, size[t], widths[t], quiet)():
                block = np.zeros((len(a), F), np.float32)
                block[:, :widths[t]] = a
                yield start + s, block
        else:
            step = max(1, (16 << 20) // max(1, 4 * F))
            for s in range(0, size[t], step):
                yield start + s, np.zeros((min(step, size[t] - s), F), np.float32)
        start += size[t]


def _labels(raw_dir, types, offset, size, n):
    labels = np.full(n, -1, np.int64)
    for t in types:
        f = find(raw_dir / "node-label" / t, "node-label", required=False)
        if f is None:
            continue
        y, _ = _read_labels(f, size[t], None)
        if len(y) != size[t]:
            raise FormatError(f, f"{len(y)} labels for {size[t]} nodes of type {t}")
        labels[offset[t]:offset[t] + size[t]] = y
    c = check_labels(raw_dir / "node-label", labels, n, None) if (labels >= 0).any() else 0
    return labels, c


def _masks(root, scheme, types, offset, size, n):
    split_dir = root / "split"
    schemes = sorted(p.name for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if scheme is None and not schemes:
        return None, None
    scheme = scheme or schemes[0]
    if scheme not in schemes:
        raise FormatError(split_dir / scheme, f"no such split scheme (available: {', '.join(schemes) or 'none'})")
    masks = {k: np.zeros(n, bool) for k, _ in SPLIT_FILES}
    for t in types:
        d = split_dir / scheme / t
        if not d.is_dir():
            continue
        for key, name in SPLIT_FILES:
            f = find(d, name)
            idx = _concat(read_table(f, delimiter=",", dtype=np.int64, usecols=(0,), comments=None), 1,
                          np.int64).reshape(-1)
            bad = (idx < 0) | (idx >= size[t])
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(f, f"line {line_of(f, i)}: {t} index {int(idx[i])} out of range [0, {size[t]})")
            masks[key][idx + offset[t]] = True
    return masks, scheme
