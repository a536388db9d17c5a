"""Pairwise check, before any exchange, that each neighbour sends exactly the halo rows this rank expects.

Each part file is validated on its own when it is read; what a single file cannot show is whether its halo
slice for neighbour q matches what q's file sends (parts of different partitions or versions, a file edited and
re-checksummed, a partitioner bug). A mismatch would make the exchange deadlock (one side waits for a message
the other never sends) or read rows of the wrong size or nodes.

1. ``Alltoall`` of one pair of integers per rank pair: rows I send you, rows I expect from you. Both sides
   learn both numbers, so no later message can be waited for in vain.
2. For every pair where the sender announces rows, point-to-point: the sender sends the SHA-256 of the global
   IDs it sends (``owned_start + send_rows``) and that of their in- and out-degrees, the receiver compares them
   with those of its halo slice (the halo rows' degrees normalise GCN's aggregation; a part file can check its
   owned rows' in-degrees against its CSR, not its halo rows').

Every rank returns its own problem (or None); the caller agrees on the outcome with the other ranks. With an
active watchdog (``--comm-timeout``) both steps wait with its deadline: a rank that never arrives ends the job with
one line naming the start-up check ``'halo lists'`` (and, in step 2, the neighbour).
"""
from __future__ import annotations

import hashlib

import numpy as np
from g3mpi.mpi.watchdog import Watchdog

_TAG = 7311
#: the name of this check in the watchdog's messages
WAIT = "start-up check 'halo lists'"


def _digest(*arrays: np.ndarray) -> np.ndarray:
    """SHA-256 of each array as int64, concatenated (32 bytes each)."""
    return np.concatenate([np.frombuffer(hashlib.sha256(np.ascontiguousarray(a, dtype=np.int64).tobytes()).digest(),
                                         dtype=np.uint8) for a in arrays])


def check_neighbours(comm, part, name_of=lambda p: f"part {p}", watchdog: Watchdog | None = None) -> str | None:
    """Compare this rank's halo slices with what each neighbour sends. Collective over ``comm``; the part of
    rank r must be part r. ``watchdog`` (on ``comm``) bounds the waits; without one they block. Returns a
    one-line description of the first problem on this rank, or None."""
    wd = watchdog or Watchdog(comm, 0)
    P = comm.size
    counts = np.zeros((P, 2), dtype=np.int64)   # [q] = (rows I send to q, rows I expect from q)
    send_ids, recv_ids = {}, {}   # [q] = (global IDs, their in- and out-degrees)
    try:
        for i, q in enumerate(np.asarray(part.send_parts).tolist()):
            rows = np.asarray(part.send_rows[part.send_offsets[i]:part.send_offsets[i + 1]], dtype=np.int64)
            counts[q, 0] = len(rows)
            send_ids[q] = (part.owned_start + rows,
                           np.concatenate([part.in_degree[rows], part.out_degree[rows]]))
        n = part.num_owned
        for i, q in enumerate(np.asarray(part.recv_parts).tolist()):
            lo, hi = int(part.recv_offsets[i]), int(part.recv_offsets[i + 1])
            counts[q, 1] = hi - lo
            recv_ids[q] = (np.asarray(part.halo_ids[lo:hi], dtype=np.int64),
                           np.concatenate([part.in_degree[n + lo:n + hi], part.out_degree[n + lo:n + hi]]))
        local = None
    except Exception as e:  # noqa: BLE001 - a malformed part must not leave the other ranks in the collective
        counts[:] = 0
        send_ids, recv_ids = {}, {}
        local = f"its neighbour lists are malformed ({type(e).__name__}: {e})"
    theirs = np.zeros_like(counts)              # [q] = (rows q sends me, rows q expects from me)
    wd.alltoall(counts, theirs, WAIT)
    reqs, peers, got = [], [], {}
    for q in range(P):
        if theirs[q, 0] > 0:
            got[q] = np.zeros(64, dtype=np.uint8)
            reqs.append(comm.Irecv(got[q], source=q, tag=_TAG))
            peers.append(q)
    for q, ids in send_ids.items():
        reqs.append(comm.Isend(_digest(*ids), dest=q, tag=_TAG))
        peers.append(q)
    wd.waitall(reqs, peers, WAIT)
    if local:
        return local
    for q in range(P):
        sends, mine = int(theirs[q, 0]), int(counts[q, 1])
        if sends != mine:
            return (f"halo from {name_of(q)} (rank {q}) has {mine} rows here but {name_of(q)} sends {sends} "
                    "(parts from different partitions or a corrupt partition)")
        if not mine:
            continue
        want = _digest(*recv_ids[q])
        if not np.array_equal(got[q][:32], want[:32]):
            return (f"the {mine} halo node IDs from {name_of(q)} (rank {q}) differ from the rows {name_of(q)} "
                    "sends (parts from different partitions or a corrupt partition)")
        if not np.array_equal(got[q][32:], want[32:]):
            return (f"the degrees of the {mine} halo nodes from {name_of(q)} (rank {q}) differ from those "
                    f"{name_of(q)} gives its rows (parts from different partitions or a corrupt partition)")
    return None
