"""What a multi-rank job says when it fails: one report for the job (g3mpi.mpi.report), checked alike in every
tool's tests."""
from __future__ import annotations

#: MPICH's line for each rank that called MPI_Abort (the launcher noise an agreed exit must not add)
ABORT_NOISE = "application called MPI_Abort"


def job_errors(stderr: str, prog: str) -> list[str]:
    """The ``{prog}: error: ...`` lines of a job's stderr, after asserting that no rank aborted the job."""
    assert ABORT_NOISE not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.startswith(f"{prog}: error: ")]


def one_error(stderr: str, prog: str, ranks: str) -> str:
    """The job's one error line, which names ``ranks`` (e.g. ``"ranks 0-3"``): its message."""
    lines = job_errors(stderr, prog)
    assert len(lines) == 1, stderr
    head = f"{prog}: error: [{ranks}] "
    assert lines[0].startswith(head), stderr
    return lines[0][len(head):]
