"""Link splits and edge types of a graph (docs/FORMAT.md, "Link splits and edge types"): their dataset names, and
the checks every writer and reader applies to them (node and relation IDs in range, held-out pairs absent from the
message-passing graph, rows sorted by source then relation)."""
from __future__ import annotations

import numpy as np

from .errors import FormatError

SPLITS = ("train", "val", "test")
#: per split: positive pairs [M, 2] (source, target); their relation [M]; shared negative pairs [K, 2] (OGB's
#: ``edge_neg``); per-positive negative targets [M, K] (OGB's ``target_node_neg``)
KEYS = ("edge", "edge_type", "edge_neg", "target_node_neg")
#: held out of the message-passing graph
HELD_OUT = ("val", "test")


def link_name(split: str, key: str) -> str:
    """The dataset name of one link array in graph.h5 and the part files: ``link_val_edge_neg``."""
    return f"link_{split}_{key}"


LINK_NAMES = tuple(link_name(s, k) for s in SPLITS for k in KEYS)


def check_edge_types(path, edge_type: np.ndarray, num_edges: int, num_relations: int, what: str = "edge_type"):
    """FormatError unless ``edge_type`` is [num_edges] of relation IDs in [0, num_relations)."""
    if edge_type.shape != (num_edges,):
        raise FormatError(path, f"{what} has shape {edge_type.shape}, expected ({num_edges},)")
    if edge_type.dtype.kind not in "iu":
        raise FormatError(path, f"{what} has dtype {edge_type.dtype}, expected an integer type")
    if len(edge_type):
        lo, hi = int(edge_type.min()), int(edge_type.max())
        if lo < 0 or hi >= num_relations:
            pos = int(np.argmax((edge_type < 0) | (edge_type >= num_relations)))
            raise FormatError(path, f"{what}: relation ID {int(edge_type[pos])} of edge {pos} out of range "
                                    f"[0, {num_relations})")


def check_typed_rows(path, indptr: np.ndarray, indices: np.ndarray, edge_type: np.ndarray, what: str = "graph CSR",
                     first_row: int = 0) -> None:
    """FormatError naming the first row in which two edges from the same source are not in ascending relation
    order (the rows are already checked sorted by source)."""
    from .graph import first_unsorted_row      # (graph.py imports this module)
    if len(indices) < 2:
        return
    down = (indices[1:] == indices[:-1]) & (edge_type[1:] < edge_type[:-1])
    bad = first_unsorted_row(indptr, down)
    if bad is not None:
        r, pos = bad
        raise FormatError(path, f"{what}: the edges from node {int(indices[pos])} into row {first_row + r} are not "
                                f"in ascending relation order ({int(edge_type[pos - 1])} before "
                                f"{int(edge_type[pos])}; the format keeps them sorted)")


def check_links(path, links: dict, num_nodes: int, num_relations: int) -> None:
    """FormatError naming the dataset and the first bad entry unless every link array has its shape and its node
    and relation IDs in range (``links``: {dataset name: array}, see :data:`LINK_NAMES`)."""
    unknown = sorted(set(links) - set(LINK_NAMES))
    if unknown:
        raise FormatError(path, f"unknown link datasets {unknown} (expected names like {link_name('val', 'edge')})")
    for split in SPLITS:
        pos = links.get(link_name(split, "edge"))
        for key in KEYS:
            name = link_name(split, key)
            a = links.get(name)
            if a is None:
                continue
            if a.dtype.kind not in "iu":
                raise FormatError(path, f"{name} has dtype {a.dtype}, expected integers")
            if key != "edge" and pos is None and key != "edge_neg":
                raise FormatError(path, f"{name} is given without {link_name(split, 'edge')}")
            if key in ("edge", "edge_neg") and (a.ndim != 2 or a.shape[1] != 2):
                raise FormatError(path, f"{name} has shape {a.shape}, expected (pairs, 2): source, target")
            if key == "edge_type":
                if num_relations == 0:
                    raise FormatError(path, f"{name}: the graph has no edge types (num_relations 0)")
                check_edge_types(path, a, len(pos), num_relations, name)
                continue
            if key == "target_node_neg" and (a.ndim != 2 or a.shape[0] != len(pos)):
                raise FormatError(path, f"{name} has shape {a.shape}, expected ({len(pos)}, negatives per positive)")
            if a.size:
                flat = a.reshape(-1)
                bad = (flat < 0) | (flat >= num_nodes)
                if bad.any():
                    i = int(np.argmax(bad))
                    row = i // (a.shape[1] if a.ndim == 2 else 1)
                    raise FormatError(path, f"{name}: pair {row} names node {int(flat[i])}, out of range "
                                            f"[0, {num_nodes})")
        if num_relations and pos is not None and link_name(split, "edge_type") not in links:
            raise FormatError(path, f"{link_name(split, 'edge')} has no {link_name(split, 'edge_type')}: the graph "
                                    f"has {num_relations} relations, every pair must name one")


def edges_in_graph(path, indptr: np.ndarray, indices: np.ndarray, edge_type: np.ndarray | None, src: np.ndarray,
                   dst: np.ndarray, typ: np.ndarray | None) -> np.ndarray:
    """bool [M]: whether the graph (in-edge CSR, rows sorted by source then relation) has the edge src -> dst (of
    relation ``typ`` when typed). Binary search in the keys ``target * N + source`` (sorted, as the rows are)."""
    n = len(indptr) - 1
    if len(src) == 0 or len(indices) == 0:
        return np.zeros(len(src), dtype=bool)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    key = rows * n + indices
    want = dst.astype(np.int64) * n + src.astype(np.int64)
    if edge_type is not None and typ is not None:
        r = int(max(int(edge_type.max()), int(typ.max()))) + 1
        if n and (n * n) > (2**62) // r:
            raise FormatError(path, "too many nodes and relations to check held-out triples (N^2 R >= 2^62)")
        key = key * r + edge_type
        want = want * r + typ.astype(np.int64)
    at = np.minimum(np.searchsorted(key, want), len(key) - 1)
    return key[at] == want


def check_no_leakage(path, indptr, indices, edge_type, links: dict, symmetric: bool,
                     relation_inverse: np.ndarray | None = None) -> None:
    """FormatError naming the first held-out (val or test) pair that is also an edge of the message-passing graph:
    as given, reversed in a symmetric graph, or reversed with its inverse relation."""
    for split in HELD_OUT:
        pos = links.get(link_name(split, "edge"))
        if pos is None or len(pos) == 0:
            continue
        typ = links.get(link_name(split, "edge_type"))
        s, d = pos[:, 0], pos[:, 1]
        checks = [("", s, d, typ)]
        if symmetric:
            checks.append((" reversed", d, s, typ))
        if relation_inverse is not None and typ is not None:
            inv = relation_inverse[typ]
            has = inv >= 0
            checks.append((" reversed with its inverse relation", d[has], s[has], inv[has]))
        for how, a, b, t in checks:
            hit = edges_in_graph(path, indptr, indices, edge_type, a, b, t)
            if hit.any():
                i = int(np.argmax(hit))
                row = i if how != " reversed with its inverse relation" else int(np.flatnonzero(has)[i])
                rel = f" (relation {int(typ[row])})" if typ is not None else ""
                raise FormatError(path, f"{link_name(split, 'edge')}: pair {row} (node {int(pos[row, 0])} -> node "
                                        f"{int(pos[row, 1])}{rel}) is{how} also an edge of the message-passing "
                                        "graph: a held-out edge must not be trained on (leakage)")
