"""``graph.h5``: one whole graph (CSR of in-edges, features, labels, split masks). See docs/FORMAT.md."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .atomic import atomic_file
from .checksums import IncrementalSha256, array_sha256, dataset_sha256
from .errors import H5_READ_ERRORS, FormatError, check_regular_file, unreadable
from .features import check_narrowed, feature_dtype_attr, narrow, stored_dtype, widen
from .limits import LargeFeatures, check_finite_features
from .links import LINK_NAMES, check_edge_types, check_links, check_no_leakage, check_typed_rows
from .schema import (FORMAT_VERSION, GRAPH_FORMAT, STREAM_BYTES, as_int64, attr_kind, h5_attr_str, index_dtype,
                     labels_dtype, row_chunks, supported_version, version_refused)

MASKS = ("train_mask", "val_mask", "test_mask")
SELF_LOOP_POLICIES = ("keep", "drop", "add")
#: required attributes besides format and version, by kind (docs/FORMAT.md)
INT_ATTRS = ("num_nodes", "num_edges", "feature_dim", "num_classes")
BOOL_ATTRS = ("symmetric",)
STR_ATTRS = ("self_loops", "source")


@dataclass
class Graph:
    """A whole graph in memory. Row v of the CSR lists the sources of the edges into v."""

    indptr: np.ndarray        # int64 [N+1]
    indices: np.ndarray       # int32/int64 [E]
    features: np.ndarray | None   # [N, F] as stored (feature_dtype); None when left in the file (features=False)
    labels: np.ndarray        # int64 [N], -1 = unlabelled; multi-label: int8 [N, C] of 0/1, -1 = unknown
    train_mask: np.ndarray    # bool [N]
    val_mask: np.ndarray      # bool [N]
    test_mask: np.ndarray     # bool [N]
    attrs: dict
    orig_ids: np.ndarray | None = None  # int64 [N]: the input's own node ID for each row, if remapped
    edge_type: np.ndarray | None = None   # int [E]: relation of each CSR edge (None: one edge type)
    links: dict | None = None             # {link dataset name (links.LINK_NAMES): int array}: link splits
    relation_names: list | None = None    # [R] str
    relation_inverse: np.ndarray | None = None  # int64 [R]: the relation each one inverts, -1 for none
    entity_names: list | None = None      # [N] str: the input's name of each node (triple files)
    node_type: np.ndarray | None = None   # int [N]: type of each node (None: one node type)
    node_type_names: list | None = None   # [T] str
    node_type_feature_dim: np.ndarray | None = None  # int64 [T]: leading feature columns each type uses

    @property
    def num_node_types(self) -> int:
        """T: the number of node types (0 when untyped)."""
        return int(self.attrs.get("num_node_types", 0))

    @property
    def num_relations(self) -> int:
        """R: the number of edge types (0 when untyped)."""
        return int(self.attrs.get("num_relations", 0))

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        return int(self.indptr[-1])

    @property
    def feature_dtype(self) -> str:
        """float32, float16 or bfloat16 (held as uint16): the dtype ``features`` are stored in (features.py)."""
        return self.attrs.get("feature_dtype", "float32")


#: text datasets: UTF-8, one name a line (a name holds no newline), as uint8 bytes (checksummed like any array)
NAME_DATASETS = ("relation_names", "entity_names", "node_type_names")
#: node types (optional): type of each node, and the feature columns each type uses
NODE_TYPE_DATASETS = ("node_type", "node_type_feature_dim")


def encode_names(names) -> np.ndarray:
    text = "\n".join(str(x) for x in names)
    if any("\n" in str(x) for x in names):
        raise ValueError("a name may not contain a newline")
    return np.frombuffer(text.encode(), dtype=np.uint8).copy()


def decode_names(path, name: str, a: np.ndarray, count: int) -> list:
    names = bytes(np.asarray(a, dtype=np.uint8)).decode("utf-8", errors="strict").split("\n") if count else []
    if len(names) != count:
        raise FormatError(path, f"{name} holds {len(names)} names, expected {count}")
    return names


def check_csr(path, indptr: np.ndarray, indices: np.ndarray, num_cols: int, what: str = "CSR") -> None:
    """Raise FormatError unless indptr is monotone from 0 to len(indices) and every index is in range."""
    if indptr.ndim != 1 or len(indptr) < 1 or indptr[0] != 0:
        raise FormatError(path, f"{what}: indptr must start at 0")
    if indptr[-1] != len(indices):
        raise FormatError(path, f"{what}: indptr ends at {int(indptr[-1])} but there are {len(indices)} indices")
    if len(indptr) > 1 and np.any(np.diff(indptr) < 0):
        raise FormatError(path, f"{what}: indptr is not non-decreasing")
    if len(indices):
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= num_cols:
            bad = lo if lo < 0 else hi
            raise FormatError(path, f"{what}: column index {bad} out of range [0, {num_cols})")


def first_unsorted_row(indptr: np.ndarray, down: np.ndarray) -> tuple[int, int] | None:
    """(row, position of its entry) of the first CSR entry out of order after the entry before it in the same row,
    or None. ``down[i]`` [E-1, bool, consumed]: entry i+1 is out of order after entry i (the caller's order, e.g.
    ``indices[1:] < indices[:-1]``: equal columns, a duplicate edge's copies, are in order); the pairs that straddle
    two rows are left out here. Vectorised, O(E), no loop over rows."""
    starts = indptr[1:-1]
    starts = starts[(starts > 0) & (starts <= len(down))]
    down[starts - 1] = False               # entry i+1 begins a row: no order to keep with entry i
    if not down.any():
        return None
    pos = int(np.argmax(down)) + 1
    return int(np.searchsorted(indptr, pos, side="right")) - 1, pos


def check_sorted_rows(path, indptr: np.ndarray, indices: np.ndarray, what: str = "graph CSR",
                      first_row: int = 0) -> None:
    """FormatError naming the first row of a CSR whose sources (``indices``, checked in range) are not in
    ascending order, as docs/FORMAT.md keeps them (duplicate edges, adjacent, are allowed). ``first_row``: the
    file's row of the CSR's row 0 (a slice of a graph's rows)."""
    bad = first_unsorted_row(indptr, indices[1:] < indices[:-1]) if len(indices) > 1 else None
    if bad is not None:
        r, pos = bad
        raise FormatError(path, f"{what}: the sources of row {first_row + r} are not in ascending order (node "
                                f"{int(indices[pos - 1])} before node {int(indices[pos])}; the format keeps every "
                                "row sorted)")


def check_features(path, ds, orig_ids: np.ndarray | None = None, feature_dtype: str = "float32") -> None:
    """:func:`check_finite_features` over a whole features dataset ``ds`` (h5py, or an array) of the stored dtype
    ``feature_dtype``, read in row blocks, never whole; then the warning of :class:`LargeFeatures` if some reach
    2^64 in magnitude (``orig_ids``: the graph's, to name the first such node's original ID too)."""
    step = max(1, STREAM_BYTES // max(1, ds.dtype.itemsize * (ds.shape[1] if ds.ndim == 2 else 1)))
    large = LargeFeatures()
    for lo in range(0, ds.shape[0] if ds.ndim else 0, step):
        with np.errstate(over="ignore"):
            block = widen(ds[lo:lo + step], feature_dtype)
        if not np.isfinite(large.scan(block, lo)):   # (one pass when they are finite)
            stored = np.asarray(ds[lo:lo + step])     # as stored: the value it names (bfloat16: widened)
            check_finite_features(path, block if feature_dtype == "bfloat16" else stored, lo)
    large.warn(path, orig_ids)


def labelled(labels: np.ndarray) -> np.ndarray:
    """bool [N]: the nodes with a label (multi-label: with at least one known entry)."""
    return labels >= 0 if labels.ndim == 1 else (labels >= 0).any(axis=1)


def check_node_data(path, num_nodes: int, labels, num_classes: int, masks: dict) -> None:
    """Labels (one class per node in [-1, C), or multi-label [N, C] in {-1, 0, 1}) and split masks (disjoint,
    on labelled nodes only)."""
    if labels.ndim == 2:
        if labels.shape != (num_nodes, num_classes):
            raise FormatError(path, f"multi-label labels have shape {labels.shape}, expected ({num_nodes}, "
                                    f"{num_classes})")
        if labels.size and (labels.min() < -1 or labels.max() > 1):
            raise FormatError(path, f"multi-label labels out of range: found {int(labels.min())}..{int(labels.max())}"
                                    " (0 or 1 per class, -1 unknown)")
    elif labels.shape != (num_nodes,):
        raise FormatError(path, f"labels have shape {labels.shape}, expected ({num_nodes},) or ({num_nodes}, "
                                f"{num_classes}) for multi-label ones")
    elif num_nodes and (labels.min() < -1 or labels.max() >= num_classes):
        raise FormatError(path, f"labels out of range [-1, {num_classes}): found "
                                f"{int(labels.min())}..{int(labels.max())}")
    total = np.zeros(num_nodes, dtype=np.int8)
    for name, m in masks.items():
        if m.shape != (num_nodes,):
            raise FormatError(path, f"{name} has shape {m.shape}, expected ({num_nodes},)")
        total += m.astype(np.int8)
    if np.any(total > 1):
        raise FormatError(path, f"split masks overlap on {int((total > 1).sum())} nodes")
    known = labelled(labels)
    for name, m in masks.items():
        if np.any(m & ~known):
            raise FormatError(path, f"{name} contains {int((m & ~known).sum())} unlabelled nodes")


class GraphWriter:
    """Write a graph.h5 atomically; features may arrive in row blocks (for generators that stream).

    >>> with GraphWriter(path, num_nodes=N, feature_dim=F, num_classes=C, source="npz") as w:
    ...     w.write_csr(indptr, indices)
    ...     for start, block in blocks: w.write_features(start, block)
    ...     w.write_nodes(labels, train_mask, val_mask, test_mask)

    Everything is validated as it is written (index bounds, finite features, label range, masks);
    on any error the temporary file is deleted and the output never appears.
    """

    def __init__(self, path, *, num_nodes: int, feature_dim: int, num_classes: int, source: str,
                 symmetric: bool = False, self_loops: str = "keep", force: bool = False,
                 extra_attrs: dict | None = None, feature_dtype: str = "float32", allow_underflow: bool = False):
        if self_loops not in SELF_LOOP_POLICIES:
            raise ValueError(f"self_loops must be one of {SELF_LOOP_POLICIES}")
        self.path = Path(path)
        self.n, self.f, self.c = int(num_nodes), int(feature_dim), int(num_classes)
        self.feature_dtype = feature_dtype_attr(self.path, feature_dtype)
        self.attrs = dict(format=GRAPH_FORMAT, version=FORMAT_VERSION, num_nodes=self.n, feature_dim=self.f,
                          num_classes=self.c, symmetric=bool(symmetric), self_loops=self_loops, source=str(source),
                          feature_dtype=self.feature_dtype)
        self.attrs.update(extra_attrs or {})
        self.force = force
        self._feat_next = 0
        self._feat_hash = IncrementalSha256()
        self._large = LargeFeatures()
        # non-zero features the 16-bit dtype stores as zero: (how many, the first's node, column and value)
        self.allow_underflow = allow_underflow
        self._flushed, self._first_flushed = 0, None
        self._orig_ids = None
        self._done = set()
        self._typed = (None, None)
        self._indptr = self._indices = None

    def __enter__(self):
        self._ctx = atomic_file(self.path, self.force)
        tmp = self._ctx.__enter__()
        try:
            self.h5 = h5py.File(tmp, "w")
            dt = stored_dtype(self.feature_dtype)
            chunk = row_chunks(self.n, dt.itemsize * self.f)
            self.feat = self.h5.create_dataset("features", shape=(self.n, self.f), dtype=dt,
                                               chunks=(chunk, self.f) if chunk and self.f else None)
        except BaseException as e:
            self._ctx.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def __exit__(self, et, ev, tb):
        try:
            if et is None:
                missing = {"csr", "features", "nodes"} - self._done
                if missing:
                    raise FormatError(self.path, f"writer closed without {sorted(missing)}")
                if self._flushed and not self.allow_underflow:
                    r, c, v = self._first_flushed
                    raise FormatError(self.path, f"{self._flushed} non-zero feature values are too small for "
                                                 f"{self.feature_dtype} and would be stored as zero (the first: node "
                                                 f"{r}, column {c}: {v:g}): keep them as float32 (--feature-dtype "
                                                 "float32), scale them, or accept that with --allow-underflow")
                self.feat.attrs["sha256"] = self._feat_hash.hexdigest()
                for k, v in self.attrs.items():
                    self.h5.attrs[k] = v
            self.h5.close()
        except BaseException as e:
            try:
                self.h5.close()
            except Exception:      # the first close failed part-way (disk full, quota): the file is discarded anyway
                pass
            if et is not None and isinstance(e, Exception):
                return self._ctx.__exit__(et, ev, tb)     # a write failed first: report it, not the close's echo
            self._ctx.__exit__(type(e), e, e.__traceback__)
            raise
        suppress = self._ctx.__exit__(et, ev, tb)
        if et is None:   # written: now it is the file that holds them
            self._large.warn(self.path, self._orig_ids)
        return suppress

    def _put(self, name, data):
        ds = self.h5.create_dataset(name, data=data)
        ds.attrs["sha256"] = array_sha256(data)

    def write_csr(self, indptr: np.ndarray, indices: np.ndarray) -> None:
        indptr = np.asarray(indptr, dtype=np.int64)
        if len(indptr) != self.n + 1:
            raise FormatError(self.path, f"indptr has {len(indptr)} entries, expected {self.n + 1}")
        check_csr(self.path, indptr, indices, self.n, "graph CSR")
        check_sorted_rows(self.path, indptr, np.asarray(indices))
        self._put("indptr", indptr)
        self._put("indices", np.asarray(indices, dtype=index_dtype(self.n)))
        self.attrs["num_edges"] = int(indptr[-1])
        self._indptr, self._indices = indptr, np.asarray(indices)   # (for the edge types' and links' checks)
        self._done.add("csr")

    def write_csr_rows(self, indptr: np.ndarray, rows) -> None:
        """The CSR as :meth:`write_csr` writes it (same datasets, dtypes, layout and checksums), with its indices
        arriving in consecutive row blocks ``(r0, r1, indices of rows r0..r1-1)`` (an out-of-core build): each
        block is checked (range, sorted rows) as it is written, never the whole edge list at once."""
        indptr = np.asarray(indptr, dtype=np.int64)
        if len(indptr) != self.n + 1:
            raise FormatError(self.path, f"indptr has {len(indptr)} entries, expected {self.n + 1}")
        if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
            raise FormatError(self.path, "graph CSR: indptr must start at 0 and be non-decreasing")
        self._put("indptr", indptr)
        idt = index_dtype(self.n)
        ds = self.h5.create_dataset("indices", shape=(int(indptr[-1]),), dtype=idt)
        digest, nxt = IncrementalSha256(), 0
        for r0, r1, cols in rows:
            cols = np.asarray(cols, dtype=idt)
            a, b = int(indptr[r0]), int(indptr[r1])
            if r0 != nxt or b - a != len(cols):
                raise ValueError(f"CSR row blocks must arrive in order and match indptr: rows {r0}..{r1} with "
                                 f"{len(cols)} indices, expected row {nxt} and {b - a}")
            local = indptr[r0:r1 + 1] - a
            check_csr(self.path, local, cols, self.n, "graph CSR")
            check_sorted_rows(self.path, local, cols, first_row=r0)
            ds[a:b] = cols
            digest.update(cols)
            nxt = r1
        if nxt != self.n and int(indptr[-1]) != int(indptr[nxt]):
            raise ValueError(f"CSR row blocks end at row {nxt}, expected {self.n}")
        ds.attrs["sha256"] = digest.hexdigest()
        self.attrs["num_edges"] = int(indptr[-1])
        self._done.add("csr")

    def write_edge_types(self, edge_type: np.ndarray, num_relations: int, relation_names=None,
                         relation_inverse=None) -> None:
        """The relation of each CSR edge (after :meth:`write_csr`; rows sorted by source, then relation), R and
        optionally the relations' names and inverses."""
        if self._indptr is None:   # (the out-of-core write_csr_rows keeps no CSR to check them against)
            raise ValueError("write_edge_types needs the CSR written by write_csr first")
        edge_type = np.asarray(edge_type)
        R = int(num_relations)
        if R < 1:
            raise FormatError(self.path, f"num_relations must be >= 1 with edge types, got {R}")
        check_edge_types(self.path, edge_type, self.attrs["num_edges"], R)
        check_typed_rows(self.path, self._indptr, self._indices, edge_type)
        self._put("edge_type", edge_type.astype(np.int32 if R < 2**31 else np.int64))
        self.attrs["num_relations"] = R
        if relation_names is not None:
            if len(relation_names) != R:
                raise FormatError(self.path, f"{len(relation_names)} relation names for {R} relations")
            self._put("relation_names", encode_names(relation_names))
        if relation_inverse is not None:
            inv = np.asarray(relation_inverse, dtype=np.int64)
            if inv.shape != (R,) or (R and (inv.min() < -1 or inv.max() >= R)):
                raise FormatError(self.path, f"relation_inverse must be [{R}] relation IDs or -1")
            self._put("relation_inverse", inv)
        self._typed = edge_type, inv if relation_inverse is not None else None

    def write_node_types(self, node_type, num_node_types: int, names=None, feature_dim=None) -> None:
        """The type of each node in [0, T), optionally the types' names and their feature widths (the leading
        columns of ``features`` a node of that type uses; the others are zero)."""
        node_type, T = np.asarray(node_type), int(num_node_types)
        check_node_types(self.path, node_type, self.n, T, names, feature_dim, self.f)
        self._put("node_type", node_type.astype(np.int32))
        self.attrs["num_node_types"] = T
        if names is not None:
            self._put("node_type_names", encode_names(names))
        if feature_dim is not None:
            self._put("node_type_feature_dim", np.asarray(feature_dim, dtype=np.int64))

    def write_entity_names(self, names) -> None:
        if len(names) != self.n:
            raise FormatError(self.path, f"{len(names)} entity names for {self.n} nodes")
        self._put("entity_names", encode_names(names))

    def write_links(self, links: dict) -> None:
        """Link splits (after the CSR and any edge types): {dataset name (links.LINK_NAMES): int array}, checked
        in range and, for val and test, absent from the message-passing graph."""
        if self._indptr is None:   # (the out-of-core write_csr_rows keeps no CSR to check them against)
            raise ValueError("write_links needs the CSR written by write_csr first")
        links = {k: np.asarray(v) for k, v in links.items() if v is not None}
        R = int(self.attrs.get("num_relations", 0))
        check_links(self.path, links, self.n, R)
        et, inv = self._typed
        check_no_leakage(self.path, self._indptr, self._indices, et, links, bool(self.attrs["symmetric"]), inv)
        for k in LINK_NAMES:
            if k in links:
                self._put(k, links[k].astype(np.int64))

    def write_features(self, start: int, block: np.ndarray) -> None:
        """Rows ``start ..`` of the features, of any real dtype, stored as ``feature_dtype`` (narrowed if
        wider: FormatError for a value beyond its range); a bfloat16 block arrives as its uint16 pattern only
        when the graph is bfloat16 (:func:`features.narrow`)."""
        given = np.asarray(block)
        if self.feature_dtype == "bfloat16" and given.dtype == np.uint16:
            given = widen(given, "bfloat16")             # already the stored pattern: exact round trip
        with np.errstate(over="ignore"):
            block = given.astype(np.float32, copy=False)
        if start != self._feat_next:
            raise ValueError(f"feature blocks must arrive in order: got row {start}, expected {self._feat_next}")
        if block.ndim != 2 or block.shape[1] != self.f:
            raise FormatError(self.path, f"feature block has shape {block.shape}, expected (*, {self.f})")
        if start + len(block) > self.n:
            raise FormatError(self.path, f"feature rows ({start + len(block)}+) exceed the number of nodes ({self.n})")
        if not np.isfinite(self._large.scan(block, start)):
            check_finite_features(self.path, given, start)
        if self.feature_dtype != "float32":
            block = narrow(given, self.feature_dtype)
            check_narrowed(self.path, given, block, self.feature_dtype, start)
            flushed = (widen(block, self.feature_dtype) == 0) & (np.asarray(given) != 0)
            if flushed.any():
                if self._first_flushed is None:
                    r, c = (int(i) for i in np.argwhere(flushed)[0])
                    self._first_flushed = (start + r, c, float(given[r, c]))
                self._flushed += int(flushed.sum())
        self.feat[start:start + len(block)] = block
        self._feat_hash.update(block)
        self._feat_next = start + len(block)
        if self._feat_next == self.n:
            self._done.add("features")

    def write_nodes(self, labels, train_mask, val_mask, test_mask, orig_ids=None) -> None:
        """Labels (int [N], or multi-label [N, C] of 0/1 and -1, stored as int8), masks, original IDs."""
        labels = np.asarray(labels)
        labels = labels.astype(labels_dtype(labels.ndim), copy=False)
        masks = {k: np.asarray(m, dtype=bool) for k, m in zip(MASKS, (train_mask, val_mask, test_mask))}
        check_node_data(self.path, self.n, labels, self.c, masks)
        self._put("labels", labels)
        for k, m in masks.items():
            self._put(k, m)
        if orig_ids is not None:
            orig_ids = np.asarray(orig_ids, dtype=np.int64)
            if orig_ids.shape != (self.n,):
                raise FormatError(self.path, f"orig_ids has shape {orig_ids.shape}, expected ({self.n},)")
            self._put("orig_ids", orig_ids)
            self._orig_ids = orig_ids
        self._done.add("nodes")
        if self.n == 0 or self.f == 0:
            self._done.add("features")


def check_node_types(path, node_type: np.ndarray, n: int, T: int, names, feature_dim, f: int) -> None:
    """FormatError unless ``node_type`` is [n] of types in [0, T), with T names and T widths in [0, f] if given."""
    if T < 1:
        raise FormatError(path, f"num_node_types must be >= 1 with node types, got {T}")
    if node_type.shape != (n,) or node_type.dtype.kind not in "iu":
        raise FormatError(path, f"node_type must be integers [{n}], got {node_type.dtype} {list(node_type.shape)}")
    if n and (node_type.min() < 0 or node_type.max() >= T):
        bad = int(np.argmax((node_type < 0) | (node_type >= T)))
        raise FormatError(path, f"node_type: type {int(node_type[bad])} of node {bad} out of range [0, {T})")
    if names is not None and len(names) != T:
        raise FormatError(path, f"{len(names)} node type names for {T} node types")
    if feature_dim is not None:
        d = np.asarray(feature_dim)
        if d.shape != (T,) or (T and (d.min() < 0 or d.max() > f)):
            raise FormatError(path, f"node_type_feature_dim must be [{T}] widths in [0, {f}], got {d.tolist()[:8]}")


def check_graph_attrs(path, attrs) -> None:
    """FormatError naming the file unless every required attribute is present with its declared kind.

    A missing or mistyped attribute used to surface as a bare KeyError / ValueError in the tools.
    """
    for kind, names in (("int", INT_ATTRS), ("bool", BOOL_ATTRS), ("str", STR_ATTRS)):
        for name in names:
            if name not in attrs:
                raise FormatError(path, f"attribute {name!r} is missing")
            value = attrs[name]
            if attr_kind(value) != kind:
                raise FormatError(path, f"attribute {name!r} must be {'an' if kind == 'int' else 'a'} {kind}, "
                                        f"got {value!r:.40}")
            if kind == "int" and value < 0:
                raise FormatError(path, f"attribute {name!r} must be >= 0, got {int(value)}")
            if kind == "int" and value >= 2**63:   # (a uint64 attribute): beyond every int64 the tools compute with
                raise FormatError(path, f"attribute {name!r} must be < 2**63, got {int(value)}")
    policy = h5_attr_str(attrs["self_loops"])
    if policy not in SELF_LOOP_POLICIES:
        raise FormatError(path, f"attribute 'self_loops' is {policy!r}, expected one of {SELF_LOOP_POLICIES}")


def check_dataset_dtypes(path, f: h5py.File) -> None:
    """FormatError unless the datasets have the dtypes of docs/FORMAT.md (checked before anything is read)."""
    for name in ("indptr", "indices", "features", "labels", "orig_ids", *MASKS, "edge_type", "relation_inverse",
                 *NAME_DATASETS, *LINK_NAMES, *NODE_TYPE_DATASETS):
        if name in f and not isinstance(f[name], h5py.Dataset):
            raise FormatError(path, f"{name!r} is a group, expected a dataset")
    for name in ("indptr", "indices", "labels", "orig_ids", "edge_type", "relation_inverse", *NAME_DATASETS,
                 *LINK_NAMES, *NODE_TYPE_DATASETS):
        if name in f and not np.issubdtype(f[name].dtype, np.integer):
            raise FormatError(path, f"dataset {name!r} must be integers, got dtype {f[name].dtype}")
    for name in MASKS:
        if f[name].dtype != np.bool_:
            raise FormatError(path, f"dataset {name!r} must be boolean, got dtype {f[name].dtype}")
    name = feature_dtype_attr(path, f.attrs.get("feature_dtype", "float32"))
    dt = f["features"].dtype     # float32: any floating type, read as float32 (float64 beyond its range refused)
    if dt != stored_dtype(name) and not (name == "float32" and np.issubdtype(dt, np.floating)):
        raise FormatError(path, f"dataset 'features' has dtype {f['features'].dtype}, but feature_dtype is {name} "
                                f"(stored as {stored_dtype(name)})")


def open_graph(path) -> h5py.File:
    """Open a graph.h5 read-only after checking its format name, version, attributes and dataset dtypes.

    The datasets' contents are checked by :func:`load_graph`.
    """
    path = Path(path)
    if not path.exists():
        raise FormatError(path, "no such file")
    if path.is_dir():   # (h5py's error for it is two lines: "file read failed: time = ...\n, filename = ...")
        raise FormatError(path, "is a directory, expected a graph file (graph.h5, from g3-prepare)")
    check_regular_file(path, "graph file")   # (a FIFO or a device would hang h5py)
    try:
        f = h5py.File(path, "r")
    except H5_READ_ERRORS as e:
        raise unreadable(path, e) from None
    try:
        fmt = h5_attr_str(f.attrs.get("format", ""))
        if fmt != GRAPH_FORMAT:
            raise FormatError(path, f"format is {fmt!r}, expected {GRAPH_FORMAT!r}")
        ver = f.attrs.get("version", -1)
        if not supported_version(ver):
            raise FormatError(path, version_refused(ver, FORMAT_VERSION))
        check_graph_attrs(path, f.attrs)
        for name in ("indptr", "indices", "features", "labels", *MASKS):
            if name not in f:
                raise FormatError(path, f"dataset {name!r} is missing")
        check_dataset_dtypes(path, f)
        if ("edge_type" in f) != ("num_relations" in f.attrs):
            raise FormatError(path, "edge_type and the attribute num_relations must come together")
        if "num_relations" in f.attrs and (attr_kind(f.attrs["num_relations"]) != "int"
                                           or not 1 <= f.attrs["num_relations"] < 2**31):
            raise FormatError(path, f"attribute 'num_relations' must be an integer in [1, 2^31), got "
                                    f"{f.attrs['num_relations']!r:.40}")
        if ("node_type" in f) != ("num_node_types" in f.attrs):
            raise FormatError(path, "node_type and the attribute num_node_types must come together")
        if "num_node_types" in f.attrs and (attr_kind(f.attrs["num_node_types"]) != "int"
                                            or not 1 <= f.attrs["num_node_types"] < 2**31):
            raise FormatError(path, f"attribute 'num_node_types' must be an integer in [1, 2^31), got "
                                    f"{f.attrs['num_node_types']!r:.40}")
    except BaseException as e:
        f.close()
        if isinstance(e, H5_READ_ERRORS):
            raise unreadable(path, e) from None
        raise
    return f


def verify_checksums(path, f: h5py.File) -> None:
    for name, ds in f.items():
        want = ds.attrs.get("sha256")
        if want is None:
            raise FormatError(path, f"dataset {name!r} has no sha256 attribute")
        try:
            got = dataset_sha256(ds)
        except H5_READ_ERRORS as e:
            raise FormatError(path, f"dataset {name!r} cannot be read (truncated or corrupt?): {e}") from None
        if got != h5_attr_str(want):
            raise FormatError(path, f"checksum mismatch in dataset {name!r} (file corrupt)")


#: graph attributes that are part of its identity (the rest, e.g. ``source``, only describe where it came from)
FINGERPRINT_ATTRS = ("num_nodes", "num_edges", "feature_dim", "num_classes")


def graph_fingerprint(path) -> str:
    """SHA-256 of the graph's content: ``name=value`` lines for the datasets' own ``sha256`` attributes (so it
    costs no read of the data) and :data:`FINGERPRINT_ATTRS`, in that order, names sorted. Two graph files with the
    same datasets and those attributes have the same fingerprint. ``g3-partition`` records it in ``meta.json``
    (``graph_sha256``); checkpoints compare it to resume on another partition of the same graph. Check the
    file first (:func:`load_graph`)."""
    path = Path(path)
    with open_graph(path) as f:
        try:
            lines = [f"{name}={h5_attr_str(f[name].attrs.get('sha256', ''))}\n" for name in sorted(f)]
            lines += [f"{k}={int(f.attrs[k])}\n" for k in FINGERPRINT_ATTRS]
        except H5_READ_ERRORS as e:
            raise unreadable(path, e) from None
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def load_graph(path, verify: bool = True, features: bool = True) -> Graph:
    """Read a whole graph.h5 into memory, validating checksums, shapes, index bounds and finite features (with
    the warning of :func:`check_features` for features too large for float32 training).

    ``features=False`` leaves the features in the file (``Graph.features`` is None; their checksum and shape are
    still checked, their values are not): for tools that read them block by block, e.g. ``g3-partition`` writing
    the parts, which check them as they read them."""
    path = Path(path)
    with open_graph(path) as f:
        try:   # attribute messages (the datasets' sha256, the graph's own) can be damaged too
            if verify:
                verify_checksums(path, f)
            attrs = {k: (h5_attr_str(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v)
                     for k, v in f.attrs.items()}
            feature_shape = f["features"].shape
        except H5_READ_ERRORS as e:
            raise unreadable(path, e) from None
        try:
            g = Graph(indptr=f["indptr"][:], indices=f["indices"][:],
                      features=f["features"][:] if features else None,
                      labels=f["labels"][:], train_mask=f["train_mask"][:], val_mask=f["val_mask"][:],
                      test_mask=f["test_mask"][:], attrs=attrs,
                      orig_ids=f["orig_ids"][:] if "orig_ids" in f else None,
                      edge_type=f["edge_type"][:] if "edge_type" in f else None,
                      links={k: f[k][()] for k in LINK_NAMES if k in f} or None,
                      relation_inverse=f["relation_inverse"][:] if "relation_inverse" in f else None,
                      node_type=f["node_type"][:] if "node_type" in f else None,
                      node_type_feature_dim=f["node_type_feature_dim"][:] if "node_type_feature_dim" in f else None)
            names = {k: f[k][()] for k in NAME_DATASETS if k in f}
        except H5_READ_ERRORS as e:
            raise FormatError(path, f"cannot read datasets (truncated or corrupt?): {e}") from None
    # any integer type as int64 (indices: int32 too); the checks below would wrap around in an unsigned type
    g.indptr = as_int64(path, "indptr", g.indptr)
    if g.labels.ndim == 1:   # (multi-label ones stay int8, checked in range below)
        g.labels = as_int64(path, "labels", g.labels)
    g.indices = as_int64(path, "indices", g.indices, keep_int32=True)
    if g.orig_ids is not None:
        g.orig_ids = as_int64(path, "orig_ids", g.orig_ids)
    n = int(attrs["num_nodes"])
    if len(g.indptr) != n + 1:
        raise FormatError(path, f"indptr has {len(g.indptr)} entries, num_nodes is {n}")
    if g.orig_ids is not None and g.orig_ids.shape != (n,):
        raise FormatError(path, f"orig_ids has shape {g.orig_ids.shape}, expected ({n},)")
    check_csr(path, g.indptr, g.indices, n, "graph CSR")
    check_sorted_rows(path, g.indptr, g.indices)
    if int(attrs["num_edges"]) != g.num_edges:
        raise FormatError(path, f"num_edges attribute {attrs['num_edges']} != {g.num_edges} stored edges")
    if feature_shape != (n, int(attrs["feature_dim"])):
        raise FormatError(path, f"features have shape {feature_shape}, expected ({n}, {attrs['feature_dim']})")
    check_node_data(path, n, g.labels, int(attrs["num_classes"]),
                    {"train_mask": g.train_mask, "val_mask": g.val_mask, "test_mask": g.test_mask})
    _check_types_and_links(path, g, names)
    if features:
        check_features(path, g.features, g.orig_ids, g.feature_dtype)
    return g


def _check_types_and_links(path, g: Graph, names: dict) -> None:
    """Edge types (in range, rows sorted by source then relation), relation and entity names, link splits (in
    range, no held-out pair in the message-passing graph), as :class:`GraphWriter` checks them."""
    R = g.num_relations
    if g.edge_type is not None:
        check_edge_types(path, g.edge_type, g.num_edges, R)
        g.edge_type = as_int64(path, "edge_type", g.edge_type, keep_int32=True)
        check_typed_rows(path, g.indptr, g.indices, g.edge_type)
    if g.relation_inverse is not None:
        g.relation_inverse = as_int64(path, "relation_inverse", g.relation_inverse)
        if g.relation_inverse.shape != (R,) or (R and (g.relation_inverse.min() < -1 or g.relation_inverse.max() >= R)):
            raise FormatError(path, f"relation_inverse must be [{R}] relation IDs or -1")
    if "relation_names" in names:
        g.relation_names = decode_names(path, "relation_names", names["relation_names"], R)
    if "entity_names" in names:
        g.entity_names = decode_names(path, "entity_names", names["entity_names"], g.num_nodes)
    if g.node_type is not None:
        T = g.num_node_types
        if "node_type_names" in names:
            g.node_type_names = decode_names(path, "node_type_names", names["node_type_names"], T)
        check_node_types(path, g.node_type, g.num_nodes, T, g.node_type_names, g.node_type_feature_dim,
                         int(g.attrs["feature_dim"]))
        g.node_type = as_int64(path, "node_type", g.node_type)
        if g.node_type_feature_dim is not None:
            g.node_type_feature_dim = as_int64(path, "node_type_feature_dim", g.node_type_feature_dim)
    elif any(k in names for k in ("node_type_names",)) or g.node_type_feature_dim is not None:
        raise FormatError(path, "node type names or widths without node_type")
    if g.links:
        g.links = {k: as_int64(path, k, v) for k, v in g.links.items()}
        check_links(path, g.links, g.num_nodes, R)
        check_no_leakage(path, g.indptr, g.indices, g.edge_type, g.links, bool(g.attrs["symmetric"]),
                         g.relation_inverse)


def link_counts(links: dict | None) -> dict:
    """{split: {key: count}} of a graph's or partition's link arrays: pairs, shared negatives, negatives per
    positive (meta.json ``links``, g3-inspect)."""
    from .links import KEYS, SPLITS, link_name
    out = {}
    for s in SPLITS:
        got = {}
        for k in KEYS:
            a = (links or {}).get(link_name(s, k))
            if a is not None and k != "edge_type":
                got[k] = int(a.shape[1] if k == "target_node_neg" else len(a))
        if got:
            out[s] = got
    return out


def graph_summary(g: Graph) -> dict:
    a = g.attrs
    return dict(num_nodes=g.num_nodes, num_edges=g.num_edges, feature_dim=int(a["feature_dim"]),
                num_classes=int(a["num_classes"]), symmetric=bool(a["symmetric"]), self_loops=a["self_loops"],
                source=a["source"], train=int(g.train_mask.sum()), val=int(g.val_mask.sum()),
                test=int(g.test_mask.sum()), labelled=int(labelled(g.labels).sum()),
                **({"num_relations": g.num_relations} if g.num_relations else {}),
                **({"num_node_types": g.num_node_types} if g.num_node_types else {}),
                **({"links": link_counts(g.links)} if g.links else {}))


def write_graph(path, g: Graph, force: bool = False) -> None:
    """Write an in-memory Graph (all at once)."""
    a = g.attrs
    extra = {k: v for k, v in a.items() if k not in ("format", "version", "num_nodes", "num_edges", "feature_dim",
                                                       "num_classes", "symmetric", "self_loops", "source",
                                                       "feature_dtype", "num_relations", "num_node_types")}
    with GraphWriter(path, num_nodes=g.num_nodes, feature_dim=g.features.shape[1], num_classes=int(a["num_classes"]),
                     source=a.get("source", "unknown"), symmetric=bool(a.get("symmetric", False)),
                     self_loops=a.get("self_loops", "keep"), force=force, extra_attrs=extra,
                     feature_dtype=g.feature_dtype) as w:
        w.write_csr(g.indptr, g.indices)
        if g.edge_type is not None:
            w.write_edge_types(g.edge_type, g.num_relations, g.relation_names, g.relation_inverse)
        if g.entity_names is not None:
            w.write_entity_names(g.entity_names)
        if g.node_type is not None:
            w.write_node_types(g.node_type, g.num_node_types, g.node_type_names, g.node_type_feature_dim)
        if g.links:
            w.write_links(g.links)
        w.write_features(0, g.features)
        w.write_nodes(g.labels, g.train_mask, g.val_mask, g.test_mask, g.orig_ids)

