"""MPI helper: the stream path's blocked passes give the same arrays whatever the block size.

mpiexec -n R python -m mpi4py -m tests.mpi_stream_blocks GRAPH.h5 [DIR]
Every rank builds its LocalGraph (both the directed and the symmetric path) and its OwnRows with blocks of 3 edges
and of the default size, and compares them with a reference built the direct way (whole-slice arrays, one argsort)
and with each other, array for array; with DIR, the ranks also write a partition into DIR/small (parts written in
blocks of 3 edges and one row) and DIR/default, which must hold the same arrays. Exits non-zero on any difference.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from g3mpi.mpi.collectives import alltoallv, exchange_counts, rank_bounds
from pathlib import Path

from data_tools.parallel_build import OwnRows, gather_rows, gather_values, relabel_local, write_partition_parallel
from data_tools.partitioners.stream import local_graph
from data_tools.slices import read_slice
from g3mpi.format import open_graph, read_part
from g3mpi.format.partition import ARRAYS


def reference(comm, bounds, indptr, indices, symmetric):
    """(indptr, global neighbour IDs) of the symmetrised rows without self loops: the plain construction."""
    lo, hi = int(bounds[comm.rank]), int(bounds[comm.rank + 1])
    rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr))
    src = indices.astype(np.int64)
    if not symmetric:
        owner = np.searchsorted(bounds, src, side="right") - 1
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=comm.size).astype(np.int64)
        back = alltoallv(comm, np.stack([src[order], rows[order]], axis=1), counts, exchange_counts(comm, counts))
        rows, src = np.concatenate([rows, back[:, 0]]), np.concatenate([src, back[:, 1]])
    keep = rows != src
    order = np.argsort(rows[keep], kind="stable")
    rows, src = rows[keep][order], src[keep][order]
    ptr = np.zeros(hi - lo + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows - lo, minlength=hi - lo), out=ptr[1:])
    return ptr, src


def global_ids(lg):
    return np.concatenate([lg.lo + np.arange(lg.num_own, dtype=np.int64), lg.ghosts])[lg.cols]


def written(comm, path, bounds, out: Path, P: int, **blocks) -> None:
    sl = read_slice(path, bounds, comm.rank)
    lg = local_graph(comm, bounds, sl.indptr, sl.indices, bool(sl.attrs["symmetric"]))
    if comm.rank == 0:
        out.mkdir()
    comm.Barrier()
    write_partition_parallel(comm, out, sl, lg, (sl.lo + np.arange(sl.num_rows)) % P, P, partition_id="x",
                             method="stream", seed=0, extra_meta={}, **blocks)


def compare_writes(comm, path, bounds, out: Path) -> list:
    P = 3
    written(comm, path, bounds, out / "small", P, block_edges=3, block_bytes=1)
    written(comm, path, bounds, out / "default", P)
    bad = []
    if comm.rank == 0:
        for q in range(P):
            a, b = read_part(out / "small", q), read_part(out / "default", q)    # (their checksums verified)
            bad += [f"part {q}: {k} differs with blocks of 3 edges" for k in ARRAYS
                    if not (getattr(a, k).dtype == getattr(b, k).dtype and np.array_equal(getattr(a, k),
                                                                                          getattr(b, k)))]
    return bad


def main(path, out=None) -> int:
    comm = MPI.COMM_WORLD
    with open_graph(path) as f:
        n = int(f.attrs["num_nodes"])
    bounds = rank_bounds(n, comm.size)
    bad = []
    for symmetric in (False, True):
        sl = read_slice(path, bounds, comm.rank)
        ptr, nb = reference(comm, bounds, sl.indptr, sl.indices, symmetric)
        small = local_graph(comm, bounds, sl.indptr, sl.indices, symmetric, block_edges=3)
        big = local_graph(comm, bounds, sl.indptr, sl.indices, symmetric)
        for name, lg in (("3", small), ("default", big)):
            if not (np.array_equal(lg.indptr, ptr) and np.array_equal(global_ids(lg), nb)
                    and np.array_equal(lg.ghosts, np.unique(nb[(nb < lg.lo) | (nb >= lg.lo + lg.num_own)]))):
                bad.append(f"local_graph(symmetric={symmetric}, block_edges={name}) differs from the reference")
        if not (np.array_equal(small.cols, big.cols) and small.cols.dtype == big.cols.dtype):
            bad.append(f"local_graph(symmetric={symmetric}): block sizes disagree")
    parts = np.arange(sl.num_rows) % 3
    new_ids, _ = relabel_local(comm, parts, 3, np.zeros(len(parts), dtype=np.int64))
    a, b = OwnRows(comm, sl, big, new_ids, block_edges=3), OwnRows(comm, sl, big, new_ids)
    for k in ("loops", "in_deg", "out_deg", "cols", "row_len"):
        if not np.array_equal(getattr(a, k), getattr(b, k)):
            bad.append(f"OwnRows.{k}: block sizes disagree")
    rows = np.random.default_rng(comm.rank).permutation(sl.num_rows)
    if not np.array_equal(gather_values(sl.indptr, rows, sl.indices, block_edges=3),
                          sl.indices[gather_rows(sl.indptr, rows)]):
        bad.append("gather_values(block_edges=3) differs from gather_rows")
    if out is not None:
        bad += compare_writes(comm, path, bounds, Path(out))
    for line in bad:
        print(f"rank {comm.rank}: {line}", file=sys.stderr, flush=True)
    return 1 if comm.allreduce(len(bad)) else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
