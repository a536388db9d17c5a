"""KaMinPar (the shared-memory multilevel partitioner of KIT, pip ``kaminpar``) on the symmetrized graph.

The Python binding reads its graph only from a file, so the graph goes to KaMinPar's extension of the ParHIP
binary format, written row block by row block (:func:`write_parhip`): a 24-byte header (version bit field, n,
m = directed adjacency entries), n + 1 offsets as byte addresses into the file, the m neighbours (32-bit node
IDs below 2^31 nodes, else 64-bit), then n node weights, 64-bit (the wheel is built with 64-bit IDs and weights
and widens what it reads). A symmetric graph's rows are written as
they are, less self loops and repeated sources; a directed one is symmetrized first (A + Aᵀ, a whole copy,
as for METIS).

Node weights balance what a training rank costs (:func:`node_weights`): on skewed (power-law) in-degrees, as
g3's own start (:mod:`.g3_start`), ``1 + in_degree_v`` (the in-edges: aggregation work; node counts are then
evened out by moving cheap nodes), else ``ceil(E / N) + in_degree_v``, in which nodes and in-edges carry the same
total (METIS's ``mixed``). One weight caps neither load on its own: ``g3-partition --refine g3`` moves nodes until
both caps hold. On R-MAT 16 / 18 into 8 parts the edge weights left 0.90x / 0.89x the max communication rows of
the mixed ones after refinement.

Contexts (``context``): ``fast``, ``default``, ``strong`` (slower, fewer cut edges) and ``terapart`` (the graph
compressed in memory). KaMinPar 3.7.3 crashes (SIGSEGV) on a terapart context with an uncompressed graph and on
a compressed graph with node weights, so ``terapart`` runs with unit weights (nodes balanced) on the compressed
graph.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from g3mpi.format.graph import first_unsorted_row

from ..build import row_blocks

CONTEXTS = ("fast", "default", "strong", "terapart")
#: ParHIP version bits (set = absent / 32-bit): bit 0 no edge weights, bit 1 no node weights, bits 2-5 32-bit
#: edge IDs, node IDs, node weights, edge weights. 64-bit everything, no edge weights:
PARHIP_NODE_WEIGHTS = 1
PARHIP_UNWEIGHTED = 3
#: neighbours as 32-bit node IDs (graphs under 2^31 nodes): half the file, the same partition
PARHIP_32BIT_NODE_IDS = 8
#: rows written at a time hold about this many adjacency entries (bounds the temporaries: ~40 B per entry)
BLOCK_ENTRIES = 1 << 22
#: the top node ID and weight of the 64-bit build (signed)
MAX_ID = 2**63 - 1


class KaMinParError(RuntimeError):
    """KaMinPar could not partition the graph (missing package, out of memory, a library failure): one line."""


class KaMinParMissing(KaMinParError):
    """The kaminpar package cannot be imported."""


def load_kaminpar():
    """The ``kaminpar`` module, or KaMinParError saying how to install it."""
    try:
        import kaminpar
    except ImportError as e:
        raise KaMinParMissing(f"the kaminpar package is not installed ({e}); pip install kaminpar, or use --method "
                            f"metis or --method stream") from None
    return kaminpar


def default_threads() -> int:
    """The CPUs this process may run on (its affinity mask: a batch job's share, not the whole node)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _block_rows(indptr, indices, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept-entry counts per row [hi-lo], kept neighbours int64) of rows lo..hi-1: no self loop, each source
    once (rows are sorted, so a repeated source follows its first copy)."""
    a, b = int(indptr[lo]), int(indptr[hi])
    src = np.asarray(indices[a:b], dtype=np.int64)
    d = np.diff(np.asarray(indptr[lo:hi + 1], dtype=np.int64))
    rows = np.repeat(np.arange(lo, hi, dtype=np.int64), d)
    keep = src != rows
    if len(src) > 1:
        same = (src[1:] == src[:-1]) & (rows[1:] == rows[:-1])
        keep[1:] &= ~same
    return np.bincount(rows[keep] - lo, minlength=hi - lo), src[keep]


def _repeats(indptr, indices, blocks) -> bool:
    """Whether a row (sorted) lists a neighbour twice, block by block."""
    for lo, hi in zip(blocks[:-1], blocks[1:]):
        a, b = int(indptr[lo]), int(indptr[hi])
        same = np.asarray(indices[a + 1:b]) == np.asarray(indices[a:b - 1])
        if same.any() and first_unsorted_row(np.asarray(indptr[lo:hi + 1], dtype=np.int64) - a, same) is not None:
            return True
    return False


def write_parhip(path, indptr, indices, node_weights: np.ndarray | None,
                 block_entries: int = BLOCK_ENTRIES, self_loops: np.ndarray | None = None) -> tuple[int, int]:
    """Write the undirected graph whose rows are ``indptr``/``indices`` (sorted rows of a symmetric CSR) to
    ``path`` in KaMinPar's ParHIP format, ``block_entries`` entries at a time; self loops and repeated
    neighbours are left out. Returns (n, m): nodes and directed adjacency entries written.

    Two passes over the rows: the kept degrees (n int64, for the offsets), then the neighbours; no array of
    length m is built. ``self_loops``: each row's self loops when the caller has counted them; with none, and
    no repeated neighbour, the rows are written as they are (one pass, 4x faster on R-MAT 20)."""
    n = len(indptr) - 1
    deg = np.diff(np.asarray(indptr, dtype=np.int64))
    blocks = row_blocks(deg, block_entries)
    simple = self_loops is not None and not np.any(self_loops) and not _repeats(indptr, indices, blocks)
    if simple:
        kept = deg
    else:
        kept = np.zeros(n, dtype=np.int64)
        for lo, hi in zip(blocks[:-1], blocks[1:]):
            kept[lo:hi] = _block_rows(indptr, indices, int(lo), int(hi))[0]
    m = int(kept.sum())
    base = 24 + 8 * (n + 1)
    narrow = n < 2**31
    id_type, id_bytes = (np.uint32, 4) if narrow else (np.uint64, 8)
    with open(path, "wb") as f:
        version = PARHIP_UNWEIGHTED if node_weights is None else PARHIP_NODE_WEIGHTS
        version |= PARHIP_32BIT_NODE_IDS if narrow else 0
        f.write(np.array([version, n, m], dtype=np.uint64).tobytes())
        starts = np.zeros(n + 1, dtype=np.int64)   # byte addresses of each row's first neighbour
        np.cumsum(kept, out=starts[1:])
        f.write((base + id_bytes * starts).astype(np.uint64).tobytes())
        del starts
        del kept
        for lo, hi in zip(blocks[:-1], blocks[1:]):
            rows = indices[int(indptr[lo]):int(indptr[hi])] if simple else \
                _block_rows(indptr, indices, int(lo), int(hi))[1]
            f.write(np.asarray(rows).astype(id_type).tobytes())
        if node_weights is not None:
            f.write(np.ascontiguousarray(node_weights, dtype=np.int64).tobytes())
    return n, m


def node_weights(in_degree: np.ndarray) -> tuple[np.ndarray, str]:
    """(int64 [N] weights, their name): ``1 + in_degree`` (``edges``) when the in-degrees are skewed (coefficient
    of variation above g3's ``SKEW``), else ``ceil(E / N) + in_degree`` (``mixed``: nodes and in-edges carry the
    same total weight)."""
    from .g3_start import SKEW
    in_degree = np.asarray(in_degree, dtype=np.int64)
    mean = in_degree.sum() / max(1, len(in_degree))
    if len(in_degree) and float(in_degree.std()) > SKEW * max(1e-12, float(mean)):
        return 1 + in_degree, "edges"
    return max(1, int(np.ceil(mean))) + in_degree, "mixed"


def kaminpar_partition(indptr, indices, num_parts: int, *, symmetric: bool, in_degree: np.ndarray | None = None,
                       context: str = "default", threads: int | None = None, seed: int = 0,
                       imbalance: float = 1.03, workdir=None,
                       self_loops: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Node→part assignment from KaMinPar. Returns (assignment int64 [N], info).

    ``indptr``/``indices``: the graph's in-edge CSR (rows sorted; self loops and repeats are dropped here);
    ``symmetric``: every edge's reverse is there too (graph.h5's ``symmetric`` attribute), so the rows are
    handed over as they are, else A + Aᵀ is built first. ``imbalance``: KaMinPar's cap on the heaviest part's
    weight over the mean (eps = imbalance - 1). ``self_loops``: each row's self loops, when the caller has
    counted them (:func:`write_parhip`). ``workdir``: where the temporary graph file goes (default: the
    system's temporary directory); it is removed afterwards. KaMinParError when the package is missing, memory
    runs out or the library fails."""
    kaminpar = load_kaminpar()
    if context not in CONTEXTS:
        raise ValueError(f"unknown KaMinPar context {context!r} (choose from {', '.join(CONTEXTS)})")
    if not (math.isfinite(imbalance) and imbalance >= 1):
        raise ValueError(f"the KaMinPar imbalance must be finite and >= 1, got {imbalance}")
    n = len(indptr) - 1
    threads = threads or default_threads()
    info = dict(kaminpar_context=context, kaminpar_threads=threads, kaminpar_version=str(kaminpar.__version__))
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64), info
    if in_degree is None:
        in_degree = np.diff(np.asarray(indptr, dtype=np.int64))
    weighted = context != "terapart"
    vw, weights = node_weights(in_degree) if weighted else (None, "unit")
    t0, size = time.monotonic(), f"{n} nodes"
    with tempfile.TemporaryDirectory(prefix=".g3-kaminpar-", dir=workdir) as tmp:
        path = Path(tmp) / "graph.parhip"
        try:
            if not symmetric:
                from .metis import symmetrize
                indptr, indices = symmetrize(indptr, indices)
                self_loops = np.zeros(n, dtype=np.int64)
            _, m = write_parhip(path, indptr, indices, vw, self_loops=self_loops)
            del indptr, indices
            size = f"{n} nodes, {m} symmetric adjacency entries"
            graph = kaminpar.load_graph(str(path), kaminpar.GraphFileFormat.PARHIP, compress=not weighted)
            path.unlink()   # KaMinPar holds the graph now
            kaminpar.reseed(int(seed) % 2**31)
            solver = kaminpar.KaMinPar(int(threads), kaminpar.context_by_name(context))
            part = solver.compute_partition(graph, int(num_parts), float(imbalance - 1))
            del graph, solver
        except MemoryError:
            raise KaMinParError(f"out of memory after {time.monotonic() - t0:.0f} s on {n} nodes "
                                f"({context} context)") from None
        except OSError as e:
            raise KaMinParError(f"cannot write its input graph in {tmp}: {e.strerror or e}") from None
        except (RuntimeError, ValueError) as e:
            raise KaMinParError(f"KaMinPar failed after {time.monotonic() - t0:.0f} s on {size}: "
                                f"{type(e).__name__}: {str(e).strip() or 'no message'}") from None
    part = np.asarray(part, dtype=np.int64)
    if len(part) != n or (n and (part.min() < 0 or part.max() >= num_parts)):
        raise KaMinParError(f"KaMinPar returned an assignment of {len(part)} entries outside [0, {num_parts}) "
                            f"for {n} nodes")
    from .metis import fill_empty_parts
    part, filled = fill_empty_parts(part, num_parts, np.asarray(in_degree))
    info.update(kaminpar_seconds=round(time.monotonic() - t0, 3), kaminpar_weights=weights,
                kaminpar_imbalance=imbalance)
    if filled:
        info["empty_parts_filled"] = filled
    return part, info
