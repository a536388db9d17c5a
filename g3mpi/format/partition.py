"""Partition directory: ``meta.json``, ``node_map.h5`` and one ``part-NNNNN.h5`` per part. See docs/FORMAT.md.

A part file holds everything one rank needs and nothing more. Local rows are numbered
``[owned rows | halo rows]``: owned row i is global (relabelled) node ``owned_start + i``; halo row
``num_owned + j`` is global node ``halo_ids[j]``. Owned rows are boundary-first: rows ``0 .. num_boundary-1``
are exactly the rows of the send lists, the interior rows follow (``data_tools.layout`` chooses the order).
Halo rows are grouped by owner part (ascending), one contiguous slice per receive neighbour, sorted by global
ID within a slice, so the message from that neighbour lands in place. ``send_rows`` lists, per send neighbour,
the owned local rows it needs, in the order of that neighbour's halo slice (increasing).
"""
from __future__ import annotations

import contextlib
import json
import logging
import zlib
from dataclasses import dataclass, field, fields
from pathlib import Path

import h5py
import numpy as np
from h5py import h5a, h5d, h5p, h5s, h5t

from .atomic import atomic_file, check_output
from .checksums import IncrementalSha256, array_sha256, dataset_sha256, file_sha256
from .errors import H5_READ_ERRORS, FormatError, check_regular_file, unreadable
from .features import feature_dtype_attr, stored_dtype, widen
from .limits import LargeFeatures, check_finite_features
from .schema import (PARTITION_FORMAT, PARTITION_VERSION, PART_FORMAT, as_int64, attr_kind, h5_attr_str, is_int,
                     row_chunks, supported_version, version_refused)
from .graph import check_csr, first_unsorted_row, labelled
from .links import LINK_NAMES, SPLITS, check_edge_types, check_typed_rows, link_name
from .probe import probe_structure

log = logging.getLogger(__name__)

META_NAME = "meta.json"
NODE_MAP_NAME = "node_map.h5"
NODE_MAP_FORMAT = "g3mpi-node-map"


def part_name(p: int) -> str:
    return f"part-{p:05d}.h5"


@dataclass
class PartData:
    """One rank's share of a partitioned graph (see the module docstring for the numbering)."""

    part_id: int
    num_parts: int
    num_nodes: int            # global
    num_edges: int            # global (self loops removed)
    feature_dim: int
    num_classes: int
    owned_start: int
    owned_end: int
    partition_id: str
    num_boundary: int         # owned rows 0 .. num_boundary-1 are the rows of the send lists (boundary-first)
    indptr: np.ndarray        # int64 [n_owned+1]
    indices: np.ndarray       # int32/int64 [local_edges], local columns in [0, n_owned+n_halo)
    halo_ids: np.ndarray      # int64 [n_halo], global IDs
    recv_parts: np.ndarray    # int32 [k]
    recv_offsets: np.ndarray  # int64 [k+1], into halo rows
    send_parts: np.ndarray    # int32 [k']
    send_offsets: np.ndarray  # int64 [k'+1], into send_rows
    send_rows: np.ndarray     # int64 [S], owned local rows
    in_degree: np.ndarray     # int64 [n_owned+n_halo], global in-degree (no self loops)
    out_degree: np.ndarray    # int64 [n_owned+n_halo], global out-degree (no self loops)
    self_loops: np.ndarray    # int64 [n_owned], self loops of each owned node in the graph file (SAGE's mean)
    features: np.ndarray | None   # [n_owned, F] as stored (feature_dtype; None: written later, see PartFeatures)
    labels: np.ndarray        # int64 [n_owned]; multi-label: [n_owned, num_classes] of 0/1, -1 = unknown
    train_mask: np.ndarray    # bool [n_owned]
    val_mask: np.ndarray      # bool [n_owned]
    test_mask: np.ndarray     # bool [n_owned]
    orig_ids: np.ndarray      # int64 [n_owned], row in the source graph.h5
    feature_dtype: str = "float32"   # float32 | float16 | bfloat16 (held as uint16): features.py
    num_relations: int = 0    # R; 0: one edge type, no edge_type
    edge_type: np.ndarray | None = None   # int32/int64 [local_edges]: relation of each local CSR edge
    #: link splits: {name: array} of PART_LINK_NAMES, pairs whose source this part owns, by new global IDs
    links: dict = field(default_factory=dict)
    num_node_types: int = 0   # T; 0: one node type, no node_type
    node_type: np.ndarray | None = None   # int32/int64 [n_owned+n_halo]: type of each local row

    @property
    def num_owned(self) -> int:
        return self.owned_end - self.owned_start

    @property
    def num_halo(self) -> int:
        return len(self.halo_ids)

    def recv_slice(self, i: int) -> slice:
        """Local rows of the i-th receive neighbour's halo slice."""
        n = self.num_owned
        return slice(n + int(self.recv_offsets[i]), n + int(self.recv_offsets[i + 1]))

    def send_list(self, i: int) -> np.ndarray:
        return self.send_rows[self.send_offsets[i]:self.send_offsets[i + 1]]

    @property
    def num_local_edges(self) -> int:
        """Entries of the local CSR (also once :meth:`release_edges` dropped it)."""
        return int(self.indptr[-1]) if self.indptr is not None else self._num_local_edges

    def release_edges(self) -> None:
        """Drop the local CSR (``indptr`` and ``indices`` become None), remembering a CRC of each, so that
        :func:`read_part_edges` can read them again and tell whether the file still holds the same ones."""
        if self.indptr is None:
            return
        self._num_local_edges = int(self.indptr[-1])
        self._edges_crc = (_crc(self.indptr), _crc(self.indices), self.indices.dtype.str)
        self.indptr = self.indices = None


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"))


