"""MPI helper for tests/test_device.py: every rank's device for a setting and a faked GPU count.

    mpiexec -n P python -m mpi4py -m tests.mpi_device DEVICE OVERSUBSCRIBE GPUS_OF_RANK_0,GPUS_OF_RANK_1,...

Each rank calls ``select_device`` with its own count of GPUs (the list, by rank) and prints one line
``rank R: DEVICE`` or ``rank R: error: MESSAGE``; the ranks are on one node, as mpiexec starts them here.
"""
from __future__ import annotations

import sys

from mpi4py import MPI

from g3mpi.train.config import ConfigError
from g3mpi.train.device import select_device


def main() -> int:
    wanted, oversubscribe, counts = sys.argv[1], sys.argv[2] == "1", [int(c) for c in sys.argv[3].split(",")]
    comm = MPI.COMM_WORLD
    try:
        line = str(select_device(comm, wanted, oversubscribe, cuda_count=counts[comm.rank]))
    except ConfigError as e:
        line = f"error: {e}"
    lines = comm.gather(f"rank {comm.rank}: {line}")
    if comm.rank == 0:
        print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
