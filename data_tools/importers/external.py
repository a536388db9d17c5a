"""Out-of-core pieces of g3-prepare: an edge spool and the bucketed in-edge CSR build (docs/PREPARE.md, Memory).

``EdgeSpool`` holds an importer's validated edges block by block, in memory while they are small and in a file of
the work directory (beside the output) beyond that. ``build_csr_external`` builds the CSR that
``common.build_in_csr`` builds, bit for bit, without ever holding the edge list: one pass over the edges writes
each into a bucket file by range of destination rows (in-degrees are counted on the way), then each bucket is
read back, its rows sorted, deduplicated and compacted by the same code as the in-memory build
(``common._compact_rows``), and appended to graph.h5. A bucket holding more than a block of edges is first split
by rows (the in-degrees say where), so a sort never holds more than ``block_edges`` edges (or one row, if a single
row has more).
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from g3mpi.format import index_dtype
from g3mpi.format.stale import temp_prefix

from g3mpi.mpi.termination import raise_if_terminated
from .common import EDGE_CHUNK, _compact_rows, _row_blocks, progress

#: most bucket files of the first pass (each a range of destination rows)
MAX_BUCKETS = 512


@contextlib.contextmanager
def work_dir(out) -> Iterator[Path]:
    """A temporary directory beside ``out`` for spilled edges and buckets, removed on exit (also on an error or a
    signal); named as the output's temporaries (``.OUT.HOST-PID.*.tmp``), so the next write of ``out`` removes
    the one of a process killed outright."""
    out = Path(out)
    d = Path(tempfile.mkdtemp(prefix=temp_prefix(out), suffix=".tmp", dir=out.parent))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class EdgeSpool:
    """(src, dst) blocks appended in order, read back in the same blocks; in memory up to ``limit`` bytes, then
    all of them in one file of ``directory`` (None: always in memory)."""

    def __init__(self, dtype, directory: Path | None, limit: int):
        self.dtype = np.dtype(dtype)
        self.dir, self.limit = directory, int(limit)
        self.num_edges = 0
        self._mem: list[np.ndarray] = []
        self._sizes: list[int] = []
        self._path: Path | None = None

    def append(self, src: np.ndarray, dst: np.ndarray) -> None:
        pairs = np.empty((len(src), 2), dtype=self.dtype)
        pairs[:, 0], pairs[:, 1] = src, dst
        self.num_edges += len(pairs)
        if self._path is None and self.dir is not None and 2 * self.num_edges * self.dtype.itemsize > self.limit:
            fd, name = tempfile.mkstemp(prefix="edges.", suffix=".bin", dir=self.dir)
            self._path = Path(name)
            with open(fd, "wb") as f:
                for a in self._mem:
                    a.tofile(f)
            self._mem = []
        if self._path is None:
            self._mem.append(pairs)
        else:
            with open(self._path, "ab") as f:
                pairs.tofile(f)
        self._sizes.append(len(pairs))

    def blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self._path is None:
            for a in self._mem:
                yield a[:, 0], a[:, 1]
            return
        with open(self._path, "rb") as f:
            for k in self._sizes:
                a = np.fromfile(f, dtype=self.dtype, count=2 * k).reshape(k, 2)
                yield a[:, 0], a[:, 1]

    def close(self) -> None:
        self._mem = []
        if self._path is not None:
            self._path.unlink(missing_ok=True)


def _distribute(pairs_blocks, starts: np.ndarray, directory: Path, tag: str, width: int | None = None) -> list[Path]:
    """Append each (dst, src) pair of ``pairs_blocks`` ([k, 2] arrays) to the file of its row range: bucket i
    holds the rows [starts[i], starts[i+1]) (``width``: all ranges have that width, starting at 0). Returns the
    bucket files (made empty where no pair falls)."""
    paths = [directory / f"{tag}.{i}.bin" for i in range(len(starts))]
    for p in paths:
        p.touch()
    small = np.uint16 if len(starts) <= 1 << 16 else np.int64     # a radix sort of 2-byte keys: 2x faster
    for pairs in pairs_blocks:
        if not len(pairs):
            continue
        if width is not None:
            b = (pairs[:, 0] // width).astype(small)
        else:
            b = (np.searchsorted(starts, pairs[:, 0], side="right") - 1).astype(small)
        order = np.argsort(b, kind="stable")
        counts = np.bincount(b, minlength=len(starts))
        pairs = pairs[order]
        del order, b
        pos = 0
        for i in np.flatnonzero(counts):
            with open(paths[i], "ab") as f:
                pairs[pos:pos + counts[i]].tofile(f)
            pos += int(counts[i])
        raise_if_terminated()
    return paths


def _read_pairs(path: Path, dtype, step: int) -> Iterator[np.ndarray]:
    with open(path, "rb") as f:
        while True:
            a = np.fromfile(f, dtype=dtype, count=2 * step)
            if not len(a):
                return
            yield a.reshape(-1, 2)


def build_csr_external(writer, num_nodes: int, edge_blocks: Callable[[], Iterator], *, symmetrize: bool,
                       self_loops: str, dedup: bool, block_edges: int, directory: Path, num_edges: int,
                       quiet: bool = False, meter=None) -> int:
    """Write the in-edge CSR of the edges of ``edge_blocks()`` ((src, dst) blocks, IDs checked to lie in
    [0, num_nodes)) to ``writer`` (a GraphWriter) as ``build_in_csr`` with the same options would build it, in
    sorts of at most ``block_edges`` edges; temporaries go to ``directory``. ``meter``: a StageMeter, whose stages
    ``edges`` (the pass into buckets) and ``csr`` (sort and write) this measures. Returns the stored edge count."""
    n = int(num_nodes)
    idt = index_dtype(n)
    dedup = dedup or symmetrize
    add = self_loops == "add"
    drop_self = self_loops == "drop"
    block_edges = max(1, int(block_edges))
    stage = meter.stage if meter is not None else (lambda name: contextlib.nullcontext({}))
    deg = np.zeros(n, dtype=np.int64)
    total_in = num_edges * (2 if symmetrize else 1) + (n if add else 0)
    nb = int(min(MAX_BUCKETS, max(1, n), max(1, -(-2 * total_in // block_edges))))
    width = max(1, -(-n // nb))
    starts = np.arange(0, max(n, 1), width, dtype=np.int64)
    with stage("edges"):
        pairs = _stored_pairs(edge_blocks, n, idt, min(EDGE_CHUNK, block_edges), deg, symmetrize=symmetrize,
                              add=add, quiet=quiet)
        buckets = _distribute(pairs, starts, directory, "bucket", width)
    indptr0 = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr0[1:])
    del deg
    blocks = _sorted_blocks(buckets, starts, indptr0, n, idt, block_edges, directory, dedup=dedup,
                            drop_self=drop_self, add=add, quiet=quiet)
    with stage("csr"):
        if not (dedup or drop_self or add):    # rows keep every edge: indptr is known, write them as sorted
            writer.write_csr_rows(indptr0, ((r0, r1, cols) for r0, r1, cols, _ in blocks))
            return int(indptr0[-1])
        return _write_compacted(writer, blocks, n, idt, block_edges, directory)


def _stored_pairs(edge_blocks: Callable[[], Iterator], n: int, idt, step: int, deg: np.ndarray, *,
                  symmetrize: bool, add: bool, quiet: bool) -> Iterator[np.ndarray]:
    """(dst, src) pairs of every stored edge before compaction, as build_in_csr's chunks(), ``step`` at a time
    (the bucketing's temporaries stay within a block too); adds the in-degrees to ``deg``."""
    def emit(s, d):
        for a in range(0, len(s), step):
            p = np.empty((min(step, len(s) - a), 2), dtype=idt)
            p[:, 0], p[:, 1] = d[a:a + step], s[a:a + step]
            deg[:] += np.bincount(p[:, 0], minlength=n)
            yield p
    for s, d in progress(edge_blocks(), desc="bucket edges", disable=True if quiet else None):
        yield from emit(s, d)
        if symmetrize:
            yield from emit(d, s)
    if add:
        for a in range(0, n, step):
            r = np.arange(a, min(n, a + step), dtype=idt)
            yield from emit(r, r)


def _sorted_blocks(buckets: list[Path], starts: np.ndarray, indptr0: np.ndarray, n: int, idt, block_edges: int,
                   directory: Path, *, dedup: bool, drop_self: bool, add: bool, quiet: bool) -> Iterator[tuple]:
    """(r0, r1, sorted and compacted columns of rows r0..r1-1, their counts) in row order, from the buckets of
    rows starting at ``starts`` (``indptr0``: the rows' uncompacted extents); each bucket file is removed once
    read."""
    ends = np.r_[starts[1:], n]
    for i, path in enumerate(progress(buckets, desc="sort buckets", disable=True if quiet else None)):
        r_lo, r_hi = int(starts[i]), int(ends[i])
        size = int(indptr0[r_hi] - indptr0[r_lo])
        if size <= block_edges or r_hi - r_lo == 1:
            parts = [(r_lo, r_hi, path)]
        else:                                  # too many edges for one sort: split by rows (indptr0 knows where)
            bounds = [(a + r_lo, b + r_lo) for a, b in _row_blocks(indptr0[r_lo:r_hi + 1] - indptr0[r_lo],
                                                                     block_edges)]
            subs = _distribute(_read_pairs(path, idt, block_edges), np.array([a for a, _ in bounds]),
                               directory, f"split{i}")
            path.unlink()
            parts = [(a, b, p) for (a, b), p in zip(bounds, subs)]
        for r0, r1, p in parts:
            pairs = np.fromfile(p, dtype=idt).reshape(-1, 2)
            p.unlink()
            rloc = pairs[:, 0].astype(np.int64)
            rloc -= r0
            key = rloc * n + pairs[:, 1]
            del pairs
            key.sort()
            rloc = key // n if n else key
            cols, counts = _compact_rows(key, rloc, r0, r1, n, dedup=dedup, drop_self=drop_self, add=add)
            if counts is None:
                counts = np.bincount(rloc, minlength=r1 - r0)
            del key, rloc
            yield r0, r1, cols.astype(idt), counts
            raise_if_terminated()


def _write_compacted(writer, blocks: Iterator[tuple], n: int, idt, block_edges: int, directory: Path) -> int:
    """Write compacted rows, whose counts are known only once sorted: their columns are spooled to a file in
    ``directory``, then written under the indptr of the counts. Returns the stored edge count."""
    new_deg = np.zeros(n, dtype=np.int64)
    spooled = directory / "indices.bin"
    with open(spooled, "wb") as f:
        for r0, r1, cols, counts in blocks:
            new_deg[r0:r1] = counts
            cols.tofile(f)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(new_deg, out=indptr[1:])
    del new_deg

    def rows():
        with open(spooled, "rb") as f:
            for r0, r1 in _row_blocks(indptr, block_edges):
                yield r0, r1, np.fromfile(f, dtype=idt, count=int(indptr[r1] - indptr[r0]))
    writer.write_csr_rows(indptr, rows())
    spooled.unlink()
    return int(indptr[-1])
