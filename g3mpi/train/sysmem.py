"""The process's system memory: resident set size now and at its peak, and glibc's allocator told to return
freed memory at once (``--release-memory``). Measurements and one allocator setting; the per-rank memory model
(what a rank should need) is :mod:`.memory`."""
from __future__ import annotations

import ctypes
import os

from g3mpi.mpi.rss import current_rss_bytes, peak_rss_bytes  # noqa: F401 - their home is the MPI base

#: allocations from this size on get their own mapping, returned to the system when freed (glibc)
MMAP_THRESHOLD = 128 * 1024


def return_freed_memory() -> bool:
    """Make freed tensors and arrays go back to the system at once (glibc ``mallopt``; idempotent).

    glibc raises its mmap threshold each time a mapped block is freed (up to 32 MiB), after which every
    allocation below it comes from the heap, whose freed space stays resident: one epoch's temporaries of a few
    MiB (interior rows, neighbour blocks, chunks) and the scipy arrays of setup then pin memory for the whole
    run (about 150 MiB per rank at 200k nodes / 4M edges). A fixed threshold keeps large blocks mapped and
    trims the heap top. Left alone if the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``,
    and a no-op without glibc. Returns whether the setting was applied."""
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold, MMAP_THRESHOLD))
