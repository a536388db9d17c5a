"""OGB's link-property-prediction layout (ogbl-collab, ogbl-citation2, ogbl-ppa, ...), read by ``g3-prepare ogb``
when the split directory holds ``.pt`` files:

```
DATASET/raw/edge.csv.gz              "u,v" per line: the message-passing (training) graph
DATASET/raw/num-node-list.csv.gz     N
DATASET/raw/node-feat.csv.gz         N lines of F floats (optional: no features)
DATASET/split/<scheme>/{train,valid,test}.pt   dicts of tensors
```

Each ``.pt`` is read with ``torch.load(weights_only=True)``: tensors, dicts and lists only, nothing else unpickled.
Keys read: ``edge`` [M, 2] (or ``source_node`` and ``target_node`` [M]), ``edge_neg`` [K, 2] and
``target_node_neg`` [M, K]; others (``weight``, ``year``) are ignored."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError
from g3mpi.format.links import link_name

from .common import RawGraph
from .ogb import _read_edges, feature_stream, find, first_fields, read_count

PT_SPLITS = (("train", "train.pt"), ("val", "valid.pt"), ("test", "test.pt"))


def link_scheme(root: Path, scheme: str | None) -> Path | None:
    """The split directory of an OGB link dataset (one holding train.pt), or None for another layout."""
    split = root / "split"
    if not split.is_dir():
        return None
    dirs = [split / scheme] if scheme else sorted(d for d in split.iterdir() if d.is_dir())
    for d in dirs:
        if (d / "train.pt").exists():
            return d
    return None


def load_pt(path: Path) -> dict:
    """A split file as {key: numpy array}: FormatError naming it if it is not a dict of tensors (or cannot be read
    without unpickling arbitrary objects)."""
    import pickle

    import torch
    if not path.exists():
        raise FormatError(path, "no such file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FormatError(path, f"not a torch file of tensors (read with weights_only=True: nothing else is "
                                f"unpickled): {first}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) for k in obj):
        raise FormatError(path, f"expected a dict of tensors, got {type(obj).__name__}")
    out = {}
    for k, v in obj.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.numpy()
        elif isinstance(v, np.ndarray):
            out[k] = v
    return out


def split_links(path: Path, d: dict, split: str) -> dict:
    """The link datasets of one OGB split dict."""
    def ints(key, ndim):
        a = np.asarray(d[key])
        if a.dtype.kind not in "iu" or a.ndim != ndim:
            raise FormatError(path, f"{key!r} must be an integer tensor of {ndim} dimensions, got {a.dtype} "
                                    f"{list(a.shape)}")
        return a.astype(np.int64)
    out = {}
    if "edge" in d:
        e = ints("edge", 2)
        if e.shape[1] != 2 and e.shape[0] == 2:
            e = e.T
        out[link_name(split, "edge")] = e
    elif "source_node" in d and "target_node" in d:
        s, t = ints("source_node", 1), ints("target_node", 1)
        if s.shape != t.shape:
            raise FormatError(path, f"source_node {list(s.shape)} and target_node {list(t.shape)} differ in length")
        out[link_name(split, "edge")] = np.stack([s, t], axis=1)
    else:
        raise FormatError(path, f"has neither 'edge' nor 'source_node' and 'target_node' (keys: {sorted(d)})")
    if "edge_neg" in d:
        e = ints("edge_neg", 2)
        out[link_name(split, "edge_neg")] = e.T if e.shape[1] != 2 and e.shape[0] == 2 else e
    if "target_node_neg" in d:
        out[link_name(split, "target_node_neg")] = ints("target_node_neg", 2)
    return out


def load_ogb_link(root: Path, split_dir: Path, quiet: bool, spool_dir: Path | None, spool_limit: int) -> RawGraph:
    raw_dir = root / "raw"
    edge_f = find(raw_dir, "edge")
    nn_f = find(raw_dir, "num-node-list", required=False)
    if nn_f is None:
        raise FormatError(raw_dir / "num-node-list.csv.gz", "no such file (a link dataset's node count)")
    n = read_count(nn_f, "node")
    ne_f = find(raw_dir, "num-edge-list", required=False)
    num_edges = None if ne_f is None else read_count(ne_f, "edge")
    edges = _read_edges(edge_f, n, "", ne_f, num_edges, quiet, spool_dir, spool_limit)
    feat_f = find(raw_dir, "node-feat", required=False)
    dim = len(first_fields(feat_f)) if feat_f is not None else 0
    links = {}
    for split, name in PT_SPLITS:
        path = split_dir / name
        links.update(split_links(path, load_pt(path), split))
    masks = {m: np.zeros(n, bool) for m in ("train_mask", "val_mask", "test_mask")}
    return RawGraph(path=str(root), num_nodes=n, src=None, dst=None, edges=edges, feature_dim=dim,
                    feature_blocks=feature_stream(feat_f, n, dim, quiet) if feat_f is not None else None,
                    features=None if feat_f is not None else np.zeros((n, 0), np.float32), masks=masks,
                    source=f"ogb:{root.name},split={split_dir.name}", links=links)
