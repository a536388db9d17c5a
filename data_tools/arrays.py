"""A graph held as arrays in Python (NumPy arrays, or torch tensors such as a PyG ``Data``'s fields) written to
a graph.h5: the way in for PyG and DGL users, with the checks and the writer of every importer (docs/PREPARE.md,
"From Python")."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from g3mpi.format import FormatError, check_output
from g3mpi.format.features import FEATURE_DTYPES, widen
from g3mpi.format.graph import MASKS

from .importers.common import MEMORY_BUDGET, PrepareOptions, write_raw_graph
from .importers.external import work_dir
from .importers.npz import graph_from_arrays


def as_numpy(a, name: str):
    """``a`` as a NumPy array: a torch tensor (on any device, with or without grad) is detached and copied to the
    CPU; bfloat16, which NumPy lacks, as its 16-bit pattern (uint16, see g3mpi/format/features.py). None stays
    None."""
    if a is None:
        return None
    if hasattr(a, "detach") and hasattr(a, "cpu"):          # a torch tensor, without importing torch here
        t = a.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            return BFloat16(t.contiguous().view(dtype=_int16_of(t)).numpy().view(np.uint16))
        return t.numpy()
    if isinstance(a, (list, tuple)):
        raise TypeError(f"{name} must be an array or a tensor, not a {type(a).__name__}")
    return np.asarray(a)


class BFloat16(np.ndarray):
    """The uint16 pattern of a bfloat16 tensor, marked as such (NumPy has no bfloat16)."""

    def __new__(cls, bits: np.ndarray):
        return np.asarray(bits).view(cls)


def _int16_of(t):
    import torch                                     # only reached with a torch tensor in hand
    return torch.int16


def links_from_dict(path, links: dict) -> dict:
    """``{split: {key: array}}`` (NumPy or torch) as the link datasets of graph.h5 (``link_val_edge`` ...)."""
    from g3mpi.format.links import KEYS, SPLITS, link_name
    out = {}
    for split, arrays in links.items():
        if split not in SPLITS or not isinstance(arrays, dict) or set(arrays) - set(KEYS):
            raise FormatError(path, f"links must be {{train|val|test: {{{', '.join(KEYS)}}}}}, got {split!r}: "
                                    f"{sorted(arrays) if isinstance(arrays, dict) else type(arrays).__name__}")
        for k, a in arrays.items():
            a = as_numpy(a, f"links[{split!r}][{k!r}]")
            if a is not None:
                out[link_name(split, k)] = a
    return out


def write_graph(path, edge_index, x, y=None, masks: dict | None = None, *, num_nodes: int | None = None,
                num_classes: int | None = None, symmetrize: bool = False, self_loops: str = "keep",
                dedup: bool = False, normalize_features: bool = False, train: float = 0.6, val: float = 0.2,
                seed: int = 0, force: bool = False, memory_budget: int = MEMORY_BUDGET, source: str = "arrays",
                feature_dtype: str | None = None, quiet: bool = True, edge_type=None, num_relations: int | None = None,
                relation_names=None, links: dict | None = None, link_split=None, split_seed: int = 0,
                node_type=None, node_type_names=None, node_type_feature_dim=None) -> dict:
    """Write the graph given as arrays to the graph.h5 ``path``, as ``g3-prepare npz`` writes an archive of them.

    ``edge_index``: int [2, E], row 0 the source and row 1 the target of each edge (PyG's ``data.edge_index``);
    ``x``: real [N, F] features; ``y``: int [N] classes, -1 = unlabelled (or None: no labels); ``masks``:
    ``{"train_mask", "val_mask", "test_mask"}`` bool [N] (or None: a seeded random split, fractions ``train`` and
    ``val``). Each may be a NumPy array or a torch tensor. ``num_nodes``: N (default: the rows of ``x``). The
    keyword options are ``g3-prepare``'s (``--symmetrize``, ``--self-loops``, ``--feature-dtype``, ...): the
    features are stored as given (float16 and bfloat16 tensors too) unless ``feature_dtype`` says otherwise.
    ``x`` None: no features (width 0; give ``num_nodes``).

    Link prediction and relations (docs/FORMAT.md): ``edge_type`` int [E], the relation of each edge, in [0,
    ``num_relations``) (default: max + 1), with optional ``relation_names``; ``links``: the splits, ``{"train" |
    "val" | "test": {"edge": [M, 2] (source, target), "edge_type": [M], "edge_neg": [K, 2], "target_node_neg":
    [M, K]}}`` (val and test pairs must not be edges of ``edge_index``); or ``link_split=(train, val, test)``
    fractions for a random split with ``split_seed`` (``g3-prepare --link-split``). ``node_type`` int [N]: the type
    of each node, with optional ``node_type_names`` and ``node_type_feature_dim`` (the leading columns of ``x`` each
    type uses).

    Checked as every importer checks its input, with the same messages naming ``path``: FormatError for an edge
    endpoint outside [0, N), features that are not [N, F] or not finite, labels or masks of another length, labels
    out of range, overlapping masks or masks of unlabelled nodes; ValueError for a bad option. Nothing is written
    on failure (the file is written under a temporary name and renamed into place when complete).
    Returns the summary ``g3-prepare`` prints (num_nodes, num_edges, split sizes, build, ...)."""
    path = Path(path)
    opts = PrepareOptions(symmetrize=symmetrize, self_loops=self_loops, dedup=dedup,
                          normalize_features=normalize_features, train=train, val=val, seed=seed, force=force,
                          quiet=quiet, memory_budget=memory_budget, feature_dtype=feature_dtype)
    if self_loops not in ("keep", "drop", "add"):
        raise ValueError(f"self_loops must be keep, drop or add, got {self_loops!r}")
    if feature_dtype is not None and feature_dtype not in FEATURE_DTYPES:
        raise ValueError(f"feature_dtype must be one of {', '.join(FEATURE_DTYPES)}, got {feature_dtype!r}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    ei, feats, labels = as_numpy(edge_index, "edge_index"), as_numpy(x, "x"), as_numpy(y, "y")
    if feats is None:
        if num_nodes is None:
            raise ValueError("write_graph without features (x=None) needs num_nodes")
        feats = np.zeros((int(num_nodes), 0), dtype=np.float32)
    if link_split is not None:
        opts = dataclasses.replace(opts, link_split=tuple(float(v) for v in link_split), split_seed=int(split_seed))
    if masks is not None:
        unknown = sorted(set(masks) - set(MASKS))
        if unknown or len(masks) != 3:
            raise FormatError(path, f"masks must be {{{', '.join(MASKS)}}}, got {sorted(masks)}")
        masks = {k: as_numpy(masks[k], k) for k in MASKS}
    n = int(num_nodes) if num_nodes is not None else (int(feats.shape[0]) if feats.ndim else 0)
    if path.is_dir():
        raise FormatError(path, "is a directory, expected a graph.h5 path")
    check_output(path, force)                        # before any heavy work, as g3-prepare
    bf16 = isinstance(feats, BFloat16)
    if bf16:                                         # checked as the float32 values they are (exact)
        feats = widen(feats.view(np.ndarray), "bfloat16")
    raw = graph_from_arrays(path, ei, feats, labels, masks, n, num_classes, source=source)
    if bf16:
        raw.feature_dtype = "bfloat16"
    if edge_type is not None:
        typ = as_numpy(edge_type, "edge_type")
        if typ.shape != (ei.shape[1],) or typ.dtype.kind not in "iu":
            raise FormatError(path, f"edge_type must be integers [{ei.shape[1]}] (one per edge), got {typ.dtype} "
                                    f"{list(typ.shape)}")
        R = int(num_relations) if num_relations is not None else (int(typ.max()) + 1 if len(typ) else 1)
        raw.edge_type, raw.num_relations = typ.astype(np.int64), R
        raw.relation_names = list(relation_names) if relation_names is not None else None
    if links is not None:
        raw.links = links_from_dict(path, links)
    if node_type is not None:
        nt = as_numpy(node_type, "node_type")
        raw.node_type = nt
        raw.num_node_types = int(nt.max()) + 1 if nt.size else 1
        if node_type_names is not None:
            raw.num_node_types = len(node_type_names)
            raw.node_type_names = list(node_type_names)
        if node_type_feature_dim is not None:
            raw.node_type_feature_dim = np.asarray(as_numpy(node_type_feature_dim, "node_type_feature_dim"))
    with work_dir(path) as work:
        return write_raw_graph(path, raw, opts, work)
