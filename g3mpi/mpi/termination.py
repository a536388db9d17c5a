"""SIGTERM and SIGHUP as exceptions, so that a data tool stopped by a batch system cleans up after itself.

A batch job that reaches its time limit, or is cancelled, gets SIGTERM and, ``KillWait`` seconds later, SIGKILL;
closing a terminal sends SIGHUP. Python's default action for both ends the process at once: no ``finally`` runs,
and a half-written output's temporary (``.OUT.HOST-PID.*.tmp``, possibly gigabytes) stays beside it. Under
``terminate_as_interrupt`` the signal raises ``Terminated`` instead, a ``KeyboardInterrupt``, so the same paths that
clean up after Ctrl-C run. A second signal during that clean-up is ignored (SIGKILL still ends the process), and a
signal arriving inside a long C call (METIS) takes effect when it returns. What a SIGKILL leaves is removed by the
next write of the same output (``g3mpi.format.stale.remove_stale_temporaries``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: the signals received inside terminate_as_interrupt: its exception can be lost (see raise_if_terminated)
_received: list[int] = []


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
    handlers come back on exit. A ``Terminated`` lost in a ``__del__`` or weakref callback is not printed as
    "Exception ignored": the writers inside call ``raise_if_terminated`` before they commit their output."""
    def handler(signum, frame):
        for s in signals:
            signal.signal(s, signal.SIG_IGN)
        _received.append(signum)
        raise Terminated(signum)

    def unraisable(u):
        if not isinstance(u.exc_value, Terminated):
            previous_hook(u)

    _received.clear()
    previous = {s: signal.signal(s, handler) for s in signals}
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        sys.unraisablehook = previous_hook
        _received.clear()


def raise_if_terminated() -> None:
    """Raise ``Terminated`` again if a signal arrived whose exception was lost.

    A signal handled while Python runs a ``__del__`` or a weakref callback (h5py and tqdm have them) raises there,
    where Python prints "Exception ignored in ..." and carries on; the handler then ignores further signals, so
    the command would finish and exit 0. A writer calls this before it commits its output."""
    if _received:
        raise Terminated(_received[0])


def exit_after_failed_write(status: int = 1) -> None:
    """End the command now, its error line already printed: h5py/HDF5 crash tearing down a file whose write
    failed (a full disk: exit 139 after the line), and the temporary output is gone already."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def interruption(e: KeyboardInterrupt) -> str:
    """How a command says it was stopped: ``terminated by SIGTERM`` or ``interrupted`` (Ctrl-C)."""
    return f"terminated by {e}" if isinstance(e, Terminated) else "interrupted"