def read_part_edges(dirpath, part: PartData) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of ``part``'s file in ``dirpath`` read again after :meth:`PartData.release_edges`
    (checked as :func:`read_part` checks them, and against what was released: FormatError naming the file when
    it now holds other edges)."""
    path = Path(dirpath) / part_name(part.part_id)
    try:
        with h5py.File(path, "r") as f:
            if h5_attr_str(f.attrs.get("partition_id", "")) != part.partition_id:
                raise FormatError(path, "belongs to another partition than the one this run loaded (replaced "
                                        "during the run?)")
            arrays = []
            for k in ("indptr", "indices"):
                if not isinstance(f.get(k), h5py.Dataset):
                    raise FormatError(path, f"dataset {k!r} is missing")
                a = np.asarray(f[k][()])
                if a.dtype.kind not in "iu" or a.ndim != 1:
                    raise FormatError(path, f"dataset {k!r} is not a one-dimensional integer array")
                arrays.append(as_int64(path, k, a, keep_int32=k == "indices"))
    except H5_READ_ERRORS as e:
        raise unreadable(path, e) from None
    indptr, indices = arrays
    n = part.num_owned
    if len(indptr) != n + 1 or len(indices) != part.num_local_edges:
        raise FormatError(path, "its local CSR changed since this run loaded it (replaced during the run?)")
    check_csr(path, indptr, indices, n + part.num_halo, "local CSR")
    if (_crc(indptr), _crc(indices), indices.dtype.str) != part._edges_crc:
        raise FormatError(path, "its local CSR changed since this run loaded it (replaced during the run?)")
    return indptr, indices


SCALARS = ("part_id", "num_parts", "num_nodes", "num_edges", "feature_dim", "num_classes", "owned_start",
           "owned_end", "partition_id", "num_boundary", "feature_dtype")
#: optional (version 4): written only when the graph has them
TYPED = ("num_relations", "edge_type", "links", "num_node_types", "node_type")
ARRAYS = tuple(f.name for f in fields(PartData) if f.name not in SCALARS + TYPED)
#: a part's link datasets: the graph's (pairs with an owned source, new global IDs) and, for the pairs and the shared
#: negatives, the position of each in the graph's split (``link_val_edge_index``, ``link_val_edge_neg_index``)
PART_LINK_NAMES = LINK_NAMES + tuple(link_name(s, k) for s in SPLITS for k in ("edge_index", "edge_neg_index"))
#: datasets a part file written before they existed lacks: read as all zeros (no self loops)
OPTIONAL = ("self_loops",)


def write_part(path, part: PartData, force: bool = False, atomic: bool = True,
               deferred: dict | None = None) -> str | None:
    """Write one part file atomically; returns the file's sha256.

    ``part.features`` may be None: the ``features`` dataset is then created empty (its shape and chunks as
    usual, no checksum yet), to be filled in row order with :class:`PartFeatures`; None is returned, and the
    file's checksum is taken once it is filled. ``atomic=False``: written in place, for a file inside a
    directory that is itself written atomically (``atomic_dir`` fsyncs its files and renames it whole), which
    saves a temporary file, an fsync and a scan of the directory per part: at 1024 parts a scan of up to 1024
    entries for each. ``deferred``: {array name: (shape, dtype)} created empty (the part's array may be None),
    to be filled with :class:`PartRows` like the features; None is returned then too."""
    deferred = deferred or {}
    with (atomic_file(path, force) if atomic else _fresh(path)) as tmp:
        with h5py.File(tmp, "w") as f:
            root = f.id   # low-level calls: see _h5_attr
            _h5_attr(root, "format", PART_FORMAT)
            _h5_attr(root, "version", PARTITION_VERSION)
            for k in SCALARS:
                _h5_attr(root, k, getattr(part, k))
            for k in ARRAYS:
                if k == "features":
                    _create_features(f, part)
                    continue
                if k in deferred:
                    f.create_dataset(k, shape=deferred[k][0], dtype=deferred[k][1])
                    continue
                a = _narrowest(k, np.ascontiguousarray(getattr(part, k)))
                ds = _h5_dataset(root, k, a)
                try:
                    _h5_attr(ds, "sha256", array_sha256(a))
                finally:
                    ds.close()
            if part.num_relations:
                _h5_attr(root, "num_relations", int(part.num_relations))
            if part.num_node_types:
                _h5_attr(root, "num_node_types", int(part.num_node_types))
            typed = {k: getattr(part, k) for k in ("edge_type", "node_type") if getattr(part, k) is not None}
            for k, v in {**typed, **{k: part.links[k] for k in PART_LINK_NAMES if k in part.links}}.items():
                a = np.ascontiguousarray(v)
                ds = _h5_dataset(root, k, a)
                try:
                    _h5_attr(ds, "sha256", array_sha256(a))
                finally:
                    ds.close()
    return None if part.features is None or deferred else file_sha256(path)


#: integer datasets stored as int32 when every value fits (readers take any integer type as int64): half the
#: bytes of the per-node topology, which with 16-bit features is a third of a part file
NARROWED = ("indptr", "halo_ids", "recv_offsets", "send_offsets", "send_rows", "in_degree", "out_degree",
            "self_loops", "labels", "orig_ids")
_I32 = np.iinfo(np.int32)


def _narrowest(name: str, a: np.ndarray) -> np.ndarray:
    """``a`` as int32 where ``name`` is one of :data:`NARROWED`, ``a`` a 1-D int64 array and its values fit."""
    if name not in NARROWED or a.dtype != np.int64 or a.ndim != 1:
        return a
    if a.size and (int(a.min()) < _I32.min or int(a.max()) > _I32.max):
        return a
    return a.astype(np.int32)


# A part file has 11 attributes and 17 datasets (each with its checksum attribute), all tiny when P is large.
# Through h5py's high-level API (``f.attrs[k] = v`` opens the root group again for every attribute and looks
# the name up first; ``create_dataset`` validates a dozen options) its Python took about as long as libhdf5's
# own work: 17 small datasets in 6.8-7.8 ms per file against 3.6-4.7 ms through the low-level API, 9
# attributes in 2.4-3.8 against 1.5-2.4 ms (this machine, shared). These two make exactly the libhdf5 calls
# the high-level API makes (so the files are the same, byte for byte) and nothing else.

def _h5_attr(obj: h5py.h5o.ObjectID, name: str, value) -> None:
    """``obj``'s new scalar attribute ``name`` := ``value`` (str: variable-length UTF-8; int: int64) as
    ``h5py.AttributeManager.__setitem__`` writes it, on an object that has no attribute of that name yet."""
    dtype = h5py.string_dtype() if isinstance(value, str) else None
    data = np.asarray(value, order="C", dtype=dtype)
    if dtype is not None:
        data = data.view(dtype=dtype)
    attr = h5a.create(obj, name.encode(), h5t.py_create(data.dtype, logical=True), h5s.create_simple(data.shape))
    try:
        attr.write(data, mtype=h5t.py_create(data.dtype))
    finally:
        attr.close()


def _h5_dataset(loc: h5py.h5g.GroupID, name: str, a: np.ndarray,
                chunks: tuple | None = None) -> h5py.h5d.DatasetID:
    """``loc``'s new dataset ``name`` holding the C-contiguous array ``a`` (contiguous, or in ``chunks``), as
    ``h5py.Group.create_dataset(name, data=a, chunks=chunks)`` makes it with its defaults (no timestamps,
    attribute creation order not tracked)."""
    dcpl = h5p.create(h5p.DATASET_CREATE)
    if chunks:
        dcpl.set_chunk(chunks)
    dcpl.set_obj_track_times(False)
    dcpl.set_attr_creation_order(0)
    ds = h5d.create(loc, name.encode(), h5t.py_create(a.dtype, logical=1), h5s.create_simple(a.shape), dcpl=dcpl)
    try:
        ds.write(h5s.ALL, h5s.ALL, a)
    except BaseException:
        try:   # now, not in a destructor, whose error would be printed as a traceback
            ds.close()
        except Exception:  # noqa: BLE001 - the write's own error is the one to report
            pass
        raise
    return ds


@contextlib.contextmanager
def _fresh(path):
    """``path`` itself, which must not exist yet; removed again if the block fails."""
    path = check_output(path, force=False)
    try:
        yield path
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _create_features(f: h5py.File, part: PartData) -> None:
    shape = (part.num_owned, part.feature_dim)
    dt = stored_dtype(part.feature_dtype)
    chunk = row_chunks(shape[0], dt.itemsize * shape[1])
    chunks = (chunk, shape[1]) if chunk and shape[1] else None
    if part.features is None:
        f.create_dataset("features", shape=shape, dtype=dt, chunks=chunks)
        return
    a = np.ascontiguousarray(part.features, dtype=dt)
    ds = _h5_dataset(f.id, "features", a, chunks)
    try:
        _h5_attr(ds, "sha256", array_sha256(a))
    finally:
        # closed here, not by a destructor: the close writes the chunks still cached, and a full disk is then
        # an error of this write (a destructor's error is printed as a traceback and ignored)
        ds.close()


class PartFeatures:
    """Fill the ``features`` of a part file that :func:`write_part` wrote without them: rows appended in order
    (``append``) or put at their rows (``put``), the dataset's checksum set by ``close``, which returns the whole
    file's sha256. The file is made durable by the directory it is written in (``atomic_dir`` fsyncs every file
    before the rename)."""

    WHAT = "features"

    def __init__(self, path):
        self.path = Path(path)
        self._f = h5py.File(self.path, "r+")
        self._ds = self._f["features"]
        self.DTYPE = self._ds.dtype          # the part's stored dtype: rows are copied, never converted
        self._rows = 0
        self._hash = IncrementalSha256()

    def append(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.DTYPE)
        if len(rows):
            self._ds[self._rows:self._rows + len(rows)] = rows
            self._hash.update(rows)
            self._rows += len(rows)

    def put(self, pos: np.ndarray, rows: np.ndarray) -> None:
        """Write ``rows`` at the dataset rows ``pos`` (distinct, increasing), one write per run of consecutive
        rows; the checksum is then taken by reading the dataset back at ``close``."""
        rows = np.asarray(rows, dtype=self.DTYPE)
        if not len(pos):
            return
        cuts = np.flatnonzero(np.diff(pos) != 1) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(pos)]):
            self._ds[int(pos[a]):int(pos[a]) + b - a] = rows[a:b]
        self._rows += len(pos)
        self._hash = None

    def close(self) -> str:
        want = self._ds.shape[0]
        if self._rows != want:
            self._f.close()
            raise FormatError(self.path, f"{self.WHAT}: {self._rows} of {want} rows were written")
        self._ds.attrs["sha256"] = dataset_sha256(self._ds) if self._hash is None else self._hash.hexdigest()
        self._f.close()
        return file_sha256(self.path)

    def close_on_error(self) -> None:
        """Close the file as it is (an error elsewhere ends the write; the caller discards the file). Never
        raises: a failing close (a full disk) must not hide the first error."""
        try:
            if self._f:
                self._f.close()
        except Exception:  # noqa: BLE001 - the write already failed; its own error is the one to report
            pass


class PartRows:
    """Fill datasets of a part file that :func:`write_part` created empty (the features when None, the arrays it
    was given as ``deferred``), each in row order (``append``); ``close`` checks that every one is full, sets
    their checksums and returns the file's sha256. Like :class:`PartFeatures`, for a file in a directory written
    atomically."""

    def __init__(self, path, names):
        self.path = Path(path)
        self._f = h5py.File(self.path, "r+")
        self._ds = {k: self._f[k] for k in names}
        self._rows = dict.fromkeys(names, 0)
        self._hash = {k: IncrementalSha256() for k in names}

    def append(self, name: str, rows: np.ndarray) -> None:
        ds = self._ds[name]
        rows = np.ascontiguousarray(rows, dtype=ds.dtype)
        if len(rows):
            at = self._rows[name]
            ds[at:at + len(rows)] = rows
            self._hash[name].update(rows)
            self._rows[name] = at + len(rows)

    def close(self) -> str:
        for k, ds in self._ds.items():
            if self._rows[k] != ds.shape[0]:
                self._f.close()
                raise FormatError(self.path, f"{k}: {self._rows[k]} of {ds.shape[0]} rows were written")
            ds.attrs["sha256"] = self._hash[k].hexdigest()
        self._f.close()
        return file_sha256(self.path)

    close_on_error = PartFeatures.close_on_error


def read_meta(dirpath) -> dict:
    dirpath = Path(dirpath)
    path = dirpath / META_NAME
    if not dirpath.is_dir():
        raise FormatError(dirpath, "no such partition directory")
    if not path.exists():
        raise FormatError(path, "no such file (not a partition directory?)")
    check_regular_file(path, "JSON file")
    try:
        text = path.read_text()
    except OSError as e:   # a directory, unreadable
        raise FormatError(path, f"cannot be read: {e.strerror or e}") from None
    try:
        meta = json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:   # (arrays nested too deep)
        raise FormatError(path, f"not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != PARTITION_FORMAT:
        raise FormatError(path, f"format is {meta.get('format') if isinstance(meta, dict) else None!r}, "
                                f"expected {PARTITION_FORMAT!r}")
    if not supported_version(meta.get("version"), PARTITION_VERSION):
        raise FormatError(path, version_refused(meta.get("version"), PARTITION_VERSION))
    for k in ("num_parts", "offsets", "files", "partition_id", "num_nodes"):
        if k not in meta:
            raise FormatError(path, f"key {k!r} is missing")
    for k in ("num_parts", "num_nodes", "num_edges", "feature_dim", "num_classes", "num_relations", "num_node_types"):
        if k in meta and not is_int(meta[k]):
            raise FormatError(path, f"{k} is {meta[k]!r}, expected an integer")
    if not isinstance(meta["partition_id"], str):
        raise FormatError(path, f"partition_id is {meta['partition_id']!r}, expected a string")
    links = meta.get("links", {})
    if not isinstance(links, dict) or not all(isinstance(v, dict) and all(is_int(c) and c >= 0 for c in v.values())
                                              for v in links.values()):
        raise FormatError(path, "links must map split names to {array: count}")
    files = meta["files"]
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise FormatError(path, "files must map file names to SHA-256 strings")
    p = meta["num_parts"]
    off = meta["offsets"]
    if not isinstance(off, list) or not all(is_int(x) for x in off):
        raise FormatError(path, f"offsets must be a list of integers, got {type(off).__name__}")
    if p < 1 or len(off) != p + 1 or off[0] != 0 or off[-1] != meta["num_nodes"] \
            or any(b < a for a, b in zip(off, off[1:])):
        raise FormatError(path, "offsets are not a non-decreasing list of num_parts+1 values from 0 to num_nodes")
    return meta



def write_meta(dirpath, meta: dict) -> None:
    (Path(dirpath) / META_NAME).write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")


def owner_of(offsets: np.ndarray, gids: np.ndarray) -> np.ndarray:
    """Owning part of each global (relabelled) ID, by binary search in the contiguous ranges."""
    return np.searchsorted(np.asarray(offsets), gids, side="right") - 1


def id_checksum(ids) -> int:
    """The sum over ``ids`` of splitmix64(id), modulo 2^64: a checksum of a set of node IDs that does not depend on
    how the set is split. The parts of a partition own every original ID exactly once if the sum of their
    checksums equals :func:`range_checksum` of ``(0, N)`` (modulo 2^64); parts that own one ID twice (and so
    miss another) give a different sum, except with a chance of about 2^-64."""
    x = np.asarray(ids, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)   # numpy's uint64 arrays wrap
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return int(x.sum(dtype=np.uint64))


def range_checksum(lo: int, hi: int, block: int = 1 << 20) -> int:
    """:func:`id_checksum` of ``range(lo, hi)``, ``block`` IDs at a time."""
    return sum(id_checksum(np.arange(a, min(a + block, hi), dtype=np.uint64))
               for a in range(lo, hi, block)) % (1 << 64)


def read_part(dirpath, part_id: int, meta: dict | None = None, verify: bool = True) -> PartData:
    """Read and validate one part file. Raises FormatError naming the file on any problem.

    ``verify`` checks the whole-file sha256 recorded in meta.json; without it the file's HDF5 structure is
    first read in a child process (``probe_structure``: damage that crashes libhdf5 kills the child, not this
    rank). Then every structural invariant that a sparse kernel relies on is checked (so a corrupt index can
    never reach one).
    """
    dirpath = Path(dirpath)
    meta = meta if meta is not None else read_meta(dirpath)
    path = dirpath / part_name(part_id)
    if not 0 <= part_id < meta["num_parts"]:
        raise FormatError(dirpath, f"part {part_id} does not exist: the partition has {meta['num_parts']} parts")
    check_regular_file(path, "part file")   # (a FIFO or /dev/zero would hang the checksum or h5py)
    if verify:
        want = meta["files"].get(path.name)
        if want is None:
            raise FormatError(dirpath / META_NAME, f"no checksum recorded for {path.name}")
        try:
            got = file_sha256(path)
        except OSError as e:   # a directory, unreadable
            raise FormatError(path, f"cannot be read: {e.strerror or e}") from None
        if got != want:
            raise FormatError(path, "checksum mismatch with meta.json (file corrupt, truncated or replaced)")
    else:
        crashed = probe_structure(path)
        if crashed:
            raise FormatError(path, crashed)
    try:
        with h5py.File(path, "r") as f:
            fmt = h5_attr_str(f.attrs.get("format", ""))
            if fmt != PART_FORMAT:
                raise FormatError(path, f"format is {fmt!r}, expected {PART_FORMAT!r}")
            ver = f.attrs.get("version", -1)
            if not supported_version(ver, PARTITION_VERSION):
                raise FormatError(path, version_refused(ver, PARTITION_VERSION))
            kw = {}
            for k in SCALARS:
                if k not in f.attrs:
                    raise FormatError(path, f"attribute {k!r} is missing")
                v = f.attrs[k]
                if k == "partition_id":
                    kw[k] = h5_attr_str(v)
                elif k == "feature_dtype":
                    kw[k] = feature_dtype_attr(path, v)
                elif attr_kind(v) == "int":
                    kw[k] = int(v)
                else:
                    raise FormatError(path, f"attribute {k!r} is {v!r}, expected an integer")
            for k in ARRAYS:
                if k in OPTIONAL and k not in f:
                    kw[k] = np.zeros(kw["owned_end"] - kw["owned_start"], dtype=np.int64)
                    continue
                if not isinstance(f.get(k), h5py.Dataset):
                    raise FormatError(path, f"dataset {k!r} is missing")
                kw[k] = np.asarray(f[k][()])   # (a scalar dataset reads as a number or bytes, not an array)
            for k in ("num_relations", "num_node_types"):
                if k in f.attrs:
                    v = f.attrs[k]
                    if attr_kind(v) != "int" or not 1 <= v < 2**31:
                        raise FormatError(path, f"attribute {k!r} is {v!r}, expected an integer >= 1")
                    kw[k] = int(v)
            for k in ("edge_type", "node_type", *PART_LINK_NAMES):
                if k in f:
                    if not isinstance(f[k], h5py.Dataset):
                        raise FormatError(path, f"{k!r} is a group, expected a dataset")
                    a = np.asarray(f[k][()])
                    if k in ("edge_type", "node_type"):
                        kw[k] = a
                    else:
                        kw.setdefault("links", {})[k] = a
    except H5_READ_ERRORS as e:
        raise unreadable(path, e) from None
    part = PartData(**kw)
    check_part(path, part, meta)
    return part


#: integer datasets: read as int64 whatever integer type the file stores (``indices`` also as int32)
INT_ARRAYS = ("indptr", "indices", "halo_ids", "recv_offsets", "send_offsets", "send_rows", "in_degree",
              "out_degree", "self_loops", "labels", "orig_ids", "recv_parts", "send_parts")


def check_part(path, part: PartData, meta: dict) -> None:
    """Every invariant of one part file, cheap enough to run on every load. Integer datasets of another integer
    type than the format's (uint64, int8, ...) are converted in place to int64 (``indices``: int32 stays), so that
    no check wraps around in an unsigned type and the trainer gets the types torch computes with."""
    def bad(msg):
        raise FormatError(path, msg)

    _check_identity(path, part, meta)
    _check_shapes_and_types(path, part, meta)
    n, h = part.num_owned, part.num_halo
    check_csr(path, part.indptr, part.indices, n + h, "local CSR")
    _check_halo_and_lists(path, part, meta["offsets"])
    _check_row_order(path, part)
    if len(part.send_rows) and (part.send_rows.min() < 0 or part.send_rows.max() >= n):
        bad(f"send row out of range [0, {n})")
    _check_boundary_first(path, part)
    _check_labels_and_ids(path, part)
    _check_original_ids(path, part)
    _check_feature_range(path, part)
    if np.any(part.in_degree < 0) or np.any(part.out_degree < 0) or np.any(part.self_loops < 0):
        bad("negative degree")
    if not np.array_equal(part.in_degree[:n], np.diff(part.indptr)):
        bad("in_degree of owned rows does not match the local CSR")
    _check_types(path, part, meta)
    _check_node_types(path, part, meta)
    _check_links(path, part, meta)


def _check_node_types(path, part: PartData, meta: dict) -> None:
    """Node types: with num_node_types (meta.json's), one type in range per local row."""
    T = int(meta.get("num_node_types", 0))
    if part.num_node_types != T:
        raise FormatError(path, f"says num_node_types = {part.num_node_types}, meta.json says {T}")
    if (part.node_type is None) != (T == 0):
        raise FormatError(path, "node_type is missing (the partition has node types)" if T else
                                "has node_type but the partition has no node types (num_node_types 0)")
    if part.node_type is not None:
        t, rows = part.node_type, part.num_owned + part.num_halo
        if t.shape != (rows,) or t.dtype.kind not in "iu":
            raise FormatError(path, f"node_type has {t.dtype} {list(t.shape)}, expected integers [{rows}]")
        if rows and (t.min() < 0 or t.max() >= T):
            raise FormatError(path, f"node_type: a type out of range [0, {T})")
        part.node_type = as_int64(path, "node_type", t)


def _check_types(path, part: PartData, meta: dict) -> None:
    """Edge types: with num_relations (meta.json's), one relation in range per local edge, sorted within equal
    sources of a row."""
    R = int(meta.get("num_relations", 0))
    if part.num_relations != R:
        raise FormatError(path, f"says num_relations = {part.num_relations}, meta.json says {R}")
    if (part.edge_type is None) != (R == 0):
        raise FormatError(path, "edge_type is missing (the partition has edge types)" if R else
                                "has edge_type but the partition has no edge types (num_relations 0)")
    if part.edge_type is not None:
        check_edge_types(path, part.edge_type, len(part.indices), R, "edge_type")
        part.edge_type = as_int64(path, "edge_type", part.edge_type, keep_int32=True)
        check_typed_rows(path, part.indptr, part.indices, part.edge_type, "local CSR")


def _check_links(path, part: PartData, meta: dict) -> None:
    """Link arrays: the splits meta.json lists, shapes, sources owned, targets and negatives in range, positions in
    the graph's split increasing and below its size."""
    def bad(msg):
        raise FormatError(path, msg)

    counts = meta.get("links", {}) or {}
    N, R = part.num_nodes, part.num_relations
    for name in list(part.links):
        a = part.links[name]
        if a.dtype.kind not in "iu":
            bad(f"{name} has dtype {a.dtype}, expected integers")
        part.links[name] = as_int64(path, name, a)
    for s in SPLITS:
        want = counts.get(s, {})
        for key, pairs, index in (("edge", "edge", "edge_index"), ("edge_neg", "edge_neg", "edge_neg_index")):
            p, ix = part.links.get(link_name(s, pairs)), part.links.get(link_name(s, index))
            if key not in want:
                if p is not None or ix is not None:
                    bad(f"has {link_name(s, pairs)} but meta.json lists no such split")
                continue
            if p is None or ix is None:
                bad(f"{link_name(s, pairs)} or {link_name(s, index)} is missing (meta.json lists the split)")
            if p.ndim != 2 or p.shape[1] != 2 or ix.shape != (len(p),):
                bad(f"{link_name(s, pairs)} has shape {p.shape} and {link_name(s, index)} {ix.shape}, expected "
                    "(pairs, 2) and (pairs,)")
            if len(p) and (p[:, 0].min() < part.owned_start or p[:, 0].max() >= part.owned_end):
                bad(f"{link_name(s, pairs)}: a pair's source is not owned by this part [{part.owned_start}, "
                    f"{part.owned_end})")
            if len(p) and (p[:, 1].min() < 0 or p[:, 1].max() >= N):
                bad(f"{link_name(s, pairs)}: a pair's target is out of range [0, {N})")
            if len(ix) and (ix[0] < 0 or ix[-1] >= want[key] or np.any(np.diff(ix) <= 0)):
                bad(f"{link_name(s, index)} must increase strictly within [0, {want[key]})")
        pos = part.links.get(link_name(s, "edge"))
        t = part.links.get(link_name(s, "edge_type"))
        if (t is not None) != (pos is not None and R > 0):
            bad(f"{link_name(s, 'edge_type')} must be present exactly when the split exists and the graph is typed")
        if t is not None:
            check_edge_types(path, t, len(pos), R, link_name(s, "edge_type"))
        neg = part.links.get(link_name(s, "target_node_neg"))
        if ("target_node_neg" in want) != (neg is not None):
            bad(f"{link_name(s, 'target_node_neg')}: present here and in meta.json's links must agree")
        if neg is not None:
            if neg.ndim != 2 or neg.shape != (len(pos), want["target_node_neg"]):
                bad(f"{link_name(s, 'target_node_neg')} has shape {neg.shape}, expected ({len(pos)}, "
                    f"{want['target_node_neg']})")
            if neg.size and (neg.min() < 0 or neg.max() >= N):
                bad(f"{link_name(s, 'target_node_neg')}: a negative target is out of range [0, {N})")


def _check_identity(path, part: PartData, meta: dict) -> None:
    """The part belongs to this partition, is the part its name says, and owns the rows meta.json assigns it."""
    def bad(msg):
        raise FormatError(path, msg)

    if part.partition_id != meta["partition_id"]:
        bad(f"belongs to partition {part.partition_id}, not to this directory's {meta['partition_id']} "
            "(files from different partitions mixed?)")
    if part.num_parts != meta["num_parts"]:
        bad(f"says {part.num_parts} parts, meta.json says {meta['num_parts']}")
    off = meta["offsets"]
    pid = part.part_id
    if not 0 <= pid < part.num_parts:
        bad(f"part_id {pid} out of range")
    if path.name != part_name(pid):
        bad(f"contains part {pid}, expected by its name to contain part {path.name[5:10].lstrip('0') or '0'} "
            "(part files swapped or renamed?)")
    if (part.owned_start, part.owned_end) != (off[pid], off[pid + 1]):
        bad(f"owns [{part.owned_start}, {part.owned_end}) but meta.json assigns [{off[pid]}, {off[pid + 1]})")


def _check_shapes_and_types(path, part: PartData, meta: dict) -> None:
    """Every dataset's shape and type (integer ones converted to int64 in place, ``indices``' int32 kept), and the
    counts that meta.json also records."""
    def bad(msg):
        raise FormatError(path, msg)

    # lengths checked against the offsets below; halo_ids before num_halo (its length) is taken
    for k in ("indices", "recv_parts", "send_parts", "send_rows", "halo_ids"):
        if getattr(part, k).ndim != 1:
            bad(f"dataset {k!r} has shape {getattr(part, k).shape}, expected one dimension")
    n, h = part.num_owned, part.num_halo
    shapes = dict(indptr=(n + 1,), halo_ids=(h,), in_degree=(n + h,), out_degree=(n + h,), self_loops=(n,),
                  features=(n, part.feature_dim), labels=(n, part.num_classes) if part.labels.ndim == 2 else (n,),
                  train_mask=(n,), val_mask=(n,), test_mask=(n,),
                  orig_ids=(n,), recv_offsets=(len(part.recv_parts) + 1,),
                  send_offsets=(len(part.send_parts) + 1,))
    for k, shp in shapes.items():
        if getattr(part, k).shape != shp:
            bad(f"dataset {k!r} has shape {getattr(part, k).shape}, expected {shp}")
    for k in INT_ARRAYS:
        a = getattr(part, k)
        if a.dtype.kind not in "iu":
            bad(f"dataset {k!r} has dtype {a.dtype}, expected an integer type")
        if not (k == "labels" and a.ndim == 2):   # (multi-label ones stay int8: 0, 1 or -1)
            setattr(part, k, as_int64(path, k, a, keep_int32=k == "indices"))
    if part.features.dtype != stored_dtype(part.feature_dtype):
        bad(f"features have dtype {part.features.dtype}, but feature_dtype is {part.feature_dtype} (stored as "
            f"{stored_dtype(part.feature_dtype)})")
    if part.feature_dtype != meta.get("feature_dtype", "float32"):
        bad(f"feature_dtype is {part.feature_dtype}, meta.json says {meta.get('feature_dtype', 'float32')}")
    for k in ("train_mask", "val_mask", "test_mask"):
        if getattr(part, k).dtype != np.bool_:
            bad(f"dataset {k!r} has dtype {getattr(part, k).dtype}, expected bool")
    for k in ("num_nodes", "num_edges", "feature_dim", "num_classes"):   # (summary.json reports num_edges)
        if k in meta and getattr(part, k) != meta[k]:
            bad(f"says {k} = {getattr(part, k)}, meta.json says {meta[k]}")


def _check_halo_and_lists(path, part: PartData, off) -> None:
    """Halo IDs: in range, strictly increasing, not owned here, and sliced by their owners (``off``: the
    partition's offsets); the receive and send lists: other parts' IDs, increasing, with increasing offsets."""
    def bad(msg):
        raise FormatError(path, msg)

    h, N, pid = part.num_halo, part.num_nodes, part.part_id
    hid = part.halo_ids
    if h:
        if hid.min() < 0 or hid.max() >= N:
            bad(f"halo ID out of range [0, {N})")
        if np.any(np.diff(hid) <= 0):
            bad("halo IDs are not strictly increasing")
        if np.any((hid >= part.owned_start) & (hid < part.owned_end)):
            bad("a halo ID is an owned node")
    for name, parts, offs, total in (("recv", part.recv_parts, part.recv_offsets, h),
                                     ("send", part.send_parts, part.send_offsets, len(part.send_rows))):
        if len(parts) and (parts.min() < 0 or parts.max() >= part.num_parts or np.any(parts == pid)
                           or np.any(np.diff(parts) <= 0)):
            bad(f"{name}_parts must be strictly increasing part IDs other than {pid}")
        if offs[0] != 0 or offs[-1] != total or np.any(np.diff(offs) <= 0):
            bad(f"{name}_offsets must increase strictly from 0 to {total}")
    if h:
        owners = owner_of(off, hid)
        want = np.repeat(part.recv_parts.astype(np.int64), np.diff(part.recv_offsets))
        if not np.array_equal(owners, want):
            bad("halo slices do not match the owners of their IDs")


def _check_labels_and_ids(path, part: PartData) -> None:
    """Labels in range, no unlabelled node in a mask, original IDs in range."""
    def bad(msg):
        raise FormatError(path, msg)

    n, N = part.num_owned, part.num_nodes
    top = 2 if part.labels.ndim == 2 else part.num_classes   # (multi-label: 0 or 1 per class)
    if part.labels.size and (part.labels.min() < -1 or part.labels.max() >= top):
        bad(f"labels out of range [-1, {top}): found {int(part.labels.min())}..{int(part.labels.max())}")
    for k in ("train_mask", "val_mask", "test_mask"):
        unlabelled = np.count_nonzero(getattr(part, k) & ~labelled(part.labels))
        if unlabelled:
            bad(f"{k} contains {unlabelled} unlabelled nodes")
    if n and (part.orig_ids.min() < 0 or part.orig_ids.max() >= N):
        bad(f"original node ID out of range [0, {N})")


def _check_boundary_first(path, part: PartData) -> None:
    """FormatError unless owned rows ``0 .. num_boundary-1`` are exactly the rows of the send lists (each in
    some list, every listed row among them) and each send list is increasing (its halo slice's order)."""
    nb, n, rows = part.num_boundary, part.num_owned, part.send_rows
    if not 0 <= nb <= n:
        raise FormatError(path, f"num_boundary {nb} out of range [0, {n}]")
    if len(rows) and rows.max() >= nb:
        raise FormatError(path, f"send row {int(rows.max())} is not in the boundary block [0, {nb}) (owned rows "
                                "must be boundary-first: partition the graph again with g3-partition)")
    if nb and np.count_nonzero(np.bincount(rows, minlength=nb)) != nb:
        raise FormatError(path, f"a row of the boundary block [0, {nb}) is in no send list")
    so = part.send_offsets
    step = np.diff(rows)
    step[so[1:-1] - 1] = 1     # (steps between two lists)
    if np.any(step <= 0):
        raise FormatError(path, "a send list is not increasing (its rows must follow the order of the halo slice)")


def _check_original_ids(path, part: PartData) -> None:
    """FormatError unless every original ID is owned once: the interior rows keep the original order (strictly
    increasing), the boundary rows are distinct and none is also an interior row."""
    ids, nb = part.orig_ids, part.num_boundary
    inner, bnd = ids[nb:], np.sort(ids[:nb])
    if np.any(np.diff(inner) <= 0) or np.any(np.diff(bnd) == 0) or (
            len(inner) and len(bnd) and np.any(inner[np.minimum(np.searchsorted(inner, bnd), len(inner) - 1)] == bnd)):
        raise FormatError(path, "original node IDs are not distinct, or the interior rows' not strictly increasing "
                                "(a node listed twice?)")


def _check_feature_range(path, part: PartData) -> None:
    """FormatError if a feature is NaN or infinite (:func:`check_finite_features`, naming the node by its new
    global ID); the warning of :class:`LargeFeatures` (naming the file, the
    first such node and its original ID) if some reach 2^64 in magnitude. Two reductions (max and min: NaN
    propagates through both), no temporary array unless there is something to report."""
    x = widen(part.features, part.feature_dtype)
    large = LargeFeatures()
    if not np.isfinite(large.scan(x, part.owned_start)):
        check_finite_features(path, x, part.owned_start)
    large.warn(path, part.orig_ids, part.owned_start)


#: edges per block of the row-order check of a part (its temporaries stay in the cache)
ORDER_BLOCK = 1 << 16


def _check_row_order(path, part: PartData) -> None:
    """FormatError naming the first owned row whose sources are not sorted by new global ID (docs/FORMAT.md;
    duplicate edges, adjacent, are allowed). The indices and halo IDs must be checked already (in range; halo IDs
    strictly increasing, none owned). Global order is local order, except that the halo rows of lower parts (local
    columns ``[n, n + below)``) come before the owned ones (``[0, n)``): in a sorted row a local column decreases
    only from such a halo row to an owned one, and never increases from an owned one to such a halo row. Checked
    over blocks of :data:`ORDER_BLOCK` edges, a few vector operations each (O(E), no loop over rows)."""
    n, h, ind = part.num_owned, part.num_halo, part.indices
    E = len(ind)
    if E < 2:
        return
    below = int(np.searchsorted(part.halo_ids, part.owned_start))   # halo rows with a smaller global ID
    if ind.dtype != np.int64 and n + h >= 2**31:
        ind = ind.astype(np.int64)
    down = ind[1:] < ind[:-1]   # down[i]: entry i+1 out of order after entry i
    if below:
        u = ind.view(f"u{ind.itemsize}")   # (u - n < below, unsigned: n <= column < n + below)
        un, ub = u.dtype.type(n), u.dtype.type(below)
        for a in range(0, E - 1, ORDER_BLOCK):
            b = min(E, a + ORDER_BLOCK + 1)
            owned, lower = ind[a:b] < n, (u[a:b] - un) < ub
            d = down[a:b - 1]
            d &= ~(lower[:-1] & owned[1:])
            d |= owned[:-1] & lower[1:]
    bad = first_unsorted_row(part.indptr, down)
    if bad is not None:
        r, pos = bad
        gid = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])[ind[pos - 1:pos + 1]]
        raise FormatError(path, f"local CSR: the sources of owned row {r} (node {part.owned_start + r}) are not "
                                f"sorted by new global ID (node {int(gid[0])} before node {int(gid[1])}; the format "
                                "keeps every row sorted)")


