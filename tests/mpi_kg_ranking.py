"""MPI helper for tests/test_kg_ranking.py: filtered ranking over ranks (g3mpi.train.ranking) equals a
single-process computation on the whole entity table.

mpiexec -n P python -m mpi4py -m tests.mpi_kg_ranking SEED
60 entities with quantised DistMult embeddings (many exact ties), 3 relations, known triples (train, valid, test),
entities dealt to the ranks in uneven contiguous blocks (one rank may own none), a small score budget (several
rounds, ranks with different numbers of queries). Every rank checks MRR and Hits@1/3/10 against the reference
(<= 1e-9). Exits non-zero on any mismatch.
"""
from __future__ import annotations

import sys

import numpy as np
from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog
from g3mpi.train.ranking import filtered_ranks, triple_keys

N, R, D = 60, 3, 4
KS = (1, 3, 10)


def data(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.integers(-2, 3, (N, D)) / 2.0
    w = rng.integers(-2, 3, (R, D)) / 2.0
    known = np.unique(np.stack([rng.integers(0, N, 400), rng.integers(0, R, 400), rng.integers(0, N, 400)], 1), axis=0)
    test = known[rng.choice(len(known), 50, replace=False)]
    return x, w, known, test


def reference(x, w, known, test) -> dict:
    """Each test triple against every entity as tail and as head, known triples filtered out, OGB's tie rule."""
    kset = set(map(tuple, known.tolist()))
    ranks = []
    for h, r, t in test.tolist():
        for tail in (True, False):
            s = (x[h] * w[r]) @ x.T if tail else (w[r] * x[t]) @ x.T
            true = s[t] if tail else s[h]
            above = equal = 0
            for e in range(N):
                trip = (h, r, e) if tail else (e, r, t)
                if trip in kset:
                    continue
                above += s[e] > true
                equal += s[e] == true
            ranks.append(1 + above + equal / 2)
    ranks = np.array(ranks)
    return {"mrr": float((1 / ranks).mean()), **{f"hits@{k}": float((ranks <= k).mean()) for k in KS},
            "queries": len(ranks)}


def blocks(size: int, seed: int) -> np.ndarray:
    c = np.r_[0, np.sort(np.random.default_rng(seed + 3).integers(0, N, size - 1)), N]
    if size > 2:
        c[1] = c[0]     # rank 0 owns no entity
    return c


def main(argv):
    comm = MPI.COMM_WORLD
    seed = int(argv[0]) if argv else 0
    x, w, known, test = data(seed)
    c = blocks(comm.size, seed)
    lo, hi = int(c[comm.rank]), int(c[comm.rank + 1])
    own = lambda ids: (ids >= lo) & (ids < hi)      # noqa: E731
    h, r, t = test.T
    kh, kr, kt = known.T
    tq = own(h)
    hq = own(t)
    directions = [
        (x[h[tq]] * w[r[tq]], h[tq] * R + r[tq], t[tq], np.sort(triple_keys(kh[own(kt)], kr[own(kt)], kt[own(kt)], N, R))),
        (w[r[hq]] * x[t[hq]], t[hq] * R + r[hq], h[hq], np.sort(triple_keys(kt[own(kh)], kr[own(kh)], kh[own(kh)], N, R))),
    ]
    got = filtered_ranks(Watchdog(comm, 0.0), lo, x[lo:hi], directions, N, R, KS, budget=8 * 30 * 6)
    want = reference(x, w, known, test)
    assert got["queries"] == want["queries"], (got, want)
    for k in want:
        assert abs(got[k] - want[k]) <= 1e-9, (k, got, want)
    assert 0 < want["mrr"] < 1 and want["hits@1"] < want["hits@10"], want
    if comm.rank == 0:
        print("kg ranking ok", got)


if __name__ == "__main__":
    main(sys.argv[1:])
