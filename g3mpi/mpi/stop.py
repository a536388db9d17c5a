"""Stopping at an epoch boundary on a signal, with a checkpoint, so that ``--resume`` continues the run.

A batch job that reaches its time limit is killed: SLURM sends SIGTERM to every task, then SIGKILL ``KillWait``
seconds later (30 s by default), and ``sbatch --signal=USR1@T`` sends SIGUSR1 ``T`` seconds before the limit
(``jobs/slurm/train.sbatch`` asks for ``B:USR1``, to its batch shell, which forwards it to the ranks and requeues
the job). ``scancel --signal=USR1 JOB`` and ``kill`` do the same by hand, and
MPICH's ``mpiexec`` forwards SIGTERM and SIGUSR1 to every rank. Without a handler all epochs since the last
checkpoint would be lost.

While a :class:`StopSignals` is active such a signal only records its name. The trainer agrees on it across ranks
at the next epoch's loss allreduce (a few more numbers in a message that is sent anyway: how many ranks got
each signal, so the stop line names it even when it reached some ranks an epoch later), finishes that epoch,
writes the checkpoint and returns; ``g3-train`` then exits with :data:`EXIT_STOPPED` on every rank.
``--time-limit S`` (:meth:`StopSignals.stop_after`) asks for the same stop S seconds after the start, without a
signal: the job launchers set it from ``G3_TIMEOUT`` beside timeout(1)'s SIGUSR1, which srun drops when it
arrives before the tasks are running. Each rank times it by its own clock and the ranks start a few milliseconds
apart, so it is agreed on like a signal (its own number in the same allreduce): passed on one rank, all stop.

One stop request often arrives twice: at a time limit or on ``scancel`` SLURM sends SIGTERM to every process of
the job, so under ``mpiexec`` inside an allocation a rank gets it from slurmstepd and again from Hydra, which
forwards what it received; a time limit and ``timeout(1)`` may also coincide. So a stop signal within
:data:`REPEAT_WINDOW` seconds of the first is the same request and is ignored. A stop signal later than that,
while the first is pending, ends the process at once (the signal's default action): an impatient user, or
SLURM's SIGTERM at the limit after an early SIGUSR1, is never ignored. SIGINT (Ctrl-C) is left alone: it stops
at once, as it always did.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

from .deadline import EXIT_STALLED

#: exit status of a run that a signal stopped after its checkpoint was written (sysexits' EX_TEMPFAIL: a
#: temporary failure, to be continued with ``--resume``)
EXIT_STOPPED = 75
#: the signals that ask for a stop at the next epoch boundary
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
#: what the epoch allreduce counts, one number each: the ranks that got each stop signal, and (last) any other
#: signal a :class:`StopSignals` was given
STOP_SLOTS = (*(s.name for s in STOP_SIGNALS), "a stop signal")
#: seconds after the first stop signal during which another one counts as the same request (a copy delivered by a
#: second path, e.g. slurmstepd and mpiexec's forwarding); a later one ends the process
REPEAT_WINDOW = 2.0
#: seconds a stop signal may wait for the main thread's Python handler, and for a main thread in the model's code
#: to leave it: one blocked in C (a model file's MPI call on one rank) never runs the handler, one in an endless
#: loop never reaches the epoch's end, so a watcher thread then ends the process (:class:`StopSignals`)
STUCK_GRACE_S = 10.0
#: how often the watcher thread checks that the rank's launcher is still its parent, seconds
ORPHAN_CHECK_S = 1.0


class StopSignals:
    """Context manager: while active, :data:`STOP_SIGNALS` set :attr:`signal_name` (the first signal's name, e.g.
    ``"SIGTERM"``) instead of ending the process; on exit the previous handlers come back.

    A stop signal within ``repeat_window`` seconds of the first is ignored (the same request, delivered twice); a
    later one ends the process with the signal's default action.

    Only the main thread can install signal handlers (Python's rule); elsewhere this does nothing and
    :attr:`signal_name` stays None."""

    def __init__(self, signals=STOP_SIGNALS, repeat_window: float = REPEAT_WINDOW, prog: str = "g3-train",
                 stuck_grace: float = STUCK_GRACE_S):
        self.signals = tuple(signals)
        self.prog, self.stuck_grace = prog, float(stuck_grace)
        self._wakeup: tuple[int, int] | None = None
        self.repeat_window = float(repeat_window)
        self._signal: str | None = None
        self._started = time.monotonic()
        self._deadline: float | None = None
        self._limit = 0.0
        self._first_at: float | None = None
        self._previous: dict = {}
        self._ignoring = False
        #: the slowest epoch so far, seconds (the trainer's watchdog keeps it here): the normal stop may take two
        self.slowest_step = 0.0

    @property
    def signal_name(self) -> str | None:
        """The first stop signal's name (``"SIGTERM"``); None while none came."""
        return self._signal

    @property
    def received_at(self) -> float:
        """When the first stop signal arrived (``time.monotonic()``); infinity while none came."""
        return self._first_at if self._first_at is not None else float("inf")

    @property
    def time_up(self) -> bool:
        """True once :meth:`stop_after`'s seconds have passed."""
        return self._deadline is not None and time.monotonic() >= self._deadline

    @property
    def limit_text(self) -> str:
        """The time limit as the stop line names it: ``"the time limit (--time-limit S)"``."""
        return f"the time limit (--time-limit {self._limit:g})"

    def stop_after(self, seconds: float) -> None:
        """Ask for a stop ``seconds`` after this object was made (the start of g3-train); 0: never. Unlike a
        signal it cannot be lost: a time limit's SIGUSR1 that reaches srun before the tasks exist is."""
        self._limit = float(seconds)
        self._deadline = self._started + self._limit if seconds > 0 else None

    def _handle(self, signum, frame):
        now = time.monotonic()
        if self._first_at is not None:
            if now - self._first_at <= self.repeat_window:   # a copy of the first request: nothing new
                return
            signal.signal(signum, signal.SIG_DFL)            # a deliberate second signal: the default action, now
            os.kill(os.getpid(), signum)
            return
        self._first_at = now
        self._signal = signal.Signals(signum).name

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.signals:
                self._previous[s] = signal.signal(s, self._handle)
            self._start_watcher()
        return self

    def _start_watcher(self) -> None:
        """The C-level handler writes each signal's number to the wakeup fd even while the main thread is blocked
        in C; a daemon thread reads it (:meth:`_watch`). Its waits time out every :data:`ORPHAN_CHECK_S`, and
        release the GIL: a main thread in a Python loop hands it over at its next switch interval (5 ms)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        if signal.set_wakeup_fd(w, warn_on_full_buffer=False) != -1:   # someone else's: leave it to them
            signal.set_wakeup_fd(-1)
            os.close(r), os.close(w)
            return
        self._wakeup = (r, w)
        mpi = sys.modules.get("mpi4py.MPI")
        # a rank among others has a launcher (Hydra's proxy, slurmstepd) as its parent; a lone process's parent
        # is a shell, which may leave it running on purpose (nohup)
        launched = mpi is not None and mpi.Is_initialized() and mpi.COMM_WORLD.size > 1
        threading.Thread(target=self._watch, args=(r, os.getppid() if launched else None),
                         name="g3-stop-watcher", daemon=True).start()

    def _watch(self, r: int, ppid: int | None) -> None:
        """Ends the process when the stop cannot happen: the Python handler has not run ``grace`` seconds after a
        stop signal (the main thread is blocked in C), or the main thread is then still in the model's code
        (an endless loop; ``grace``: :data:`STUCK_GRACE_S`, at least two of the slowest epochs, which the
        normal stop may need), or the launcher (``ppid``, the parent) is gone: nobody would end this rank."""
        wanted = {int(s) for s in self.signals}
        got, at = None, 0.0
        try:
            while True:
                if select.select([r], [], [], ORPHAN_CHECK_S)[0]:
                    data = os.read(r, 64)
                    if not data:          # the block ended (__exit__ closed the write end)
                        os.close(r)
                        return
                    if got is None:
                        got = next((signal.Signals(b) for b in data if b in wanted), None)
                        at = time.monotonic()
                if self._wakeup is None or self._ignoring:
                    continue
                if ppid is not None and os.getppid() != ppid:
                    self._end(f"its launcher is gone (parent process {ppid} exited); exiting", EXIT_STALLED)
                if got is None or time.monotonic() - at < max(self.stuck_grace, 2 * self.slowest_step):
                    continue
                waited = f"{time.monotonic() - at:.0f} s"
                if self._first_at is None:
                    self._end(f"{got.name} received, but the main thread has been blocked in a C call for "
                              f"{waited}{main_thread_at(any_code=True)} (an MPI call on this rank only?): exiting",
                              128 + got)
                where = main_thread_at()
                if where:
                    # (the wait's minimum, not its length: ranks looping alike then say the same, one line)
                    self._end(f"{got.name} received over {self.stuck_grace:g} s ago, but the main thread is still "
                              f"running the model's code{where} (an endless loop?) and cannot reach the epoch's end: "
                              f"exiting",
                              128 + got, job=True)
        except OSError:
            return

    def _end(self, msg: str, code: int, job: bool = False) -> None:
        """Say ``msg`` for this rank and end it. ``job``: end the job through :func:`~g3mpi.mpi.fail.fail_job`,
        so that ranks failing alike share one line (the main thread runs Python, not MPI, so this thread's MPI
        calls cannot wait on it); a timer ends the rank alone if that does not end it."""
        mpi = sys.modules.get("mpi4py.MPI")
        rank = mpi.COMM_WORLD.rank if mpi is not None and mpi.Is_initialized() else 0
        line = f"{self.prog}: error: [rank {rank}] {msg}\n".encode()
        if job and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized() \
                and mpi.Query_thread() == mpi.THREAD_MULTIPLE:
            from .fail import LEADER_WAIT_S, SETTLE_MAX_S, fail_job
            fallback = threading.Timer(SETTLE_MAX_S + LEADER_WAIT_S + 3.0, self._exit_alone, (line, code))
            fallback.daemon = True
            fallback.start()
            fail_job(mpi.COMM_WORLD, self.prog, msg, code)
            line = b""   # (said: MPICH's abort may return before the launcher ends this rank)
        self._exit_alone(line, code)

    @staticmethod
    def _exit_alone(line: bytes, code: int) -> None:
        try:
            if line:
                os.write(2, line)
        except OSError:   # (stderr was the launcher's pipe, gone with it)
            pass
        os._exit(code)

    def __exit__(self, *exc) -> None:
        if self._wakeup is not None:
            signal.set_wakeup_fd(-1)
            r, w = self._wakeup
            self._wakeup = None
            os.close(w)
        if self._ignoring:   # the process is only exiting: the signals stay ignored
            self._previous = {}
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}

    def ignore_from_now(self) -> None:
        """Ignore the stop signals from now on, past the end of the block (a process that is only exiting:
        under srun, the first task to exit with 75 makes srun end the others, which must not turn 75 into 143)."""
        if self._previous:
            self._ignoring = True
            for s in self.signals:
                signal.signal(s, signal.SIG_IGN)


#: where the Python installation keeps the standard library and the installed packages: library code, which only
#: runs for the model's code or for g3mpi's
_LIBRARY = tuple(str(Path(p).resolve()) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
_G3MPI = str(Path(__file__).resolve().parents[1]) + os.sep


def main_thread_at(any_code: bool = False) -> str:
    """`` at FILE:LINE, in FUNCTION``: the innermost frame of the main thread outside the Python installation
    that belongs to the model's code (not to g3mpi; ``any_code``: g3mpi's too); "" when there is none."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<"):
            path = os.path.realpath(name)
            if not path.startswith(_LIBRARY):
                if any_code or not path.startswith(_G3MPI):
                    return f" at {name}:{frame.f_lineno}, in {frame.f_code.co_name}"
                return ""
        frame = frame.f_back
    return ""
