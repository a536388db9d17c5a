"""METIS (through pymetis) on the symmetrized graph, with vertex weights chosen by ``balance``.

Balances:
- ``nodes``: every vertex weighs 1 (equal owned nodes: memory);
- ``edges``: in-degree + 1 (equal local edges: aggregation work);
- ``both``: nodes and edges, each under its own cap: METIS with two balance constraints (``ncon = 2``, vertex
  weights ``[1, in_degree]``), each part within ``imbalance`` x the mean of both (:func:`multi_constraint`).
  pymetis (2025.2) always calls METIS with one constraint (a weight array longer than N is read as its first N
  entries), so this calls ``METIS_PartGraphKway`` / ``METIS_PartGraphRecursive`` of the METIS library that
  pymetis ships, through ctypes;
- ``mixed``: one combined weight ``mean_in_degree + in_degree`` in which the node term and the edge term carry
  the same total weight (one constraint: neither load is capped on its own);
- ``train``: ``1 + is_train * ceil(N / T)``: training nodes and all nodes carry the same total weight, so
  each part gets about its share of training nodes (the loss work) without losing node balance entirely.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import sys
import tempfile
import time

import numpy as np
import pymetis

BALANCES = ("nodes", "edges", "both", "mixed", "train")
#: METIS_OK, the status of a call that succeeded
METIS_OK = 1
#: METIS objectives: ``cut`` minimises the edges cut; ``volume`` (k-way only) the total communication volume of
#: the symmetrized graph, i.e. the sum over nodes of the number of other parts holding a neighbour: the total
#: halo rows (= total send rows) when the graph is symmetric, an upper bound of them otherwise
OBJECTIVES = ("cut", "volume")


class MetisError(RuntimeError):
    """METIS could not partition the graph: the library failed (pybind11 turns what it throws into e.g.
    ``RuntimeError: Caught an unknown exception!``), or the graph does not fit its index type. The text is one
    line: what failed, the graph's size, and what METIS printed."""


def strip_self_loops(indptr: np.ndarray, indices: np.ndarray,
                     loops: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """CSR without its diagonal entries, as the partitioners take it (models add their own self loops).
    Returns (indptr, indices, number removed); the input arrays themselves when there is none. ``loops``: each
    row's self loops, when the caller has counted them (none: no pass over the edges)."""
    if loops is not None and not np.any(loops):
        return indptr, indices, 0
    n = len(indptr) - 1
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keep = indices != rows
    removed = int(len(indices) - keep.sum())
    if removed == 0:
        return indptr, indices, 0
    counts = np.bincount(rows[keep], minlength=n)
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=new_indptr[1:])
    return new_indptr, indices[keep], removed


