"""Ending the whole job from one rank, with its error line reaching the user.

``MPI_Abort`` makes the launcher kill every process of the job at once. Under MPICH's hydra each rank's stderr
is a pipe to its launcher proxy, which forwards it to ``mpiexec``. A line the aborting rank wrote just before
``MPI_Abort`` can still sit in that pipe when hydra tears the job down, and is then lost: the job exits with
status 1 and an empty stderr (seen in about one run in six of a 3-rank watchdog job on 2 cores). So
:func:`abort_job` writes the line, waits until the reader has taken every byte of it from the pipe
(``FIONREAD`` on a Linux pipe counts the unread bytes, from either end) and a short grace for the launcher to
write it out, then aborts. On anything but a pipe (a file, a terminal) it aborts at once.
"""
from __future__ import annotations

import array
import fcntl
import os
import stat
import sys
import termios
import time

#: longest wait for the launcher to read the line from the pipe
DRAIN_TIMEOUT_S = 2.0
#: after the pipe is empty: time for the launcher to pass the line on before the job is torn down
FORWARD_GRACE_S = 0.2


def unread_bytes(fd: int) -> int | None:
    """Bytes written to the pipe ``fd`` that its reader has not taken yet; None if ``fd`` is not a pipe."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        n = array.array("i", [0])
        fcntl.ioctl(fd, termios.FIONREAD, n, True)
    except OSError:
        return None
    return int(n[0])


def wait_stderr_read(timeout: float = DRAIN_TIMEOUT_S, grace: float = FORWARD_GRACE_S) -> None:
    """Block until what this process wrote to stderr (fd 2) has left its pipe, at most ``timeout`` s, then
    ``grace`` s more. Returns at once when stderr is not a pipe."""
    left = unread_bytes(2)
    if left is None:
        return
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left = unread_bytes(2)
    time.sleep(grace)


def write_line(line: str) -> None:
    """Write one line to fd 2 in a single ``write()`` (lines of ranks sharing a pipe never interleave)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(2, (line.rstrip("\n") + "\n").encode(errors="replace"))


def abort_job(comm, line: str, code: int = 1, abort=None) -> None:
    """Write ``line`` to stderr, let the launcher forward it, then end every rank of ``comm``'s job
    (``comm.Abort(code)``; ``abort``, a callable taking the code, replaces it in tests)."""
    write_line(line)
    wait_stderr_read()
    (abort or comm.Abort)(code)
