"""One rank's contiguous slice of a graph.h5's rows, read and validated without reading the rest of the graph.

Rank r of R reads rows ``bounds[r] .. bounds[r+1]-1``: ``indptr`` of those rows (one entry more), the
``indices`` they point at, and their features, labels and masks. Every check of ``load_graph`` is made on the
slice, naming the file and the graph's row: CSR bounds and order, index range, labels and splits, finite
features. The datasets' checksums are verified too, the datasets dealt out among the ranks (each one read by
one rank, block by block).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from g3mpi.format import FormatError, open_graph
from g3mpi.format.links import LINK_NAMES
from g3mpi.format.checksums import dataset_sha256
from g3mpi.format.errors import H5_READ_ERRORS, unreadable
from g3mpi.format.features import feature_dtype_attr, stored_dtype, widen
from g3mpi.format.limits import LargeFeatures, check_finite_features
from g3mpi.format.schema import STREAM_BYTES, as_int64, h5_attr_str, index_dtype
from g3mpi.format.graph import MASKS, check_node_data, check_sorted_rows


@dataclass
class GraphSlice:
    path: Path
    attrs: dict
    num_nodes: int
    num_edges: int
    bounds: np.ndarray       # [R+1] every rank's first row
    lo: int                  # this rank's rows lo .. hi-1
    hi: int
    indptr: np.ndarray       # int64 [hi-lo+1], from 0
    indices: np.ndarray      # int32 (as stored where N < 2^31) or int64 [indptr[-1]], sources (global row IDs)
    features: np.ndarray | None   # [hi-lo, F] as stored (None: checked, not kept; see SliceFeatures)
    labels: np.ndarray       # int64 [hi-lo]; multi-label: int8 [hi-lo, C]
    masks: dict              # name -> bool [hi-lo]

    @property
    def num_rows(self) -> int:
        return self.hi - self.lo


def row_of(indptr: np.ndarray, pos: int, lo: int) -> int:
    """The graph row of the slice's edge ``pos``."""
    return lo + int(np.searchsorted(indptr, pos, side="right")) - 1


def read_slice(path, bounds: np.ndarray, rank: int, verify: bool = True, features: bool = True) -> GraphSlice:
    """Rank ``rank``'s rows of the graph at ``path`` (``bounds``: :func:`~g3mpi.mpi.collectives.rank_bounds`), checked;
    FormatError naming the file (and the row) on any problem. ``verify``: check the checksums of the datasets
    this rank is dealt (``rank``, ``rank + R``, ... of their sorted names). ``features=False``: the features are
    checked but not kept (``features`` None), to be read when needed with :class:`SliceFeatures`."""
    path = Path(path)
    with open_graph(path) as f:
        try:
            return _read(path, f, bounds, rank, verify, features)
        except H5_READ_ERRORS as e:
            raise unreadable(path, e) from None


class SliceFeatures:
    """The features of some rows of a slice, read from its graph file (which :func:`read_slice` checked) when they
    are asked for, so that a rank never holds its whole slice's features. A context manager: the file stays open
    between reads; a slice that holds its features (``features`` not None) is served from them."""

    def __init__(self, sl: GraphSlice):
        self.sl, self.file, self.ds = sl, None, None

    def __enter__(self):
        if self.sl.features is None:
            self.file = open_graph(self.sl.path)
            self.ds = self.file["features"]
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.file.close()
            self.file = self.ds = None

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """[len(idx), F] as stored: the features of the slice's rows ``idx`` (slice-local, unique, any order);
        FormatError naming the file if it cannot be read."""
        if self.ds is None:
            return self.sl.features[idx]
        name = feature_dtype_attr(self.sl.path, self.file.attrs.get("feature_dtype", "float32"))
        out = np.empty((len(idx), self.ds.shape[1]), dtype=stored_dtype(name))
        if len(idx):
            order = np.argsort(idx, kind="stable")
            try:
                with np.errstate(over="ignore"):
                    out[order] = self.ds[self.sl.lo + idx[order]]   # (h5py reads increasing indices only)
            except H5_READ_ERRORS as e:
                raise unreadable(self.sl.path, e) from None
        return out


