"""What every importer produces (``RawGraph``) and the shared steps that turn it into a graph.h5.

An importer reads or generates edges (source, target pairs, by node row), node features, labels and
masks; ``write_raw_graph`` then builds the in-edge CSR (``build_in_csr``), applies the options
(symmetrize, self-loop policy, deduplication, feature row-normalisation), draws a split if the input
has none, and writes everything through ``g3mpi.format.GraphWriter`` (atomic, validated, checksummed).

Memory: edges arrive as arrays or as an ``EdgeStream`` of blocks (generated, or spooled by the importer). A graph
whose in-memory build fits in ``--memory-budget`` is built here by counting in-degrees and then filling rows
chunk by chunk (no COO copy of the edge list beyond the input arrays), then sorting / deduplicating each block
of rows in place; a larger one out of core (``external``), to the same file. Features can arrive as row blocks
from a generator, so they never sit in memory next to the edge list.
"""
from __future__ import annotations

import contextlib
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from g3mpi.format import FormatError, GraphWriter, index_dtype
from g3mpi.format.errors import check_regular_file
from g3mpi.format.limits import check_finite_features
from g3mpi.format.graph import MASKS, check_node_data, labelled, link_counts
from g3mpi.format.schema import labels_dtype
from g3mpi.mpi.termination import raise_if_terminated

from ..stages import StageMeter

#: edges handled at once when counting / filling the CSR
EDGE_CHUNK = 1 << 22
#: edges per block of rows when sorting and deduplicating columns
SORT_BLOCK = 1 << 23
#: feature rows written at once
FEATURE_BLOCK_BYTES = 32 << 20
#: default of --memory-budget: graphs whose in-memory build fits in it are built in memory (measured: the
#: out-of-core build is no slower from 2^18 nodes on, docs/PREPARE.md)
MEMORY_BUDGET = 256 << 20
#: bytes per edge of one out-of-core sort block: the (dst, src) pairs read back (2 x 4 B), the int64 key, row and
#: column of each, the compaction's masks and the cast columns (docs/PREPARE.md, Memory)
BLOCK_BYTES_PER_EDGE = 48


def progress(iterable=None, **kw):
    """tqdm on stderr, shown only on a terminal (``disable=None``) unless the caller turned it off."""
    from tqdm import tqdm
    kw.setdefault("disable", None)
    kw.setdefault("leave", False)
    kw.setdefault("dynamic_ncols", True)
    return tqdm(iterable, **kw)


#: a function returning a fresh iterator of feature row blocks (start row, float32 [rows, F])
FeatureBlocks = Callable[[], Iterator[tuple[int, np.ndarray]]]


def _nothing() -> None:
    pass


