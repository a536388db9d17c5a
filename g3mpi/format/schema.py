"""The names and versions of the on-disk schema (documented field by field in ``docs/FORMAT.md``), the index
and chunk sizes its writers choose, and the checks of the attribute values its readers find."""
from __future__ import annotations

import numpy as np

from .errors import FormatError, shown

#: graph.h5: 2 since labels may be multi-label ([N, C] int8) and features float16/bfloat16, 3 since it may hold
#: link splits and edge types (optional datasets: a version 2 file is still read, as a graph without them)
FORMAT_VERSION = 3
#: partition directories (meta.json, node_map.h5, part files): 2 since owned rows are boundary-first, 3 since labels
#: may be multi-label and features float16/bfloat16, 4 since they may hold link splits and edge types (version 3
#: still read, as a partition without them)
PARTITION_VERSION = 4
#: the oldest version of each that readers still take: the later ones only added optional datasets, which an older
#: reader would have ignored silently (a held-out edge trained on), so each was a bump
OLDEST_READ = {FORMAT_VERSION: 2, PARTITION_VERSION: 3}
GRAPH_FORMAT = "g3mpi-graph"
PART_FORMAT = "g3mpi-part"
PARTITION_FORMAT = "g3mpi-partition"
#: rows per HDF5 chunk for row-chunked 2-D datasets (features)
ROW_CHUNK_BYTES = 1 << 20
#: bytes read at a time when hashing or streaming a dataset
STREAM_BYTES = 64 << 20


def index_dtype(n: int) -> np.dtype:
    """int32 when every index fits (n < 2**31), int64 otherwise."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def row_chunks(num_rows: int, row_bytes: int) -> int | None:
    """Rows per HDF5 chunk for a row-major 2-D dataset: about ROW_CHUNK_BYTES per chunk."""
    if num_rows == 0:
        return None
    rows = max(1, min(num_rows, ROW_CHUNK_BYTES // max(1, row_bytes)))
    return rows


def attr_kind(value) -> str | None:
    """'int', 'bool' or 'str' for a scalar HDF5 attribute value, None for anything else (arrays, floats)."""
    if isinstance(value, np.ndarray):
        return None
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (str, bytes)):
        return "str"
    return None


def supported_version(v, want: int = FORMAT_VERSION) -> bool:
    """``v`` (an HDF5 attribute or a JSON value) is the integer ``want`` (not a string, a float, an array or
    ``true``, which Python compares equal to 1)."""
    return attr_kind(v) == "int" and OLDEST_READ.get(want, want) <= v <= want


def version_refused(v, want: int) -> str:
    """Why a file of version ``v`` is refused, for a reader of version ``want`` (a partition of version 1 has
    its owned rows in original order: the runtime's boundary-first row groups would be wrong on it; an older
    version is read no more since the labels and features it could not hold)."""
    oldest = OLDEST_READ.get(want, want)
    reads = f"version {want}" if oldest == want else f"versions {oldest} to {want}"
    msg = f"format version {shown(v)} is not supported (reads {reads})"
    if attr_kind(v) == "int" and v < oldest:
        if want == PARTITION_VERSION and v == 1:
            msg += "; written before owned rows were boundary-first: partition the graph again with g3-partition"
        elif want == PARTITION_VERSION:
            msg += "; written by an older g3mpi: partition the graph again with g3-partition"
        else:
            msg += "; written by an older g3mpi: prepare it again with g3-prepare (then g3-partition)"
    return msg


def labels_dtype(ndim: int) -> np.dtype:
    """The stored dtype of labels: int64 [N] classes (-1: unlabelled), or int8 [N, C] multi-label 0/1 (-1:
    unknown)."""
    return np.dtype(np.int64) if ndim == 1 else np.dtype(np.int8)


def is_int(x) -> bool:
    """A JSON/Python integer, not a bool (``True`` is an ``int`` to Python)."""
    return isinstance(x, int) and not isinstance(x, bool)


def as_int64(path, name: str, a: np.ndarray, keep_int32: bool = False) -> np.ndarray:
    """The integer array ``a`` (dataset ``name`` of the file ``path``) as int64 (int32 kept with ``keep_int32``:
    column indices), FormatError if a uint64 value does not fit. A file may store any integer type; converted,
    no check wraps around in an unsigned type (np.diff of a decreasing uint64 indptr is a huge positive number)
    and the tools get the types they compute with."""
    if a.dtype == np.int64 or (keep_int32 and a.dtype == np.int32):
        return a
    if a.dtype == np.uint64 and a.size and a.max() > np.iinfo(np.int64).max:
        raise FormatError(path, f"dataset {name!r} has a value beyond the int64 range ({int(a.max())})")
    return a.astype(np.int64)


def h5_attr_str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

