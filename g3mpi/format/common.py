"""Shared pieces of the on-disk schema: names, version, errors, checksums, atomic writes.

Everything here is pure h5py + numpy (no torch, no MPI), so data_tools and the runtime
can both import it. The schema itself is documented field by field in ``docs/FORMAT.md``.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

FORMAT_VERSION = 1
#: partition directories (meta.json, node_map.h5, part files): 2 since owned rows are boundary-first
PARTITION_VERSION = 2
GRAPH_FORMAT = "g3mpi-graph"
PART_FORMAT = "g3mpi-part"
PARTITION_FORMAT = "g3mpi-partition"

#: rows per HDF5 chunk for row-chunked 2-D datasets (features)
ROW_CHUNK_BYTES = 1 << 20
#: bytes read at a time when hashing or streaming a dataset
STREAM_BYTES = 64 << 20
#: what h5py raises for a file it cannot read: OSError (not HDF5, truncated, a damaged chunk), RuntimeError (a
#: damaged object header or attribute message: "Can't synchronously determine if attribute exists by name (bad
#: version number for datatype message)"), KeyError ("Unable to synchronously open object (unable to determine
#: object type)"), ValueError ("Insufficient precision in available types to represent (31, 23, 8, 0, 23)") or
#: TypeError ("data type '<i5' not understood", "Unknown string encoding (value 10)") for damaged type messages
H5_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)

log = logging.getLogger(__name__)

#: 2^64 (about 1.8e19), the square root of float32's largest value (3.4e38): a feature (or a gradient, which the
#: features scale) beyond it has a square that float32 cannot hold, as Adam's second moments must. Measured (one rank,
#: 200 nodes, GCN, SAGE and GAT, Adam, one feature entry set): up to 1e22 trained as before; from 1e23 to 1e37 some
#: of Adam's second moments became infinite, which froze their parameters, and the run exited 0; at 3e38 the loss
#: was NaN. Read-time validation warns about features beyond it; g3-train stops when the summed gradients pass it.
FLOAT32_SQUARE_LIMIT = 2.0 ** 64


class LargeFeatures:
    """The feature rows that reach :data:`FLOAT32_SQUARE_LIMIT` in magnitude, found over row blocks: finite, so
    valid, but too large for float32 training (g3-train stops once the gradients they scale pass the same limit).
    The one check of every reader and writer of features (g3-prepare's writer, a graph file's loaders,
    g3-partition, a part file's reader): :meth:`scan` each block in turn (NaN and Inf are the caller's to refuse,
    by :func:`check_finite_features`, first or when :meth:`scan` returns one), then :meth:`warn` once, one line
    naming the file, the number of such nodes and the first. Two reductions per block (max and min), no
    temporary array unless a block holds such a value."""

    def __init__(self):
        self.nodes = 0               # rows found so far
        self.first: int | None = None   # node ID of the first (``start`` + its row)
        self.peak = 0.0              # the largest magnitude

    def scan(self, block: np.ndarray, start: int = 0) -> float:
        """Count the rows of the 2-D ``block`` (rows ``start``, ``start + 1``, ...) that reach the limit. Returns
        the block's largest magnitude (0 if empty; NaN if it holds a NaN, Inf an Inf: nothing is counted then), so
        that a caller that has not checked the block can refuse it without another pass."""
        if not block.size:
            return 0.0
        peak = max(float(block.max()), -float(block.min()))   # (both NaN if one value is)
        if not FLOAT32_SQUARE_LIMIT <= peak < np.inf:
            return peak
        rows = np.flatnonzero((np.abs(block) >= FLOAT32_SQUARE_LIMIT).any(axis=1))
        if self.first is None:
            self.first = start + int(rows[0])
        self.nodes += len(rows)
        self.peak = max(self.peak, peak)
        return peak

    def warn(self, path, orig_ids: np.ndarray | None = None, offset: int = 0) -> bool:
        """Log the warning for ``path`` if some row reached the limit (True then); ``orig_ids[first - offset]``,
        if given, is the first node's original ID."""
        if self.first is None:
            return False
        orig = "" if orig_ids is None else f", original ID {int(orig_ids[self.first - offset])}"
        log.warning("%s: the features of %d node(s) reach %.3g in magnitude (the first: node %d%s), beyond 2^64 = "
                    "1.8e19, whose square float32 cannot hold: float32 training on them is likely to overflow "
                    "(g3-train stops if the summed gradients pass 2^64); scale them, or replace such values (a fill "
                    "value for missing data?)", path, self.nodes, self.peak, self.first, orig)
        return True


