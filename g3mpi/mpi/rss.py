"""The process's resident memory now and at its peak (every MPI program here reports them per rank)."""
from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (``getrusage``; Linux reports ``ru_maxrss`` in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def peak_rss_mib() -> float:
    """:func:`peak_rss_bytes` in MiB."""
    return peak_rss_bytes() / 2**20


def current_rss_bytes() -> int:
    """Resident set size now (Linux /proc; the peak where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, IndexError, ValueError):
        return peak_rss_bytes()
