"""MPI helper for tests/test_train_stops.py: the watchdog's text messages between ranks, without pickle.

mpiexec -n P python -m mpi4py -m tests.mpi_watchdog
With the blocking calls and then the deadline-polled ones: every rank's text (None, empty, non-ASCII, 120 kB)
gathered by every rank, broadcast from every root, and handed round the ranks as g3-train's turns writing
predictions.h5 hand their token on. Pickle is refused first (mpi4py's lowercase calls and ``MPI.pickle``
included), so a control message that went back to pickling fails here. Exits non-zero on any mismatch.
"""
from __future__ import annotations

import pickle

from mpi4py import MPI

from g3mpi.mpi.watchdog import Watchdog

TEXTS = [None, "", "é", "→", "é→x" * 20000]
TAG = 4242


def no_pickle(*args, **kw):
    raise AssertionError("pickle used for a control message")


def refuse_pickle() -> None:
    """From now on every pickle in this process fails: mpi4py's (``MPI.pickle``, its lowercase calls) and the
    pickle module's. Also the start of tests/test_reliability_units.py's one-process watchdog scripts."""
    MPI.pickle.__init__(no_pickle, no_pickle)
    pickle.dumps = pickle.loads = no_pickle


def main() -> None:
    refuse_pickle()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    for timeout in (0.0, 30.0):
        wd = Watchdog(comm, timeout, prog="t")
        for i, text in enumerate(TEXTS):
            # each rank its own text: sizes differ between ranks
            mine = TEXTS[(i + rank) % len(TEXTS)]
            got = wd.allgather_text(mine, "g")
            assert got == [TEXTS[(i + r) % len(TEXTS)] for r in range(size)], (timeout, i, rank)
            for root in range(size):
                got = wd.bcast_text(text if rank == root else "not sent", root, "c")
                assert got == text and type(got) is type(text), (timeout, i, root, rank)
            # the token: rank 0 sends first, every other rank receives first (two blocking Sends of 120 kB would
            # wait for each other); one rank has no one to hand it to
            if size > 1:
                if rank > 0:
                    got = wd.recv_text(rank - 1, TAG, "r", turns=rank)
                    assert got == text and type(got) is type(text), (timeout, i, rank)
                wd.send_text(text, (rank + 1) % size, TAG, "s")
                if rank == 0:
                    got = wd.recv_text(size - 1, TAG, "r", turns=size - 1)
                    assert got == text and type(got) is type(text), (timeout, i, rank)
    wd.barrier("end")
    if rank == 0:
        print("WATCHDOG TEXT OK", size)


if __name__ == "__main__":
    main()