def check_finite_features(path, block: np.ndarray, start: int = 0, rows: str | Callable[[int], str] = "node",
                          note: str = "") -> None:
    """The one check that features are finite, of every reader and writer of features (g3-prepare's importers and
    writer, a graph file's loaders, g3-partition, a part file's reader): FormatError naming ``path``, the first
    row of the 2-D ``block`` (``start`` + its row, called ``rows``: "node" for a graph's or a part's node IDs,
    "row" for an input file's rows; or a function of it that names it, e.g. with its line in a text file), its
    column and its value, if ``block`` holds a value that is not finite as float32: NaN, an infinity, or (in a
    wider type, float64) one beyond float32's range, which float32 would hold as an infinity; ``note`` ends the
    message. Pass the block as read, before any conversion to float32,
    so that the message shows the value the file holds; a caller that has scanned the block with
    :class:`LargeFeatures` calls this only when :meth:`LargeFeatures.scan` returned NaN or Inf."""
    if not np.issubdtype(block.dtype, np.floating):
        return   # integers are finite, and every int64 is within float32's range
    with np.errstate(over="ignore"):
        bad = ~np.isfinite(block.astype(np.float32, copy=False))
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        row = f"{rows} {start + r}" if isinstance(rows, str) else rows(start + r)
        raise FormatError(path, f"features of {row} are not finite as float32 (column {c}: "
                                f"{float(block[r, c]):g}; NaN, Inf or beyond float32's range){note}")


class FormatError(Exception):
    """A graph file, partition directory or part file is missing, corrupt or inconsistent.

    The message always names the offending path, so a user on any rank knows which file to fix.
    """

    def __init__(self, path: os.PathLike | str, message: str):
        self.path = str(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}")


def unreadable(path: os.PathLike | str, e: BaseException) -> FormatError:
    """The error for an HDF5 file that h5py cannot read (``e`` one of :data:`H5_READ_ERRORS`, raised opening it or
    reading its attributes or datasets): the path, then h5py's own reason on one line (some of h5py's take
    two: a directory's "file read failed: time = ..." then ", filename = ...")."""
    return FormatError(path, f"not a readable HDF5 file (truncated or corrupt?): {' '.join(str(e).split())}")


def failure_reason(e: BaseException) -> str:
    """One line for a failed read or write: the OS's words for its errno, also when h5py wraps it in a RuntimeError
    ("... errno = 28, error message = 'No space left on device' ..."), else the first line of the message."""
    if isinstance(e, FormatError):
        return e.reason
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno)
    m = re.search(r"error message = '([^']*)'", str(e))
    if m:
        return m.group(1)
    return str(e).splitlines()[0] if str(e) else repr(e)


def index_dtype(n: int) -> np.dtype:
    """int32 when every index fits (n < 2**31), int64 otherwise."""
    return np.dtype(np.int32) if n < 2**31 else np.dtype(np.int64)