@dataclass
class EdgeStream:
    """An importer's edges, by node row and checked in range, as (src, dst) blocks: ``blocks()`` starts a pass."""

    num_edges: int
    blocks: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]
    dtype: np.dtype
    close: Callable[[], None] = _nothing       # frees what holds the edges (a spool's file)

    @classmethod
    def of_arrays(cls, src: np.ndarray, dst: np.ndarray) -> "EdgeStream":
        def blocks():
            for s in range(0, len(src), EDGE_CHUNK):
                yield src[s:s + EDGE_CHUNK], dst[s:s + EDGE_CHUNK]
        return cls(len(src), blocks, np.result_type(src.dtype, dst.dtype))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The whole (src, dst) arrays, filled block by block (the in-memory build)."""
        src = np.empty(self.num_edges, dtype=self.dtype)
        dst = np.empty(self.num_edges, dtype=self.dtype)
        w = 0
        for s, d in self.blocks():
            src[w:w + len(s)], dst[w:w + len(d)] = s, d
            w += len(s)
        assert w == self.num_edges
        return src, dst


@dataclass
class RawGraph:
    """An imported graph before CSR construction: edges by node row, node data, provenance."""

    path: str                      # the input named in error messages
    num_nodes: int
    src: np.ndarray | None         # int [E] source row of each edge (u -> v means u is a source of v) ...
    dst: np.ndarray | None         # int [E] target row; both None when ``edges`` holds them
    feature_dim: int
    features: np.ndarray | None = None          # [N, F] (any real dtype, possibly a memory map) ...
    feature_blocks: FeatureBlocks | None = None  # ... or generated in row blocks
    labels: np.ndarray | None = None            # int64 [N], -1 = unlabelled; None = no labels
    num_classes: int = 0
    masks: dict | None = None                   # {train_mask, val_mask, test_mask}: bool [N]; None = draw a split
    orig_ids: np.ndarray | None = None
    source: str = ""
    symmetric: bool = False                     # edges already contain both directions (no need to symmetrize)
    simple: bool = False                        # merge duplicate edges whatever the options (generators)
    extra_attrs: dict = field(default_factory=dict)
    edges: EdgeStream | None = None             # ... or the edges in blocks (generated, or spooled by the importer)
    feature_dtype: str = "float32"              # the input's: what graph.h5 keeps unless --feature-dtype says
    edge_type: np.ndarray | None = None         # int [E]: relation of each edge (with src/dst); None: untyped
    num_relations: int = 0
    relation_names: list | None = None
    relation_inverse: np.ndarray | None = None  # int [R]: the relation each one inverts, -1 for none
    entity_names: list | None = None            # [N] str
    links: dict | None = None                   # {link dataset name: int array} in this graph's row IDs
    node_type: np.ndarray | None = None         # int [N]: type of each node; None: one node type
    num_node_types: int = 0
    node_type_names: list | None = None
    node_type_feature_dim: np.ndarray | None = None   # int [T]: leading feature columns each type uses

    def edge_stream(self) -> EdgeStream:
        return self.edges if self.edges is not None else EdgeStream.of_arrays(self.src, self.dst)


@dataclass(frozen=True)
class PrepareOptions:
    """Options common to every importer (one per g3-prepare flag)."""

    symmetrize: bool = False
    self_loops: str = "keep"          # keep | drop | add
    dedup: bool = False
    normalize_features: bool = False
    train: float = 0.6
    val: float = 0.2
    seed: int = 0
    force: bool = False
    quiet: bool = False
    memory_budget: int = MEMORY_BUDGET   # bytes: in-memory CSR build up to it, else out of core in blocks
    feature_dtype: str | None = None     # float32 | float16 | bfloat16 stored in graph.h5 (None: the input's)
    allow_underflow: bool = False        # store non-zero features a 16-bit dtype flushes to zero (else refused)
    link_split: tuple | None = None      # (train, val, test) fractions of a random link split; None: none
    split_seed: int = 0                  # its seed


# ---------------------------------------------------------------------------------------------- NumPy files

NPY_MAGIC = b"\x93NUMPY"
#: a zip archive's first bytes: a local file header, or the end record of an empty archive
NPZ_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")
#: what np.load and an archive's members raise for a truncated or corrupt file
NUMPY_READ_ERRORS = (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error)


def load_numpy(path: Path, what: str, archive: bool, mmap: bool = False):
    """``np.load`` (never pickle) of the .npz archive (``archive``) or .npy file ``path`` holding ``what``;
    ``mmap``: a .npy file mapped, not read. FormatError naming the file if it is missing, a directory, of the
    other kind (np.load returned the other kind of object, and a traceback followed), not a NumPy file at all
    (np.load took it for pickled data, and said so), or unreadable."""
    kind = ".npz archive" if archive else ".npy file"
    if not path.exists():
        raise FormatError(path, "no such file")
    if path.is_dir():
        raise FormatError(path, f"is a directory, expected {'an' if archive else 'a'} {kind} of {what}")
    check_regular_file(path, kind)   # (a FIFO or a device would hang the read)
    with open(path, "rb") as f:
        magic = f.read(8)
    is_npz, is_npy = magic.startswith(NPZ_MAGICS), magic.startswith(NPY_MAGIC)
    if not (is_npz if archive else is_npy):
        got = ("an .npz archive (named arrays)" if is_npz else "a .npy file (one array)" if is_npy else
               "empty" if not magic else "an HDF5 file" if magic.startswith(b"\x89HDF") else
               "neither a .npy file nor an .npz archive (text?)")
        raise FormatError(path, f"not a readable {kind} of {what}: the file is {got}")
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except NUMPY_READ_ERRORS as e:
        why = "truncated or corrupt?" if archive else "truncated, corrupt or pickled?"
        raise FormatError(path, f"not a readable {kind} of {what} ({why}): {e}") from None


# ---------------------------------------------------------------------------------------------- checks

def check_finite_nonneg(option: str, value: float) -> None:
    """ValueError naming ``option`` unless ``value`` is finite and >= 0 (NaN fails every comparison)."""
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{option} must be finite and >= 0, got {value}")


def check_edge_ids(path, src: np.ndarray, dst: np.ndarray, num_nodes: int, what: str = "edge") -> None:
    """FormatError naming the first edge whose endpoint lies outside [0, num_nodes)."""
    for name, a in (("source", src), ("target", dst)):
        for s in range(0, len(a), EDGE_CHUNK):
            blk = a[s:s + EDGE_CHUNK]
            bad = (blk < 0) | (blk >= num_nodes)
            if bad.any():
                k = int(np.argmax(bad))
                raise FormatError(path, f"{what} {s + k}: {name} node ID {int(blk[k])} out of range "
                                        f"[0, {num_nodes})")


def check_features(path, x: np.ndarray, num_nodes: int) -> None:
    if x.ndim != 2:
        raise FormatError(path, f"features must be 2-D [nodes, dim], got shape {x.shape}")
    if x.shape[0] != num_nodes:
        raise FormatError(path, f"features have {x.shape[0]} rows but the graph has {num_nodes} nodes")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise FormatError(path, f"features have non-numeric dtype {x.dtype}")
    for s in range(0, len(x), 1 << 16):
        check_finite_features(path, np.asarray(x[s:s + (1 << 16)]), s, rows="row")


def check_labels(path, y: np.ndarray, num_nodes: int, num_classes: int | None) -> int:
    """Validate labels (-1 = unlabelled); return the number of classes (given, or max label + 1). Multi-label
    labels [nodes, C] (0/1 per class, -1 or NaN unknown; bool too) have C classes."""
    if y.ndim == 2:
        return _check_multilabel(path, y, num_nodes, num_classes)
    if y.ndim != 1:
        raise FormatError(path, f"labels must be 1-D [nodes] (one class per node) or 2-D [nodes, classes] (0/1 per "
                                f"class), got shape {y.shape}")
    if len(y) != num_nodes:
        raise FormatError(path, f"labels have {len(y)} entries but the graph has {num_nodes} nodes")
    if not np.issubdtype(y.dtype, np.integer):
        if not np.issubdtype(y.dtype, np.floating):
            raise FormatError(path, f"labels must be integers, got dtype {y.dtype}")
        whole = np.isfinite(y) & (y == np.round(y))    # integral floats are read as the integers they hold
        if not whole.all():
            i = int(np.argmin(whole))
            raise FormatError(path, f"label {y[i]:g} (entry {i}) is not an integer (labels are classes 0, 1, ...; "
                                    "-1 marks an unlabelled node)")
        big = np.abs(y) >= 2.0 ** 62               # the importers cast to int64, which would wrap it
        if big.any():
            i = int(np.argmax(big))
            raise FormatError(path, f"label {y[i]:g} (entry {i}) out of range: does not fit in int64")
    lo = int(y.min()) if len(y) else 0
    hi = int(y.max()) if len(y) else -1
    c = hi + 1 if num_classes is None else int(num_classes)
    if c > max(num_nodes, hi + 1):
        raise ValueError(f"--num-classes {c} is more than the number of nodes ({num_nodes}) and the largest "
                         f"label + 1 ({hi + 1})")
    if lo < -1 or hi >= c:
        bad = lo if lo < -1 else hi
        raise FormatError(path, f"label {bad} out of range [-1, {c})" + ("" if num_classes is None else
                                                                       f" (--num-classes {c})"))
    return max(c, 0)


def _check_multilabel(path, y: np.ndarray, num_nodes: int, num_classes: int | None) -> int:
    """:func:`check_labels` of multi-label labels [nodes, C]: C."""
    if len(y) != num_nodes:
        raise FormatError(path, f"labels have {len(y)} rows but the graph has {num_nodes} nodes")
    c = y.shape[1]
    if num_classes is not None and num_classes != c:
        raise FormatError(path, f"multi-label labels have {c} columns, but --num-classes is {num_classes}")
    if y.dtype == bool:
        return c
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise FormatError(path, f"labels must be numbers, got dtype {y.dtype}")
    ok = (y == 0) | (y == 1) | (y == -1) | (np.isnan(y) if np.issubdtype(y.dtype, np.floating) else False)
    if not ok.all():
        i, j = np.unravel_index(int(np.argmin(ok)), y.shape)
        raise FormatError(path, f"multi-label label {y[i, j]:g} (row {i}, column {j}) is not 0 or 1 (-1 or NaN "
                                "mark an unknown one)")
    return c


def as_labels(y: np.ndarray) -> np.ndarray:
    """Checked labels (:func:`check_labels`) in the dtype graph.h5 stores: int64 [N], or int8 [N, C] (NaN: -1)."""
    if y.ndim == 1:
        return y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating):
        y = np.where(np.isnan(y), -1, y)
    return y.astype(labels_dtype(2))


def check_masks(path, masks: dict, labels: np.ndarray) -> dict:
    out = {}
    for k in MASKS:
        m = masks[k]
        if m.dtype != bool:
            if np.issubdtype(m.dtype, np.integer) and (len(m) == 0 or (m.min() >= 0 and m.max() <= 1)):
                m = m.astype(bool)
            else:
                raise FormatError(path, f"{k} must be boolean, got dtype {m.dtype}")
        out[k] = m
    c = labels.shape[1] if labels.ndim == 2 else int(labels.max()) + 1 if len(labels) else 0
    check_node_data(path, len(labels), labels, c, out)
    return out


# ---------------------------------------------------------------------------------------------- split

def random_split(labels: np.ndarray, train: float, val: float, seed: int) -> dict:
    """Seeded random split of the labelled nodes: fractions ``train`` and ``val``, the rest test."""
    if not (0 <= train and 0 <= val and train + val <= 1):
        raise ValueError(f"split fractions must satisfy 0 <= train, val and train + val <= 1 (got {train}, {val})")
    n = len(labels)
    lab = np.flatnonzero(labelled(labels))
    perm = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED])).permutation(lab)
    n_tr = int(round(train * len(lab)))
    n_va = int(round(val * len(lab)))
    masks = {k: np.zeros(n, dtype=bool) for k in MASKS}
    masks["train_mask"][perm[:n_tr]] = True
    masks["val_mask"][perm[n_tr:n_tr + n_va]] = True
    masks["test_mask"][perm[n_tr + n_va:]] = True
    return masks


# ---------------------------------------------------------------------------------------------- CSR

def build_in_csr(num_nodes: int, src: np.ndarray, dst: np.ndarray, *, symmetrize: bool = False,
                 self_loops: str = "keep", dedup: bool = False, quiet: bool = False):
    """In-edge CSR of the edges src[i] -> dst[i]: row v lists the sources of the edges into v, sorted.

    ``symmetrize`` adds v -> u for every u -> v and then merges duplicates (like PyG's ``to_undirected``);
    ``self_loops``: ``keep`` as given, ``drop`` all, ``add`` exactly one per node; ``dedup`` merges
    repeated edges. Endpoints must already be checked to lie in [0, num_nodes).

    Memory: indices (the output, E or 2E entries) plus indptr and one chunk, besides the inputs:
    in-degrees are counted first, rows are filled chunk by chunk, then each block of rows is sorted
    and compacted in place. Returns (indptr int64 [N+1], indices int32/int64 [E']).
    """
    n = int(num_nodes)
    idt = index_dtype(n)
    E = len(src)
    add = self_loops == "add"

    def chunks():
        return _edge_chunks(src, dst, n, idt, symmetrize=symmetrize, add=add)
    n_chunks = ((E + EDGE_CHUNK - 1) // EDGE_CHUNK) * (2 if symmetrize else 1) + \
        (((n + EDGE_CHUNK - 1) // EDGE_CHUNK) if add else 0)
    indptr = _count_in_degrees(chunks(), n, n_chunks, quiet)
    indices = _fill_rows(chunks(), indptr, idt, n_chunks, quiet)
    return _sort_rows(indptr, indices, n, dedup=dedup or symmetrize, drop_self=self_loops == "drop", add=add,
                      quiet=quiet)


def _edge_chunks(src: np.ndarray, dst: np.ndarray, n: int, idt, *, symmetrize: bool, add: bool):
    """(sources, targets) of every stored edge, EDGE_CHUNK at a time: the edges, their reverses with
    ``symmetrize``, one self loop per node with ``add``."""
    E = len(src)
    for s in range(0, E, EDGE_CHUNK):
        yield src[s:s + EDGE_CHUNK], dst[s:s + EDGE_CHUNK]
        if symmetrize:
            yield dst[s:s + EDGE_CHUNK], src[s:s + EDGE_CHUNK]
    if add:
        for s in range(0, n, EDGE_CHUNK):
            r = np.arange(s, min(n, s + EDGE_CHUNK), dtype=idt)
            yield r, r


def _count_in_degrees(chunks, n: int, n_chunks: int, quiet: bool) -> np.ndarray:
    """Step 1 of :func:`build_in_csr`: the indptr of the in-degrees of the edges of ``chunks``."""
    deg = np.zeros(n, dtype=np.int64)
    for s, d in progress(chunks, total=n_chunks, desc="count degrees", disable=True if quiet else None):
        deg += np.bincount(d, minlength=n)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    return indptr


def _fill_rows(chunks, indptr: np.ndarray, idt, n_chunks: int, quiet: bool) -> np.ndarray:
    """Step 2: the columns of every row, unsorted: each chunk grouped by target, each group placed at its row's
    next free slot (the order inside a row does not matter yet: step 3 sorts it)."""
    indices = np.empty(int(indptr[-1]), dtype=idt)
    nxt = indptr[:-1].copy()
    for s, d in progress(chunks, total=n_chunks, desc="fill CSR", disable=True if quiet else None):
        order = np.argsort(d)
        ds = d[order]
        starts = np.flatnonzero(np.r_[True, ds[1:] != ds[:-1]])
        counts = np.diff(np.r_[starts, len(ds)])
        rows = ds[starts].astype(np.int64)
        rank = np.arange(len(ds), dtype=np.int64) - np.repeat(starts, counts)
        indices[nxt[rows].repeat(counts) + rank] = s[order]
        nxt[rows] += counts
        del order, ds, rank
    return indices


def _sort_rows(indptr: np.ndarray, indices: np.ndarray, n: int, *, dedup: bool, drop_self: bool, add: bool,
               quiet: bool) -> tuple[np.ndarray, np.ndarray]:
    """Step 3: sort each row's columns, drop duplicates / self loops, compact in place (writes never pass
    reads). Returns the final (indptr, indices)."""
    need_compact = dedup or drop_self or add
    new_deg = np.diff(indptr) if need_compact else None
    bounds = _row_blocks(indptr, SORT_BLOCK)
    w = 0
    for r0, r1 in progress(bounds, desc="sort rows", disable=True if quiet else None):
        a, b = int(indptr[r0]), int(indptr[r1])
        if a == b:
            continue
        deg_blk = np.diff(indptr[r0:r1 + 1])
        rloc = np.repeat(np.arange(r1 - r0, dtype=np.int64), deg_blk)
        key = rloc * n + indices[a:b].astype(np.int64)
        key.sort()                                 # rows stay grouped, so rloc is unchanged by the sort
        cols, counts = _compact_rows(key, rloc, r0, r1, n, dedup=dedup, drop_self=drop_self, add=add)
        if counts is not None:
            new_deg[r0:r1] = counts
        indices[w:w + len(cols)] = cols
        w += len(cols)
        del key, rloc, cols
    if need_compact:
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new_deg, out=indptr[1:])
    assert int(indptr[-1]) == w
    return indptr, indices[:w]


def _compact_rows(key: np.ndarray, rloc: np.ndarray, r0: int, r1: int, n: int, *, dedup: bool, drop_self: bool,
                  add: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The columns of rows r0..r1-1 from their sorted keys ``rloc * n + column`` (``rloc``: row - r0 of each),
    less the duplicates (``dedup``), the self loops (``drop_self``) or all but one copy of each self loop
    (``add``); and the rows' new counts (None when nothing is dropped). One step of both CSR builds (in memory
    here, out of core in ``external``), so they agree bit for bit."""
    cols = key - rloc * n
    if not (dedup or drop_self or add):
        return cols, None
    keep = np.ones(len(key), dtype=bool)
    same = key[1:] == key[:-1]
    is_self = cols == rloc + r0
    if dedup:
        keep[1:] &= ~same
    if drop_self:
        keep &= ~is_self
    if add:
        keep[1:] &= ~(same & is_self[1:])
    return cols[keep], np.bincount(rloc[keep], minlength=r1 - r0)


def _row_blocks(indptr: np.ndarray, max_edges: int) -> list[tuple[int, int]]:
    """Split rows into consecutive ranges of about ``max_edges`` edges (at least one row each)."""
    n = len(indptr) - 1
    out, r = [], 0
    while r < n:
        target = indptr[r] + max_edges
        r1 = int(np.searchsorted(indptr, target, side="right")) - 1
        r1 = min(n, max(r1, r + 1))
        out.append((r, r1))
        r = r1
    return out


# ---------------------------------------------------------------------------------------------- features

def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Row-normalise features by their L1 norm (Planetoid / Kipf & Welling); all-zero rows stay zero.

    For non-negative features (bag of words) this is x / rowsum, exactly as Kipf's ``preprocess_features``.
    """
    x = np.asarray(x, dtype=np.float32)
    s = np.abs(x).sum(axis=1, keepdims=True)
    s[s == 0] = 1
    return (x / s).astype(np.float32, copy=False)


def feature_blocks_of(raw: RawGraph) -> Iterator[tuple[int, np.ndarray]]:
    if raw.feature_blocks is not None:
        yield from raw.feature_blocks()
        return
    x = raw.features
    if x is None:                 # no features (feature width 0: learned embeddings, a knowledge graph)
        if raw.feature_dim:
            raise ValueError("a RawGraph with feature_dim > 0 needs features or feature_blocks")
        return
    keep = x.dtype if x.dtype in (np.float16, np.uint16) else np.float32    # half types as given: no widening
    step = max(1, FEATURE_BLOCK_BYTES // max(1, 4 * raw.feature_dim))
    for s in range(0, raw.num_nodes, step):
        yield s, np.asarray(x[s:s + step], dtype=keep)   # also reads a memory-mapped .npy block by block


# ---------------------------------------------------------------------------------------------- writing

def in_memory_bytes(num_nodes: int, num_edges: int, stored: int, itemsize: int) -> int:
    """Estimated peak of the in-memory build: the (src, dst) arrays, the unsorted CSR of ``stored`` entries, the
    O(N) arrays (in-degrees, indptr, next slot) and one sort block (its int64 keys, rows and columns)."""
    return itemsize * (2 * num_edges + stored) + 24 * num_nodes + 40 * min(stored, SORT_BLOCK)


def write_raw_graph(out, raw: RawGraph, opts: PrepareOptions, work: Path | None = None, meter=None) -> dict:
    """Build the CSR of ``raw`` with ``opts`` and write graph.h5 atomically. Returns a summary dict.

    The CSR is built in memory when :func:`in_memory_bytes` fits in ``opts.memory_budget``, else out of core
    (``external.build_csr_external``, temporaries in ``work`` or a directory made beside ``out``) in sorts of
    ``memory_budget / BLOCK_BYTES_PER_EDGE`` edges: the same file either way. ``meter``: a StageMeter that
    measures the stages edges, csr, features and nodes (the labels, masks and the commit)."""
    meter = meter if meter is not None else StageMeter()
    n = raw.num_nodes
    labels = raw.labels if raw.labels is not None else np.full(n, -1, dtype=np.int64)
    labels = as_labels(np.asarray(labels))
    masks = raw.masks if raw.masks is not None else random_split(labels, opts.train, opts.val, opts.seed)

    stream = raw.edge_stream()
    if opts.link_split is not None and raw.links:
        raise FormatError(raw.path, "the input has its own link split: --link-split is for an input without one")
    linked = raw.edge_type is not None or bool(raw.links) or opts.link_split is not None
    num_relations = raw.num_relations if raw.edge_type is not None else 0
    symmetrize = opts.symmetrize and not raw.symmetric
    dedup = opts.dedup or raw.simple
    stored = stream.num_edges * (2 if symmetrize else 1) + (n if opts.self_loops == "add" else 0)
    in_memory = linked or \
        in_memory_bytes(n, stream.num_edges, stored, np.dtype(index_dtype(n)).itemsize) <= opts.memory_budget
    block_edges = max(1, opts.memory_budget // BLOCK_BYTES_PER_EDGE)
    symmetric = bool(opts.symmetrize or raw.symmetric)
    source = raw.source
    feature_dtype = opts.feature_dtype or raw.feature_dtype
    with GraphWriter(out, num_nodes=n, feature_dim=raw.feature_dim, num_classes=raw.num_classes,
                     source=source, symmetric=symmetric, self_loops=opts.self_loops, force=opts.force,
                     feature_dtype=feature_dtype, allow_underflow=opts.allow_underflow,
                     extra_attrs=dict(raw.extra_attrs, deduplicated=bool(opts.dedup or opts.symmetrize or raw.simple),
                                      normalized_features=bool(opts.normalize_features))) as w:
        if linked:
            num_edges, links, symmetric = _write_linked_edges(w, raw, stream, opts, symmetrize=symmetrize,
                                                              dedup=dedup, undirected=symmetric, meter=meter)
        else:
            num_edges, links = _write_edges(w, raw, stream, opts, in_memory=in_memory, symmetrize=symmetrize,
                                            dedup=dedup, block_edges=block_edges, out=out, work=work,
                                            meter=meter), None
        if raw.node_type is not None:
            w.write_node_types(raw.node_type, raw.num_node_types, raw.node_type_names, raw.node_type_feature_dim)
        with meter.stage("features"):
            _write_features(w, raw, opts)
        nodes = meter.stage("nodes")
        nodes.__enter__()                 # left after the commit (the writer's exit: close, fsync, rename)
        w.write_nodes(labels, masks["train_mask"], masks["val_mask"], masks["test_mask"], raw.orig_ids)
        raise_if_terminated()          # a SIGTERM whose exception was lost in a callback: do not commit the file
    nodes.__exit__(None, None, None)
    return dict(num_nodes=n, num_edges=num_edges, feature_dim=raw.feature_dim, feature_dtype=feature_dtype,
                num_classes=raw.num_classes, symmetric=symmetric, self_loops=opts.self_loops,
                train=int(masks["train_mask"].sum()), val=int(masks["val_mask"].sum()),
                test=int(masks["test_mask"].sum()), source=source,
                build="in-memory" if in_memory else "out-of-core", memory_budget=int(opts.memory_budget),
                block_edges=None if in_memory else int(block_edges),
                **({"num_relations": num_relations} if num_relations else {}),
                **({"num_node_types": raw.num_node_types} if raw.node_type is not None else {}),
                **({"links": link_counts(links)} if links else {}))


def _write_linked_edges(w, raw: RawGraph, stream, opts: PrepareOptions, *, symmetrize: bool, dedup: bool,
                        undirected: bool, meter) -> tuple[int, dict | None, bool]:
    """The CSR (in memory) of a graph with edge types or link splits, its types, names and splits (a random one
    with ``opts.link_split``, held out of the CSR) into the GraphWriter ``w``. An input whose edges all come with
    their reverse (of the same relation) is split as undirected, and so marked symmetric. Returns (stored edges,
    links, symmetric)."""
    from ..linksplit import build_csr, random_link_split
    n = raw.num_nodes
    with meter.stage("edges"):
        src, dst = (raw.src, raw.dst) if raw.edges is None else stream.arrays()
        stream.close()
    typ = raw.edge_type
    if typ is not None and raw.num_relations < 1:
        raise FormatError(raw.path, "edge types given without the number of relations")
    links = raw.links
    with meter.stage("csr"):
        if opts.link_split is not None:
            if not undirected and is_symmetric(n, src, dst, typ):
                undirected = w.attrs["symmetric"] = True
            links, (src, dst, typ) = random_link_split(n, src, dst, typ, raw.num_relations, opts.link_split,
                                                       opts.split_seed, undirected)
        indptr, indices, types = build_csr(n, src, dst, typ, symmetrize=symmetrize, self_loops=opts.self_loops,
                                           dedup=dedup, quiet=opts.quiet, path=raw.path)
        raw.src = raw.dst = raw.edge_type = src = dst = typ = None
        w.write_csr(indptr, indices)
        if types is not None:
            w.write_edge_types(types, raw.num_relations, raw.relation_names, raw.relation_inverse)
        if raw.entity_names is not None:
            w.write_entity_names(raw.entity_names)
        if links:
            w.write_links(links)
    return int(indptr[-1]), links, undirected


def is_symmetric(n: int, src: np.ndarray, dst: np.ndarray, typ: np.ndarray | None) -> bool:
    """Every edge u -> v (of relation t) has its reverse v -> u (of relation t) among the edges."""
    r = int(typ.max()) + 1 if typ is not None and len(typ) else 1
    if n and n * n > (2**62) // r:
        return False
    fwd = src.astype(np.int64) * n + dst
    back = dst.astype(np.int64) * n + src
    if typ is not None:
        fwd, back = fwd * r + typ, back * r + typ
    return bool(np.isin(back, fwd).all())


def _write_edges(w, raw: RawGraph, stream, opts: PrepareOptions, *, in_memory: bool, symmetrize: bool, dedup: bool,
                 block_edges: int, out, work: Path | None, meter) -> int:
    """The CSR of ``raw``'s edges into the GraphWriter ``w``, in memory or out of core (stages edges and csr);
    the edge list is freed once built. Returns the stored edge count."""
    from .external import build_csr_external, work_dir
    n = raw.num_nodes
    if in_memory:
        with meter.stage("edges"):
            src, dst = (raw.src, raw.dst) if raw.edges is None else stream.arrays()
            stream.close()
        with meter.stage("csr"):
            indptr, indices = build_in_csr(n, src, dst, symmetrize=symmetrize, self_loops=opts.self_loops,
                                           dedup=dedup, quiet=opts.quiet)
            # the edge list is no longer needed: free it before features are generated
            raw.src = raw.dst = src = dst = None
            w.write_csr(indptr, indices)
            return int(indptr[-1])
    with (contextlib.nullcontext(work) if work is not None else work_dir(out)) as d:
        num_edges = build_csr_external(w, n, stream.blocks, symmetrize=symmetrize,
                                       self_loops=opts.self_loops, dedup=dedup, block_edges=block_edges,
                                       directory=d, num_edges=stream.num_edges, quiet=opts.quiet,
                                       meter=meter)
    stream.close()
    raw.src = raw.dst = None
    return num_edges


def _write_features(w, raw: RawGraph, opts: PrepareOptions) -> None:
    """``raw``'s features into ``w`` block by block (row-normalized with ``opts.normalize_features``)."""
    bar = progress(total=raw.num_nodes, desc="features", unit="rows", disable=True if opts.quiet else None)
    for start, blk in feature_blocks_of(raw):
        if opts.normalize_features:
            blk = normalize_rows(blk)
        w.write_features(start, blk)
        bar.update(len(blk))
        raise_if_terminated()
    bar.close()
