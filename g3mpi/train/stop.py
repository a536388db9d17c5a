"""Stopping at an epoch boundary on a signal, with a checkpoint, so that ``--resume`` continues the run.

A batch job that reaches its time limit is killed: SLURM sends SIGTERM to every task, then SIGKILL ``KillWait``
seconds later (30 s by default), and ``sbatch --signal=USR1@T`` (``jobs/slurm/train.sbatch`` asks for it) sends
SIGUSR1 ``T`` seconds before the limit. ``scancel --signal=USR1 JOB`` and ``kill`` do the same by hand, and
MPICH's ``mpiexec`` forwards SIGTERM and SIGUSR1 to every rank. Without a handler all epochs since the last
checkpoint would be lost.

While a :class:`StopSignals` is active such a signal only records its name. The trainer agrees on it across ranks
at the next epoch's loss allreduce (one more number in a message that is sent anyway), finishes that epoch,
writes the checkpoint and returns; ``g3-train`` then exits with :data:`EXIT_STOPPED` on every rank. A second
stop signal while the first is pending ends the process at once (the signal's default action): an impatient
user, or SLURM's SIGTERM at the limit after an early SIGUSR1, is never ignored. SIGINT (Ctrl-C) is left alone:
it stops at once, as it always did.
"""
from __future__ import annotations

import os
import signal
import threading

#: exit status of a run that a signal stopped after its checkpoint was written (sysexits' EX_TEMPFAIL: a
#: temporary failure, to be continued with ``--resume``)
EXIT_STOPPED = 75
#: the signals that ask for a stop at the next epoch boundary
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` set :attr:`received` (the first signal's name, e.g.
    ``"SIGTERM"``) instead of ending the process; on exit the previous handlers come back.

    Only the main thread can install signal handlers (Python's rule); elsewhere this does nothing and
    :attr:`received` stays None."""

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = tuple(signals)
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.received is not None:   # a second signal: the default action, now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.received = signal.Signals(signum).name

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}