def symmetrize(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Undirected adjacency (CSR, both directions, no self loops, no duplicates) of a directed CSR."""
    import scipy.sparse as sp   # (here, not at import: every waiting rank of g3-partition imports this module)
    n = len(indptr) - 1
    # boolean entries: the sum is a logical or, so duplicated edges can never cancel out (an int8 count wrapped to 0
    # for 256 copies of an edge)
    a = sp.csr_matrix((np.ones(len(indices), dtype=bool), np.asarray(indices), np.asarray(indptr)), shape=(n, n))
    s = (a + a.T).tocsr()
    s.sort_indices()
    # the diagonal is dropped by a mask: scipy's setdiag(0) first inserts the missing diagonal entries, 2x the cost
    # of the whole rest
    indptr, indices, _ = strip_self_loops(s.indptr.astype(np.int64), s.indices.astype(np.int64))
    return indptr, indices


def vertex_weights(balance: str, in_degree: np.ndarray, train_mask: np.ndarray) -> np.ndarray | None:
    n = len(in_degree)
    if balance == "nodes":
        return None
    if balance == "edges":
        return (in_degree + 1).astype(np.int64)
    if balance == "both":
        return np.stack([np.ones(n, dtype=np.int64), np.asarray(in_degree, dtype=np.int64)], axis=1).ravel()
    if balance == "mixed":
        mean = max(1, int(round(in_degree.sum() / max(1, n))))
        return (mean + in_degree).astype(np.int64)
    if balance == "train":
        t = int(train_mask.sum())
        if t == 0:
            return None
        return (1 + train_mask.astype(np.int64) * -(-n // t)).astype(np.int64)
    raise ValueError(f"unknown balance {balance!r} (choose from {', '.join(BALANCES)})")


def metis_partition(indptr, indices, num_parts: int, *, balance: str = "nodes", in_degree=None, train_mask=None,
                    seed: int = 0, sym: tuple[np.ndarray, np.ndarray] | None = None,
                    recursive: bool | None = None, objective: str = "cut",
                    imbalance: float = 1.10) -> tuple[np.ndarray, dict]:
    """Node→part assignment from METIS on the symmetrized graph. Returns (assignment, info).

    ``recursive``: recursive bisection (True) or k-way (False); None is pymetis's default (bisection for
    P <= 8, k-way above), except for ``balance="both"``: k-way (bisection applies the tolerance to each
    bisection, and misses it: R-MAT 14 into 4 parts, 1.21x the mean edges for 1.10). ``objective``: ``cut``
    (METIS's default) or ``volume`` (METIS_OBJTYPE_VOL: the total communication volume; k-way only, so
    ``recursive`` must not be True). ``imbalance``: the tolerance of
    both constraints of ``balance="both"`` (METIS's ufactor; the other balances keep METIS's default)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown METIS objective {objective!r} (choose from {', '.join(OBJECTIVES)})")
    if objective == "volume":
        if recursive:
            raise ValueError("METIS minimises the communication volume only in k-way mode (recursive=False)")
        recursive = False
    n = len(indptr) - 1
    if in_degree is None:
        in_degree = np.diff(indptr)
    if train_mask is None:
        train_mask = np.zeros(n, dtype=bool)
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64), dict(balance=balance, metis_objective=objective, metis_edge_cut=0)
    xadj, adjncy = sym if sym is not None else symmetrize(indptr, indices)
    vw = vertex_weights(balance, np.asarray(in_degree), np.asarray(train_mask))
    size = f"{n} nodes, {len(adjncy)} symmetric adjacency entries"
    check_idx_range(len(adjncy), n if vw is None else int(vw.sum()), size)
    opts = pymetis.Options(seed=int(seed), objtype=OBJECTIVES.index(objective))  # METIS_OBJTYPE_CUT = 0, VOL = 1
    extra = {}
    if balance == "both":
        opts.ufactor = ufactor(imbalance)
        extra = dict(metis_constraints=2, metis_ufactor=opts.ufactor)
    failure, t0 = None, time.monotonic()
    with c_stdout_captured() as said:
        try:
            if balance == "both":
                objval, part = multi_constraint(num_parts, xadj, adjncy, vw, 2, opts, bool(recursive))
            else:
                res = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw, options=opts,
                                         recursive=recursive)
                objval, part = res.edge_cuts, res.vertex_part
        except Exception as e:  # noqa: BLE001 - whatever the library raised is reported as one line
            failure = e
    if failure is not None:
        printed = "; ".join(summarise_messages(said[0])) if said else ""
        raise MetisError(f"METIS failed after {time.monotonic() - t0:.0f} s on {size}: {type(failure).__name__}: "
                         f"{str(failure).strip() or 'no message'}" + (f" (METIS said: {printed})" if printed else ""))
    part = np.asarray(part, dtype=np.int64)
    part, filled = fill_empty_parts(part, num_parts, np.diff(xadj))
    # METIS returns its objective's value (the edge cut, or the total communication volume) of its own assignment
    info = dict(balance=balance, metis_objective=objective, **extra,
                **{"metis_edge_cut" if objective == "cut" else "metis_volume": int(objval)})
    if filled:
        info["empty_parts_filled"] = filled
    if said:
        info["metis_messages"] = summarise_messages(said[0])
    return part, info


def ufactor(imbalance: float) -> int:
    """METIS's ``ufactor`` (the allowed imbalance in thousandths above 1) for a cap of ``imbalance`` x the mean,
    rounded down so that METIS's target is never looser than the cap; at least 1 (METIS refuses 0)."""
    if not (math.isfinite(imbalance) and imbalance >= 1):
        raise ValueError(f"the METIS imbalance must be finite and >= 1, got {imbalance}")
    return max(1, int(math.floor(1000 * (imbalance - 1) + 1e-6)))


def metis_library() -> ctypes.CDLL:
    """The METIS library that pymetis is linked with (its extension module exports METIS's API)."""
    from pymetis import _internal
    return ctypes.CDLL(_internal.__file__)


