"""Where a rank's start-up and shut-down go: consecutive phases, each timed from the end of the one before.

g3-train marks a phase's end as it passes it (:meth:`Phases.mark`); the start-up's first phase begins when the
process started (Linux: ``/proc/self/stat``), so that the interpreter, MPI's initialisation and the imports
count too. summary.json has them (``startup``: the longest of any rank for each phase, what the job waited for;
``shutdown``: rank 0's writing of the outputs), beside the epochs' times: a short run's wall time is mostly
these. No torch here.
"""
from __future__ import annotations

import os
import time


def process_age_s() -> float | None:
    """Seconds since this process started (Linux, to the kernel's clock tick), None where that is unknown."""
    try:
        with open("/proc/self/stat") as f:
            # the fields after the command name in parentheses; starttime is field 22 of the whole line
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Phases:
    """Named phases of seconds, in the order first marked (a phase marked twice adds up). ``start``: the
    ``time.monotonic()`` at which the first phase began (default: now)."""

    def __init__(self, start: float | None = None):
        self.t = time.monotonic() if start is None else start
        self.seconds: dict[str, float] = {}

    @classmethod
    def since_process_start(cls) -> "Phases":
        """Phases whose first began when this process started (now, where that is unknown)."""
        return cls(time.monotonic() - (process_age_s() or 0.0))

    @classmethod
    def of(cls, seconds: dict[str, float]) -> "Phases":
        """Phases of these seconds (e.g. the longest of every rank's)."""
        p = cls()
        p.seconds = dict(seconds)
        return p

    def mark(self, name: str) -> None:
        """The phase ``name`` ends now: the seconds since the last mark are its own."""
        now = time.monotonic()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.t
        self.t = now

    def rounded(self) -> dict[str, float]:
        """The phases and their total, in milliseconds' precision (for summary.json)."""
        out = {k: round(v, 3) for k, v in self.seconds.items()}
        out["total"] = round(sum(self.seconds.values()), 3)
        return out
