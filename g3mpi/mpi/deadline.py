"""How long a rank may wait for its peers (no MPI here: the serial tools read these settings without starting it).

Fixed (``--comm-timeout S``), off (``0``), or adaptive, the default (``auto``): before the first steps (loading,
planning) ``max(floor, bytes / STARTUP_BYTES_PER_S)`` for the largest input a peer reads; once
:data:`WARMUP_STEPS` steps (epochs) have been timed, ``max(floor, factor x the slowest step seen)``. A job a
deadline ends exits with :data:`EXIT_STALLED`.
"""
from __future__ import annotations

import argparse

#: exit status of a job that a deadline ended (a rank stopped answering), or a stop signal that the ranks could not
#: agree on, or an orphaned rank: sysexits' EX_UNAVAILABLE. The last checkpoint is valid: resume from it
EXIT_STALLED = 69
#: the adaptive deadline's floor, seconds (``--comm-timeout-floor``)
DEFAULT_FLOOR_S = 300.0
#: the adaptive deadline's multiple of the slowest step (epoch) seen (``--comm-timeout-factor``)
DEFAULT_FACTOR = 10.0
#: steps timed before the deadline follows them (the first epochs allocate, warm caches, record a timeline)
WARMUP_STEPS = 2
#: before the first steps: seconds allowed per byte of the largest input a peer reads and plans (a slow parallel
#: filesystem, checksums, the CSR and the halo plan built from it)
STARTUP_BYTES_PER_S = 4 << 20
#: ``--comm-timeout``'s word for the adaptive deadline (stored as :data:`ADAPTIVE`)
AUTO = "auto"
ADAPTIVE = -1.0


def parse_timeout(text: str) -> float:
    """``--comm-timeout``'s value: ``auto`` (:data:`ADAPTIVE`, the default) or a finite number of seconds >= 0
    (0: off). ValueError otherwise."""
    if str(text).strip().lower() == AUTO:
        return ADAPTIVE
    v = float(text)
    if not (v == v and v >= 0 and v != float("inf")):
        raise ValueError(f"expected {AUTO} or a finite number of seconds >= 0 (0: off), got {text!r}")
    return v


def add_timeout_options(g, default_floor: float = DEFAULT_FLOOR_S) -> None:
    """``--comm-timeout`` and ``--comm-timeout-floor`` on the argparse group ``g`` (the data tools' spelling;
    g3-train declares its own beside its other settings)."""
    def timeout(text):
        try:
            return parse_timeout(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    g.add_argument("--comm-timeout", type=timeout, default=ADAPTIVE, metavar="S|auto",
                   help="end the job when a rank waits more than S seconds for another (0: off; default auto: "
                        "max(--comm-timeout-floor, the input's size / 4 MiB/s))")
    g.add_argument("--comm-timeout-floor", type=float, default=default_floor, metavar="S",
                   help=f"the adaptive deadline's floor, seconds (default {default_floor:g})")


class Deadline:
    """How long one wait for peers may last: ``fixed`` seconds (> 0), off (0), or adaptive (``fixed`` < 0):
    ``floor`` before anything is known, ``max(floor, bytes / STARTUP_BYTES_PER_S)`` once the size of the largest
    input is (:meth:`expect_input`), then ``max(floor, factor x slowest step)`` after :data:`WARMUP_STEPS` steps."""

    def __init__(self, fixed: float, floor: float = DEFAULT_FLOOR_S, factor: float = DEFAULT_FACTOR):
        self.fixed, self.floor, self.factor = float(fixed), float(floor), float(factor)
        self.startup = self.floor
        self.steps, self.slowest = 0, 0.0

    @property
    def adaptive(self) -> bool:
        return self.fixed < 0

    @property
    def seconds(self) -> float:
        """The deadline now (0: off)."""
        if not self.adaptive:
            return max(0.0, self.fixed)
        if self.steps < WARMUP_STEPS:
            return max(self.startup, self.factor * self.slowest)
        return max(self.floor, self.factor * self.slowest)

    def expect_input(self, nbytes: int) -> None:
        self.startup = max(self.floor, float(nbytes) / STARTUP_BYTES_PER_S)

    def step_done(self, seconds: float) -> None:
        self.steps += 1
        self.slowest = max(self.slowest, float(seconds))

    def describe(self, limit: str) -> str:
        """The setting as the timeout line names it."""
        if not self.adaptive:
            return f"{limit} {self.fixed:g}"
        if self.steps < WARMUP_STEPS:
            return (f"the deadline {self.seconds:.0f} s = max({limit}-floor {self.floor:g}, the input's size / "
                    f"{STARTUP_BYTES_PER_S >> 20} MiB/s), {limit} 0 turns it off")
        return (f"the deadline {self.seconds:.1f} s = max({limit}-floor {self.floor:g}, {self.factor:g} x the "
                f"slowest epoch {self.slowest:.2f} s), {limit} 0 turns it off")