def _read(path, f, bounds, rank, verify, keep_features=True) -> GraphSlice:
    attrs = {k: (h5_attr_str(v) if isinstance(v, (bytes, str)) else v.item() if hasattr(v, "item") else v)
             for k, v in f.attrs.items()}
    n, e, width = int(attrs["num_nodes"]), int(attrs["num_edges"]), int(attrs["feature_dim"])
    if bounds[-1] != n:
        raise FormatError(path, f"the ranks' rows end at {int(bounds[-1])}, the graph has {n} nodes")
    typed = [k for k in ("edge_type", "node_type", *LINK_NAMES) if k in f]
    if typed:   # (the parallel writer does not carry them: a partition without them would lose them silently)
        what = {"edge_type": "edge types", "node_type": "node types"}.get(typed[0], "link splits")
        raise FormatError(path, f"has {what}, which g3-partition "
                                "--method stream does not partition: choose another --method")
    labels_shape = (n, int(attrs["num_classes"])) if f["labels"].ndim == 2 else (n,)
    shapes = dict(indptr=(n + 1,), indices=(e,), features=(n, width), labels=labels_shape,
                  **{m: (n,) for m in MASKS}, **({"orig_ids": (n,)} if "orig_ids" in f else {}))
    for name, want in shapes.items():
        if f[name].shape != want:
            raise FormatError(path, f"{name} has shape {f[name].shape}, expected {want}")
    if verify:
        names = sorted(f)
        for name in names[rank::len(bounds) - 1]:
            want = f[name].attrs.get("sha256")
            if want is None:
                raise FormatError(path, f"dataset {name!r} has no sha256 attribute")
            if dataset_sha256(f[name]) != h5_attr_str(want):
                raise FormatError(path, f"checksum mismatch in dataset {name!r} (file corrupt)")
    lo, hi = int(bounds[rank]), int(bounds[rank + 1])
    indptr = as_int64(path, "indptr", f["indptr"][lo:hi + 1])
    if lo == 0 and indptr[0] != 0:
        raise FormatError(path, "graph CSR: indptr must start at 0")
    if hi == n and indptr[-1] != e:
        raise FormatError(path, f"graph CSR: indptr ends at {int(indptr[-1])} but there are {e} indices")
    down = np.flatnonzero(np.diff(indptr) < 0)
    if len(down) or indptr[0] < 0 or indptr[-1] > e:
        where = f"at row {lo + int(down[0])}" if len(down) else f"in rows {lo}..{hi - 1} (outside [0, {e}])"
        raise FormatError(path, f"graph CSR: indptr is not non-decreasing {where}")
    indices = as_int64(path, "indices", f["indices"][indptr[0]:indptr[-1]], keep_int32=True)
    indptr = indptr - indptr[0]
    bad = np.flatnonzero((indices < 0) | (indices >= n))
    if len(bad):
        pos = int(bad[0])
        raise FormatError(path, f"graph CSR: row {row_of(indptr, pos, lo)} has source {int(indices[pos])} out of "
                                f"range [0, {n})")
    check_sorted_rows(path, indptr, indices, first_row=lo)
    indices = indices.astype(index_dtype(n), copy=False)       # int32 where the IDs fit: half the memory
    labels = f["labels"][lo:hi]
    labels = as_int64(path, "labels", labels) if labels.ndim == 1 else labels   # (multi-label: int8)
    masks = {m: f[m][lo:hi] for m in MASKS}
    check_node_data(path, hi - lo, labels, int(attrs["num_classes"]), masks)
    features = read_features(path, f["features"], lo, hi, f["orig_ids"][lo:hi] if "orig_ids" in f else None,
                             keep=keep_features)
    return GraphSlice(path=path, attrs=attrs, num_nodes=n, num_edges=e, bounds=bounds, lo=lo, hi=hi,
                      indptr=indptr, indices=indices, features=features, labels=labels, masks=masks)


def read_features(path, ds, lo: int, hi: int, orig_ids: np.ndarray | None,
                  keep: bool = True) -> np.ndarray | None:
    """Rows ``lo:hi`` of the features as stored (float32, float16 or bfloat16's uint16), read in blocks and
    checked finite (the message names the graph's row); the warning of :class:`LargeFeatures` for this slice's
    rows. ``keep=False``: only checked (None)."""
    name = feature_dtype_attr(path, ds.file.attrs.get("feature_dtype", "float32"))
    out = np.empty((hi - lo, ds.shape[1]), dtype=stored_dtype(name)) if keep else None
    step = max(1, STREAM_BYTES // max(1, ds.dtype.itemsize * ds.shape[1]))
    large = LargeFeatures()
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        raw = np.asarray(ds[a:b])
        if keep:
            with np.errstate(over="ignore"):
                out[a - lo:b - lo] = raw
        with np.errstate(over="ignore"):
            block = widen(raw, name)
        if not np.isfinite(large.scan(block, a)):
            check_finite_features(path, block if name == "bfloat16" else raw, a)
    large.warn(path, orig_ids, offset=lo)
    return out