def write_node_map(path, new_to_orig: np.ndarray, force: bool = False) -> str:
    with atomic_file(path, force) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = NODE_MAP_FORMAT
            f.attrs["version"] = PARTITION_VERSION
            ds = f.create_dataset("new_to_orig", data=np.asarray(new_to_orig, dtype=np.int64))
            ds.attrs["sha256"] = array_sha256(np.asarray(new_to_orig, dtype=np.int64))
    return file_sha256(path)


class NodeMapWriter(PartFeatures):
    """Write a ``node_map.h5`` of ``num_nodes`` entries in pieces, in order (``append``), never holding it whole:
    the file :func:`write_node_map` writes (a contiguous ``new_to_orig``, its checksum taken as the pieces pass).
    Written in place, for a file inside a directory written atomically (``atomic_dir``); ``close`` returns its
    sha256, ``close_on_error`` closes it as it is."""

    DTYPE, WHAT = np.int64, "new_to_orig"

    def __init__(self, path, num_nodes: int):
        self.path = Path(path)
        self._f = h5py.File(check_output(self.path, force=False), "w")
        self._f.attrs["format"] = NODE_MAP_FORMAT
        self._f.attrs["version"] = PARTITION_VERSION
        self._ds = self._f.create_dataset("new_to_orig", shape=(num_nodes,), dtype=np.int64)
        self._rows = 0
        self._hash = IncrementalSha256()


