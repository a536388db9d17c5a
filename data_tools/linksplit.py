"""Link splits and edge types at import (docs/PREPARE.md, "Link prediction and relations"): a seeded random split of
any importer's edges into train / val / test positives (held-out edges leave the message-passing graph; both
directions of an undirected edge together, as PyG's ``RandomLinkSplit``), and the in-memory CSR of typed edges."""
from __future__ import annotations

import numpy as np

from g3mpi.format import FormatError
from g3mpi.format.links import link_name

from .importers.common import build_in_csr


def parse_fractions(text: str) -> tuple[float, float, float]:
    """``0.85,0.05,0.1`` -> (train, val, test): three fractions >= 0 summing to 1 (within 1e-6)."""
    try:
        parts = tuple(float(x) for x in text.split(","))
    except ValueError:
        parts = ()
    if len(parts) != 3 or not all(0 <= x <= 1 for x in parts) or abs(sum(parts) - 1) > 1e-6:
        raise ValueError(f"--link-split must be three fractions TRAIN,VAL,TEST summing to 1, e.g. 0.85,0.05,0.1 "
                         f"(got {text!r})")
    return parts


def _keys(n: int, src: np.ndarray, dst: np.ndarray, typ: np.ndarray | None, num_relations: int) -> np.ndarray:
    """One int64 key per (source, target[, relation]); FormatError if they do not fit in 63 bits."""
    r = max(1, num_relations)
    if n and n * n > (2**62) // r:
        raise FormatError("--link-split", f"{n} nodes and {r} relations are too many for a random link split")
    k = src.astype(np.int64) * n + dst.astype(np.int64)
    return k * r + typ.astype(np.int64) if typ is not None else k


def random_link_split(n: int, src: np.ndarray, dst: np.ndarray, typ: np.ndarray | None, num_relations: int,
                      fractions: tuple[float, float, float], seed: int, undirected: bool):
    """Split the distinct edges (u != v) of src -> dst (relation ``typ``) into train / val / test positives.

    ``undirected``: an edge and its reverse are one pair (stored as smaller ID -> larger), held out together. The
    val and test counts are ``floor(fraction * pairs)``, drawn by a permutation of the pairs (sorted by key)
    from ``numpy.random.default_rng(seed)``; train gets the rest. Self loops stay in the graph and in no split.
    Returns (links {link dataset name: array}, (src, dst, typ) of the message-passing edges: every input edge
    whose pair is not held out, duplicates and self loops as given)."""
    a, b = src.astype(np.int64), dst.astype(np.int64)
    if undirected:
        a, b = np.minimum(src, dst).astype(np.int64), np.maximum(src, dst).astype(np.int64)
    key = _keys(n, a, b, typ, num_relations)
    cand = np.unique(key[a != b])
    rng = np.random.default_rng(seed)
    perm = cand[rng.permutation(len(cand))]
    n_val, n_test = int(fractions[1] * len(cand)), int(fractions[2] * len(cand))
    groups = dict(val=np.sort(perm[:n_val]), test=np.sort(perm[n_val:n_val + n_test]),
                  train=np.sort(perm[n_val + n_test:]))
    r = max(1, num_relations)
    links = {}
    for split, ks in groups.items():
        pair = ks // r if typ is not None else ks
        links[link_name(split, "edge")] = np.stack([pair // n, pair % n], axis=1) if n else np.zeros((0, 2), np.int64)
        if typ is not None:
            links[link_name(split, "edge_type")] = ks % r
    held = np.concatenate([groups["val"], groups["test"]])
    keep = ~np.isin(key, held)
    return links, (src[keep], dst[keep], typ[keep] if typ is not None else None)


def typed_csr(n: int, src: np.ndarray, dst: np.ndarray, typ: np.ndarray, *, symmetrize: bool, self_loops: str,
              dedup: bool, path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """In-edge CSR (indptr, indices, edge_type) of typed edges, rows sorted by source then relation:
    ``symmetrize`` adds v -> u of the same relation for every u -> v and merges duplicate triples, ``dedup``
    merges them, ``self_loops`` keep / drop (``add`` is refused: which relation would they have?)."""
    if self_loops == "add":
        raise FormatError(path, "--self-loops add is not defined for a graph with edge types (which relation?)")
    if symmetrize:
        src, dst, typ = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([typ, typ])
    if self_loops == "drop":
        keep = src != dst
        src, dst, typ = src[keep], dst[keep], typ[keep]
    order = np.lexsort((typ, src, dst))
    src, dst, typ = src[order], dst[order], typ[order]
    if (dedup or symmetrize) and len(src) > 1:
        new = np.ones(len(src), dtype=bool)
        new[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1]) | (typ[1:] != typ[:-1])
        src, dst, typ = src[new], dst[new], typ[new]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    idt = np.int32 if n < 2**31 else np.int64
    return indptr, src.astype(idt), typ.astype(np.int64)


def build_csr(n: int, src, dst, typ, *, symmetrize: bool, self_loops: str, dedup: bool, quiet: bool, path):
    """(indptr, indices, edge_type or None) of the message-passing edges, typed or not."""
    if typ is None:
        indptr, indices = build_in_csr(n, src, dst, symmetrize=symmetrize, self_loops=self_loops, dedup=dedup,
                                       quiet=quiet)
        return indptr, indices, None
    return typed_csr(n, src, dst, typ, symmetrize=symmetrize, self_loops=self_loops, dedup=dedup, path=path)