def row_chunks(num_rows: int, row_bytes: int) -> int | None:
    """Rows per HDF5 chunk for a row-major 2-D dataset: about ROW_CHUNK_BYTES per chunk."""
    if num_rows == 0:
        return None
    rows = max(1, min(num_rows, ROW_CHUNK_BYTES // max(1, row_bytes)))
    return rows


def array_sha256(arrays) -> str:
    """sha256 of the raw C-order bytes of one array or of several arrays in turn."""
    h = hashlib.sha256()
    if isinstance(arrays, np.ndarray):
        arrays = [arrays]
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def dataset_sha256(ds) -> str:
    """sha256 of an h5py dataset's raw bytes, read in row blocks (never the whole dataset at once)."""
    h = hashlib.sha256()
    n = ds.shape[0] if ds.shape else 0
    if n == 0:
        return h.hexdigest()
    row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
    step = max(1, STREAM_BYTES // row_bytes)
    for s in range(0, n, step):
        blk = np.ascontiguousarray(ds[s:s + step])
        h.update(memoryview(blk.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def file_sha256(path: os.PathLike | str) -> str:
    """SHA-256 of a whole file, read into one buffer of at most :data:`STREAM_BYTES` (no larger than the file:
    ``f.read(STREAM_BYTES)`` would allocate all of it for every block, also for a file of a few KiB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = memoryview(bytearray(max(1, min(STREAM_BYTES, os.fstat(f.fileno()).st_size))))
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(buf[:n])
    return h.hexdigest()


class IncrementalSha256:
    """sha256 of a dataset written in row blocks, in the order they are written."""

    def __init__(self):
        self._h = hashlib.sha256()

    def update(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block)
        self._h.update(memoryview(block.reshape(-1).view(np.uint8)))

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def check_output(path: os.PathLike | str, force: bool, marker: str | None = None) -> Path:
    """Refuse an existing output unless ``force``, and even with it anything this writer would not have written
    there: with ``marker`` None (a file output) anything but a regular file; with ``marker`` (a directory output,
    e.g. a partition's ``meta.json``) anything but an empty directory or one that holds the file ``marker``. So
    ``--force`` replaces an earlier output, never a directory (or a device, or a file) of the user's that
    ``--out`` named by mistake. Returns the path."""
    path = Path(path)
    if path.exists():
        why = _not_an_output(path, marker)
        if why:
            raise FormatError(path, f"{why}: not replaced, even with --force (remove it yourself or choose another "
                                    f"output)")
        if not force:
            raise FormatError(path, "output already exists (use --force to replace it)")
    if not path.parent.exists():
        raise FormatError(path, f"output directory {path.parent} does not exist")
    return path


def _not_an_output(path: Path, marker: str | None) -> str | None:
    """Why the existing ``path`` is not an output that a writer of :func:`check_output`'s kind would have left
    (None if it is one)."""
    if marker is None:
        if path.is_dir():
            return "is a directory, not an output file"
        if not path.is_file():
            return "is not a regular file (a device, FIFO or socket?), not an output file"
        return None
    if not path.is_dir():
        return "is a file, not an output directory"
    if (path / marker).is_file() or not any(path.iterdir()):
        return None
    return f"is a directory with no {marker} (not one this tool wrote) and not empty"


@contextlib.contextmanager
def atomic_file(path: os.PathLike | str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    An exception (or a signal turned into one) leaves nothing behind: the temporary file is removed. A process
    killed outright leaves its ``.NAME.HOST-PID.*.tmp``; the next write of ``path`` on that host removes it
    (``remove_stale_temporaries``).
    """
    remove_stale_temporaries(path)
    path = check_output(path, force)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the user's usual permissions
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)   # never over a directory: check_output refused one, os.replace refuses one made since
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def json_safe(obj):
    """``obj`` with every non-finite float (an accuracy over an empty split is NaN) as None: strict JSON, which
    ``json.dumps`` would otherwise write as ``NaN``/``Infinity`` (or refuse, with ``allow_nan=False``)."""
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def json_text(obj, indent: int | None = 1, sort_keys: bool = True) -> str:
    """``obj`` as strict JSON (:func:`json_safe`), without a final newline: every JSON file and line g3mpi and
    its tools write."""
    return json.dumps(json_safe(obj), indent=indent, sort_keys=sort_keys, allow_nan=False)


def write_json(path: os.PathLike | str, obj, sort_keys: bool = True) -> None:
    """``path`` := :func:`json_text` of ``obj`` and a newline, UTF-8, by :func:`atomic_file` (an interrupted
    write leaves the old file or none, never half of one)."""
    with atomic_file(path, force=True) as tmp:
        tmp.write_text(json_text(obj, sort_keys=sort_keys) + "\n", encoding="utf-8")


@contextlib.contextmanager
def atomic_dir(path: os.PathLike | str, marker: str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; it replaces ``path`` only if the block succeeds. Its files
    and itself are fsync'ed before the rename, and the parent directory after it: after a crash or a power loss
    ``path`` is the old directory or the complete new one (a crash while the block runs leaves the temporary
    directory, ``.NAME.HOST-PID.*.tmp``, beside it, which the next write of ``path`` on that host removes).

    An existing ``path`` is swapped with the new directory in one step (Linux ``renameat2(RENAME_EXCHANGE)``)
    and then removed; where the filesystem cannot swap, it is moved aside and the new one renamed in, and an
    error or Ctrl-C between the two renames moves it back. ``marker`` is the file the block writes that marks
    the directory as this writer's: only an existing directory that holds it, or an empty one, is replaced
    (:func:`check_output`)."""
    remove_stale_temporaries(path)
    path = check_output(path, force, marker)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        for f in sorted(tmp.iterdir()):
            if f.is_file():
                fsync_path(f)
        fsync_path(tmp)
        if not path.exists():
            os.replace(tmp, path)
        elif exchange(tmp, path):
            _remove(tmp)   # now the old directory
        else:
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / "x", path)
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        fsync_path(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove(path: Path) -> None:
    """Remove a directory tree or a file (whatever ``atomic_dir`` swapped out)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _temp_prefix(path: Path) -> str:
    """``.NAME.HOST-PID.``: a temporary beside ``path`` names its writer, so a later writer can tell whether it
    is still running."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def remove_stale_temporaries(path: os.PathLike | str) -> list[Path]:
    """Remove the temporaries (``.NAME.HOST-PID.*.tmp`` / ``.old``) that a writer of ``path`` on this host left
    when it was killed outright (SIGKILL, e.g. after a batch job's ``KillWait``, or the out-of-memory killer);
    return them. An old directory that ``atomic_dir`` had moved aside is first put back if ``path`` is missing.
    Only those of this host whose process is gone: another host's process cannot be checked, and a live one (a
    concurrent writer) still owns its temporary."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{re.escape(socket.gethostname())}-(\d+)\.[^./]+\.(tmp|old)")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or _process_alive(int(m.group(1))):
            continue
        stale = Path(entry.path)
        if m.group(2) == "old" and (stale / "x").is_dir() and not os.path.lexists(path):
            # killed between moving the old directory aside and renaming the new one in: put the old one back
            os.replace(stale / "x", path)
            log.warning("%s: restored from %s, left by process %s on this host, which is no longer running",
                        path, stale.name, m.group(1))
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
        if not os.path.lexists(stale):
            log.warning("%s: removed %s, left by process %s on this host, which is no longer running",
                        path, stale.name, m.group(1))
            removed.append(stale)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: another user's live process
        return True
    return True


def exchange(a: os.PathLike | str, b: os.PathLike | str) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``). False where the C
    library or the filesystem cannot (the caller then renames in two steps); OSError for any other failure."""
    import ctypes
    import errno
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_path(path: os.PathLike | str) -> None:
    """fsync a file or a directory by its path (a directory's fsync makes its entries, e.g. a rename, durable).
    A file's failure raises; a directory's is ignored (some filesystems cannot fsync directories)."""
    is_dir = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if is_dir:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
    return attr_kind(v) == "int" and v == want


def version_refused(v, want: int) -> str:
    """Why a file of version ``v`` is refused, for a reader of version ``want`` (a partition of version 1 has
    its owned rows in original order: the runtime's boundary-first row groups would be wrong on it)."""
    msg = f"format version {shown(v)} is not supported (reads version {want})"
    if want == PARTITION_VERSION and attr_kind(v) == "int" and v == 1:
        msg += "; written before owned rows were boundary-first: partition the graph again with g3-partition"
    return msg


def shown(value, width: int = 40) -> str:
    """``value`` as an error message shows it: repr cut to ``width`` characters, a numpy scalar (an HDF5
    attribute) as the Python number it holds (``2``, not ``np.int64(2)``)."""
    if isinstance(value, np.generic):
        value = value.item()
    return f"{value!r:.{width}}"


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
