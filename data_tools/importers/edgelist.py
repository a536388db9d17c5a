"""``edgelist`` importer: a text file with one edge ``source target`` per line.

- Delimiter: ``,`` / ``;`` / ``|`` / tab / any whitespace, or ``auto``: the first of comma, tab, semicolon (a
  spreadsheet's CSV in locales with a decimal comma) and ``|`` that the first data line holds, else whitespace.
  Columns after the second (weights, timestamps) are ignored.
- Lines starting with ``#`` or ``%`` and blank lines are skipped, as is text after ``#``/``%`` on a line.
- Header: ``--header`` skips the first non-comment line, ``--no-header`` never does; by default the first
  non-comment line is a header when its first two fields are not integers, or when the file starts with a
  ``%%MatrixMarket matrix coordinate`` banner (that line is then the size line ``rows cols entries``).
- IDs are arbitrary (64-bit, possibly negative or sparse) integers:
  * without ``--features``/``--labels``: the nodes are the distinct IDs of the edge list, in increasing
    order; row i of the graph is ID ``orig_ids[i]`` (stored in graph.h5);
  * with ``--features``/``--labels`` (.npy, R rows) and ``--node-ids`` (.npy int [R]): row i is ID
    ``node_ids[i]``; every edge endpoint must be one of them; ``orig_ids`` = node_ids;
  * with ``--features``/``--labels`` and no ``--node-ids``: IDs are the rows, in [0, R).
- ``--masks`` (.npz with train_mask, val_mask, test_mask bool [R]); otherwise a seeded random split of the
  labelled nodes. Without ``--features``, ``--feature-dim F`` gives seeded N(0, 1) features (default 0).

Every error names the file and, for the edge list, the line.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from g3mpi.format.features import natural_dtype
from g3mpi.format import FormatError, index_dtype
from g3mpi.format.graph import MASKS
from g3mpi.sorting import sorted_unique

from .common import (FEATURE_BLOCK_BYTES, NUMPY_READ_ERRORS, EdgeStream, RawGraph, as_labels, check_features,
                     check_labels, check_masks, load_numpy, progress)
from .external import EdgeSpool
from .textio import COMMENTS, _lines, _strip, data_line_number, open_text, read_table, split_fields

#: what ``auto`` looks for in the first data line, in this order (none of them: whitespace)
AUTO_DELIMITERS = (",", "\t", ";", "|")
DELIMITERS = {"auto": "auto", ",": ",", "comma": ",", "tab": "\t", "\\t": "\t", "\t": "\t", "space": None,
              "whitespace": None, " ": None, ";": ";", "|": "|"}


def _is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False


def sniff(path: Path, delimiter: str, header: bool | None) -> tuple[str | None, int]:
    """(delimiter, number of lines to skip before the data): the header is the first non-comment line (if any),
    the ``auto`` delimiter is that of the first data line after it."""
    if delimiter not in DELIMITERS:
        raise ValueError(f"--delimiter must be one of ',', ';', '|', 'tab', 'space', 'auto' (got {delimiter!r})")
    delim = DELIMITERS[delimiter]
    skip = None
    with open_text(path) as f:
        for i, line in enumerate(_lines(path, f), start=1):
            if i == 1 and line.lower().startswith("%%matrixmarket"):
                banner = line.lower().split()
                if banner[1:3] != ["matrix", "coordinate"]:
                    raise FormatError(path, f"line 1: only MatrixMarket 'matrix coordinate' files are edge lists, "
                                            f"got {line.strip()[:80]!r}")
                if header is None:
                    header = True                  # the first non-comment line is the size line 'rows cols entries'
            text = _strip(line, COMMENTS)
            if not text:
                continue
            guess = next((d for d in AUTO_DELIMITERS if d in text), None)
            if skip is not None:                   # the first data line after a header: its delimiter
                return (guess if delim == "auto" else delim), skip
            fields = split_fields(text, guess if delim == "auto" else delim)
            if header is None:
                header = not (len(fields) >= 2 and _is_int(fields[0]) and _is_int(fields[1]))
            if not header:
                return (guess if delim == "auto" else delim), i - 1
            skip = i                               # a header may be written with another delimiter than the data
    return (None if delim == "auto" else delim), (skip or 0)


def load_masks(path: Path) -> dict:
    with load_numpy(path, "split masks", archive=True) as z:
        missing = [k for k in MASKS if k not in z.files]
        if missing:
            raise FormatError(path, f"missing {missing} (expected {list(MASKS)})")
        try:
            return {k: z[k] for k in MASKS}
        except NUMPY_READ_ERRORS as e:
            raise FormatError(path, f"not a readable .npz archive of split masks (truncated, corrupt or pickled?): "
                                    f"{e}") from None


def read_edges(path: Path, delimiter, skip: int, quiet: bool, spool: EdgeSpool, distinct: bool) -> np.ndarray | None:
    """Parse the edge list block by block into ``spool`` (int64 IDs as written); ``distinct``: return the sorted
    distinct IDs too (merged as they come, so neither the IDs nor a sorted copy of them is ever held whole)."""
    bar = progress(desc="read edges", unit="lines", disable=True if quiet else None)
    ids, pending, held = np.zeros(0, dtype=np.int64), [], 0
    for a in read_table(path, delimiter=delimiter, dtype=np.int64, usecols=(0, 1), skip=skip, bar=bar):
        spool.append(a[:, 0], a[:, 1])
        if distinct:
            pending.append(sorted_unique(a))
            held += len(pending[-1])
            if held > max(len(ids), 1 << 22):      # amortised: each ID is merged O(log) times
                ids, pending, held = sorted_unique(np.concatenate([ids, *pending])), [], 0
    bar.close()
    return sorted_unique(np.concatenate([ids, *pending])) if distinct else None


def _first_bad(src: np.ndarray, dst: np.ndarray, bad_src: np.ndarray, bad_dst: np.ndarray) -> tuple[int, int]:
    """(edge index, offending ID) of the first edge with a bad endpoint."""
    k = int(np.argmax(bad_src | bad_dst))
    return k, int(src[k] if bad_src[k] else dst[k])


def load_edgelist(path, *, delimiter: str = "auto", header: bool | None = None, features: Path | None = None,
                  labels: Path | None = None, masks: Path | None = None, node_ids: Path | None = None,
                  feature_dim: int = 0, num_classes: int | None = None, seed: int = 0,
                  quiet: bool = False, spool_dir: Path | None = None, spool_limit: int = 1 << 30) -> RawGraph:
    """``spool_dir``: where the parsed edges go beyond ``spool_limit`` bytes (None: kept in memory)."""
    path = Path(path)
    if node_ids is not None and features is None and labels is None:   # the options first, then the files
        raise ValueError("--node-ids needs --features or --labels (it names their rows)")
    if features is not None and feature_dim:
        raise ValueError("give either --features or --feature-dim, not both")
    if masks is not None and labels is None:
        raise ValueError("--masks needs --labels")
    if num_classes is not None and labels is None:
        raise ValueError("--num-classes needs --labels (without them there are no classes)")
    delim, skip = sniff(path, delimiter, header)
    x = load_numpy(features, "features", archive=False, mmap=True) if features is not None else None
    y = load_numpy(labels, "labels", archive=False) if labels is not None else None
    ids = load_numpy(node_ids, "node IDs", archive=False) if node_ids is not None else None

    spool = EdgeSpool(np.int64, spool_dir, spool_limit)     # its file, if any, goes with spool_dir
    orig_ids = read_edges(path, delim, skip, quiet, spool, distinct=x is None and y is None)
    rows = None
    if x is not None:
        rows = x.shape[0] if x.ndim else 0
    if y is not None:
        if rows is not None and y.shape[:1] != (rows,):
            raise FormatError(labels, f"labels have {y.shape[0] if y.ndim else 0} rows but features have {rows}")
        rows = y.shape[0] if y.ndim else 0
    edges, n, orig_ids = _node_rows(path, skip, spool, rows, orig_ids, ids, node_ids)
    feature_blocks = None
    if x is not None:
        check_features(features, x, n)             # in row blocks: the memory map is never read whole
        feature_dim = x.shape[1]
    elif feature_dim:
        if feature_dim < 0:
            raise ValueError("--feature-dim must be >= 0")
        feature_blocks = random_feature_blocks(n, feature_dim, seed)
    else:
        x = np.zeros((n, 0), dtype=np.float32)

    c, mk = 0, None
    if y is not None:
        c = check_labels(labels, y, n, num_classes)
        y = as_labels(y)
        if masks is not None:
            mk = load_masks(masks)
            for k, m in mk.items():
                if m.shape != (n,):
                    raise FormatError(masks, f"{k} has shape {list(m.shape)}, expected [{n}]")
            mk = check_masks(masks, mk, y)
    return RawGraph(path=str(path), num_nodes=n, src=None, dst=None, edges=edges, feature_dim=int(feature_dim),
                    features=x, feature_dtype=natural_dtype(x.dtype) if x is not None else "float32",
                    feature_blocks=feature_blocks, labels=y, num_classes=c, masks=mk, orig_ids=orig_ids,
                    source=f"edgelist:{path.name}")


def _node_rows(path: Path, skip: int, spool: EdgeSpool, rows: int | None, orig_ids: np.ndarray | None,
               ids: np.ndarray | None, node_ids: Path | None) -> tuple[EdgeStream, int, np.ndarray | None]:
    """(the spooled edges by node row, N, orig_ids): the rows are the distinct IDs (``orig_ids``, when ``rows``
    is None), the IDs of --node-ids (``ids``), or the rows of --features/--labels; every edge is checked here, in
    one pass over the spool, naming the line of the first bad one; the stream maps its blocks to rows."""
    def bad_line(k: int, msg: str) -> FormatError:
        return FormatError(path, f"line {data_line_number(path, k, skip=skip)}: {msg}")

    def check(bad_of, msg_of):
        k0 = 0
        for src, dst in spool.blocks():
            bs, bd = bad_of(src), bad_of(dst)
            if bs.any() or bd.any():
                k, v = _first_bad(src, dst, bs, bd)
                raise bad_line(k0 + k, msg_of(v))
            k0 += len(src)

    if rows is None and spool.num_edges == 0:
        raise FormatError(path, "no edges found (and no --features/--labels to define the nodes)")
    if rows is None:                                   # nodes = the distinct IDs, in increasing order
        n = len(orig_ids)

        def to_rows(a):
            return np.searchsorted(orig_ids, a)
    elif ids is not None:                              # rows named by --node-ids
        if ids.ndim != 1 or len(ids) != rows or not np.issubdtype(ids.dtype, np.integer):
            raise FormatError(node_ids, f"expected integer node IDs of shape [{rows}], "
                                        f"got {ids.dtype} {list(ids.shape)}")
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order].astype(np.int64)
        dup = np.flatnonzero(sorted_ids[1:] == sorted_ids[:-1])
        if len(dup):
            raise FormatError(node_ids, f"node ID {int(sorted_ids[dup[0]])} appears more than once")
        n = rows

        def pos_of(a):
            return np.minimum(np.searchsorted(sorted_ids, a), max(n - 1, 0))

        check(lambda a: (sorted_ids[pos_of(a)] != a) if n else np.ones(len(a), dtype=bool),
              lambda v: f"node ID {v} is not in {node_ids}")

        def to_rows(a):
            return order[pos_of(a)]
        orig_ids = ids.astype(np.int64)
    else:                                              # IDs are the rows of --features / --labels
        n = rows
        check(lambda a: (a < 0) | (a >= n), lambda v: f"node ID {v} out of range [0, {n}) (the rows of "
                                                      "--features/--labels)")

        def to_rows(a):
            return a
    idt = index_dtype(n)

    def blocks():
        for src, dst in spool.blocks():
            yield to_rows(src).astype(idt), to_rows(dst).astype(idt)
    return EdgeStream(spool.num_edges, blocks, np.dtype(idt), spool.close), n, orig_ids


def random_feature_blocks(n: int, dim: int, seed: int):
    step = max(1, FEATURE_BLOCK_BYTES // (4 * dim))

    def blocks():
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xFEA7]))
        for s in range(0, n, step):
            yield s, rng.standard_normal((min(step, n - s), dim), dtype=np.float32)
    return blocks