def multi_constraint(num_parts: int, xadj: np.ndarray, adjncy: np.ndarray, vwgt: np.ndarray, ncon: int,
                     opts, recursive: bool) -> tuple[int, np.ndarray]:
    """(objective value, part) of METIS with ``ncon`` balance constraints: ``vwgt`` holds ``ncon`` weights per
    vertex, vertex by vertex. Calls METIS_PartGraphRecursive / METIS_PartGraphKway of :func:`metis_library` with
    pymetis's options (``opts``: seed, objective, ufactor; ubvec and tpwgts NULL, so every constraint's tolerance
    is ``1 + ufactor / 1000``). The arrays are passed without a copy where they already have METIS's ``idx_t``."""
    idx = np.dtype(pymetis.zero_copy_dtype())
    c_idx = {4: ctypes.c_int32, 8: ctypes.c_int64}[idx.itemsize]
    n = len(xadj) - 1
    xadj, adjncy, vwgt = (np.ascontiguousarray(a, dtype=idx) for a in (xadj, adjncy, vwgt))
    if len(vwgt) != n * ncon:
        raise ValueError(f"{len(vwgt)} vertex weights for {n} vertices and {ncon} constraints")
    options = np.array([opts._get(i) for i in range(pymetis.Options._len())], dtype=idx)
    part = np.zeros(n, dtype=idx)
    ints = [np.array([v], dtype=idx) for v in (n, ncon, num_parts, 0)]   # nvtxs, ncon, nparts, objval

    def ptr(a):
        return a.ctypes.data_as(ctypes.POINTER(c_idx))
    lib = metis_library()
    fn = lib.METIS_PartGraphRecursive if recursive else lib.METIS_PartGraphKway
    fn.restype = ctypes.c_int
    status = fn(ptr(ints[0]), ptr(ints[1]), ptr(xadj), ptr(adjncy), ptr(vwgt), None, None, ptr(ints[2]), None,
                None, ptr(options), ptr(ints[3]), ptr(part))
    if status != METIS_OK:
        name = "METIS_PartGraphRecursive" if recursive else "METIS_PartGraphKway"
        what = {-2: "input error", -3: "out of memory", -4: "error"}.get(status, f"status {status}")
        raise RuntimeError(f"{name} with {ncon} constraints returned {what}")
    return int(ints[3][0]), part


def check_idx_range(entries: int, total_weight: int, size: str) -> None:
    """MetisError when this pymetis's ``idx_t`` (32 or 64 bits, fixed when it was built) cannot count the
    adjacency entries or the summed vertex weight, which METIS would overflow instead of refusing."""
    dtype = pymetis.zero_copy_dtype()
    top = int(np.iinfo(dtype).max)
    if max(entries, total_weight) > top:
        what = "adjacency entries" if entries > top else "summed vertex weights"
        raise MetisError(f"the graph ({size}) is too large for this METIS build: its {what} exceed the "
                         f"{dtype.itemsize * 8}-bit idx_t (at most {top})")


@contextlib.contextmanager
def c_stdout_captured():
    """Capture what C code writes to file descriptor 1 while the block runs (METIS prints its warnings there
    with printf, e.g. "***Cannot bisect a graph with 0 vertices!" when P nears N, which would end up in a
    tool's standard output). Yields a list that holds the captured text afterwards (empty when nothing was
    written). C's stdio buffer is flushed before fd 1 is restored, so nothing leaks out later; where that flush is
    not available (no C library found) nothing is captured."""
    said = []
    try:
        libc = ctypes.CDLL(None)
        saved = os.dup(1)
    except (OSError, AttributeError):
        yield said
        return
    sys.stdout.flush()
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 1)
            try:
                yield said
            finally:
                libc.fflush(None)
                os.dup2(saved, 1)
                tmp.seek(0)
                text = tmp.read().decode(errors="replace")
                if text:
                    said.append(text)
    finally:
        os.close(saved)


def summarise_messages(text: str) -> list[str]:
    """METIS's printed lines, each once in order of first appearance, stripped of its '***' prefix, with
    '(N times)' when repeated."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        line = line.strip().lstrip("*").strip()
        if line:
            counts[line] = counts.get(line, 0) + 1
    return [line if k == 1 else f"{line} ({k} times)" for line, k in counts.items()]


def fill_empty_parts(part: np.ndarray, num_parts: int, degree: np.ndarray) -> tuple[np.ndarray, int]:
    """Give every empty part one node: METIS leaves parts empty when P nears N (Cora: 505 of 512 parts used).
    Each empty part, in ID order, takes the lowest-degree node (ties: lowest ID) of the part that has most nodes
    at that moment. Returns (assignment, number of parts filled); a rank never starts with nothing to own."""
    count = np.bincount(part, minlength=num_parts)
    empty = np.flatnonzero(count == 0)
    if not len(empty):
        return part, 0
    if len(part) < num_parts:
        raise ValueError(f"cannot give {num_parts} parts a node each with {len(part)} nodes")
    part = part.copy()
    for p in empty:  # only when P is close to N, so at most P small scans
        q = int(np.argmax(count))
        members = np.flatnonzero(part == q)
        v = members[np.argmin(degree[members])]
        part[v] = p
        count[q] -= 1
        count[p] += 1
    return part, len(empty)