def read_node_map(dirpath, meta: dict | None = None) -> np.ndarray:
    dirpath = Path(dirpath)
    meta = meta if meta is not None else read_meta(dirpath)
    path = dirpath / NODE_MAP_NAME
    check_regular_file(path, "node map")
    try:
        if file_sha256(path) != meta["files"].get(NODE_MAP_NAME):
            raise FormatError(path, "checksum mismatch with meta.json")
        with h5py.File(path, "r") as f:
            fmt, ver = h5_attr_str(f.attrs.get("format", "")), f.attrs.get("version")
            if fmt != NODE_MAP_FORMAT or not supported_version(ver, PARTITION_VERSION):
                raise FormatError(path, f"format {fmt!r} version {ver}, expected {NODE_MAP_FORMAT!r} version "
                                        f"{PARTITION_VERSION}")
            if "new_to_orig" not in f or not isinstance(f["new_to_orig"], h5py.Dataset):
                raise FormatError(path, "dataset 'new_to_orig' is missing")
            m = f["new_to_orig"][()]
    except H5_READ_ERRORS as e:
        raise unreadable(path, e) from None
    if m.dtype.kind not in "iu":
        raise FormatError(path, f"new_to_orig has dtype {m.dtype}, expected an integer type")
    if m.shape != (meta["num_nodes"],):
        raise FormatError(path, f"new_to_orig has shape {m.shape}, expected ({meta['num_nodes']},)")
    return m
