"""``npz`` importer: one NumPy archive with the arrays of a graph (the layout of Planetoid dumps like cora.npz).

Keys: ``edge_index`` int [2, E] (row 0 the source, row 1 the target of each edge), ``x`` float [N, F];
optional ``y`` int [N] (-1 = unlabelled) or [N, C] of 0/1 (multi-label; -1 or NaN unknown), ``train_mask``,
``val_mask``, ``test_mask`` bool [N] (all three or none: without them a seeded random split is drawn),
``num_nodes`` (default: rows of ``x``),
``num_classes`` (default: max label + 1). Loaded with ``allow_pickle=False``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format import FormatError
from g3mpi.format.features import natural_dtype, stored_dtype
from g3mpi.format.graph import MASKS

from .common import (NUMPY_READ_ERRORS, RawGraph, as_labels, check_edge_ids, check_features, check_labels,
                     check_masks, load_numpy)


def _get(path, z, key):
    try:
        return z[key]
    except NUMPY_READ_ERRORS as e:
        raise FormatError(path, f"array {key!r} cannot be read (truncated or corrupt?): {e}") from None


def check_num_classes_key(path, a: np.ndarray, need: int, num_nodes: int) -> int:
    """The archive's ``num_classes``: one integer C with need <= C <= max(N, need), need = max label + 1.

    The upper bound keeps a corrupt value (1e12) from reaching training, which sizes its output layer by C.
    """
    if a.size != 1 or not np.issubdtype(a.dtype, np.integer):
        raise FormatError(path, f"num_classes must be one integer, got {a.dtype} {list(a.shape)}")
    c = int(a.reshape(-1)[0])
    if not need <= c <= max(num_nodes, need):
        raise FormatError(path, f"num_classes {c} out of range [{need}, {max(num_nodes, need)}] "
                                f"(max label + 1 .. number of nodes)")
    return c


def load_npz(path, num_classes: int | None = None) -> RawGraph:
    path = Path(path)
    with load_numpy(path, "a graph", archive=True) as z:
        keys = set(z.files)
        for k in ("edge_index", "x"):
            if k not in keys:
                raise FormatError(path, f"missing array {k!r} (has: {', '.join(sorted(keys)) or 'nothing'})")
        ei = _get(path, z, "edge_index")
        x = _get(path, z, "x")
        y = _get(path, z, "y") if "y" in keys else None
        present = [k for k in MASKS if k in keys]
        if present and len(present) != 3:
            raise FormatError(path, f"has {present} but not all of {list(MASKS)}")
        masks = {k: _get(path, z, k) for k in MASKS} if present else None
        if "num_nodes" in keys:
            nn = _get(path, z, "num_nodes")
            if nn.size != 1 or not np.issubdtype(nn.dtype, np.integer) or int(nn.reshape(-1)[0]) < 0:
                raise FormatError(path, f"num_nodes must be one non-negative integer, got {nn.dtype} {list(nn.shape)}")
            n = int(nn.reshape(-1)[0])
        else:
            n = int(x.shape[0]) if x.ndim else 0
        nc = _get(path, z, "num_classes") if "num_classes" in keys else None
    return graph_from_arrays(path, ei, x, y, masks, n, num_classes, nc, source=f"npz:{path.name}")


def graph_from_arrays(path, ei: np.ndarray, x: np.ndarray, y: np.ndarray | None, masks: dict | None, n: int,
                      num_classes: int | None = None, nc: np.ndarray | None = None, source: str = "") -> RawGraph:
    """The checked RawGraph of a graph given as arrays (an npz archive's, or :func:`data_tools.write_graph`'s):
    ``ei`` int [2, E], ``x`` real [N, F], ``y`` int [N] or None, ``masks`` {train_mask, val_mask, test_mask} or
    None, ``n`` = N, ``nc`` the archive's ``num_classes`` array (or None). FormatError naming ``path`` for the
    first thing every importer refuses: an edge endpoint out of range, features of another shape or not finite,
    labels or masks of another length, labels out of range, masks overlapping or of unlabelled nodes."""
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise FormatError(path, f"edge_index must have shape [2, E], got {list(ei.shape)}")
    if not np.issubdtype(ei.dtype, np.integer):
        raise FormatError(path, f"edge_index must be integers, got dtype {ei.dtype}")
    check_edge_ids(path, ei[0], ei[1], n, what="edge_index column")
    check_features(path, x, n)
    if num_classes is None and nc is not None:
        num_classes = check_num_classes_key(path, nc, check_labels(path, y, n, None) if y is not None else 0, n)
    if y is not None:
        c = check_labels(path, y, n, num_classes)
        y = as_labels(y)
    else:
        if masks is not None:
            raise FormatError(path, "has split masks but no labels 'y'")
        c = 0
    if masks is not None:
        for k, m in masks.items():
            if m.shape != (n,):
                raise FormatError(path, f"{k} has shape {list(m.shape)}, expected [{n}]")
        masks = check_masks(path, masks, y)
    return RawGraph(path=str(path), num_nodes=n, src=ei[0], dst=ei[1], feature_dim=int(x.shape[1]),
                    features=np.ascontiguousarray(x, dtype=stored_dtype(natural_dtype(x.dtype))), labels=y,
                    num_classes=c, masks=masks, source=source, feature_dtype=natural_dtype(x.dtype))
