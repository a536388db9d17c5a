"""How a serial data tool's failed run ends (g3-prepare, g3-partition's serial methods): its one error line,
``PROG: error: ...``, and its exit status; the one map of both tools' failures to a status."""
from __future__ import annotations

import os
import sys

from g3mpi.format import FormatError
from g3mpi.mpi.termination import exit_after_failed_write, interruption

from .build import OutputWriteError

#: what :func:`failure_status` reports (anything else is a bug and keeps its traceback)
FAILURES = (FormatError, OSError, MemoryError, KeyboardInterrupt)


def failure_status(prog: str, e: BaseException, *, out, out_of_memory: str, command: bool) -> int:
    """Print the one error line of ``e`` (one of :data:`FAILURES`) and return the exit status: 1 for an input it
    refuses (FormatError: its message names the file), a failed write (OSError, OutputWriteError) or
    ``out_of_memory`` (the line for a MemoryError); for an interruption, the signal's status or 130, nothing of
    ``out`` written. ``command``: the tool's command itself (not an in-process caller), which a failed write ends
    at once (``exit_after_failed_write``: h5py may crash tearing down the failed file)."""
    if isinstance(e, KeyboardInterrupt):
        line, status = f"{out}: {interruption(e)} (no output written)", getattr(e, "exit_status", 130)
    elif isinstance(e, MemoryError):
        line, status = out_of_memory, 1
    elif isinstance(e, OSError):    # h5py's write errors (disk full, quota): the errno, or a multi-line HDF5 report
        what = os.strerror(e.errno) if isinstance(e.errno, int) else " ".join(str(e.strerror or e).split())
        line, status = f"{e.filename or out}: {what}", 1
    else:
        line, status = str(e), 1
    print(f"{prog}: error: {line}", file=sys.stderr)
    if command and isinstance(e, (OSError, OutputWriteError)):
        exit_after_failed_write()
    return status
