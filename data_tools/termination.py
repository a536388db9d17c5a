"""SIGTERM and SIGHUP as exceptions, so that a data tool stopped by a batch system cleans up after itself.

A batch job that reaches its time limit, or is cancelled, gets SIGTERM and, ``KillWait`` seconds later, SIGKILL;
closing a terminal sends SIGHUP. Python's default action for both ends the process at once: no ``finally`` runs,
and a half-written output's temporary (``.OUT.HOST-PID.*.tmp``, possibly gigabytes) stays beside it. Under
``terminate_as_interrupt`` the signal raises ``Terminated`` instead, a ``KeyboardInterrupt``, so the same paths that
clean up after Ctrl-C run. A second signal during that clean-up is ignored (SIGKILL still ends the process), and a
signal arriving inside a long C call (METIS) takes effect when it returns. What a SIGKILL leaves is removed by the
next write of the same output (``g3mpi.format.common.remove_stale_temporaries``).
"""
from __future__ import annotations

import contextlib
import signal
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """Raised by ``terminate_as_interrupt``'s handler; ``signum`` is the signal received."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        """The shell's status for a process ended by the signal (143 for SIGTERM, 129 for SIGHUP)."""
        return 128 + self.signum


@contextlib.contextmanager
def terminate_as_interrupt(signals=SIGNALS) -> Iterator[None]:
    """Within the block, the first of ``signals`` raises ``Terminated`` and later ones are ignored; the previous
    handlers come back on exit."""
    def handler(signum, frame):
        for s in signals:
            signal.signal(s, signal.SIG_IGN)
        raise Terminated(signum)

    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def interruption(e: KeyboardInterrupt) -> str:
    """How a command says it was stopped: ``terminated by SIGTERM`` or ``interrupted`` (Ctrl-C)."""
    return f"terminated by {e}" if isinstance(e, Terminated) else "interrupted"
