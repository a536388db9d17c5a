"""A failure on some ranks while the others may be waiting for them (a user's model raising in one rank's
forward, a rank's own error inside an exchange): one report for the job, and every rank ends within seconds.

The failing rank cannot reach the next agreement: its peers wait for it in a halo exchange or a collective,
which would end only at the communication deadline (minutes). So :func:`fail_job` ends the job with
``MPI_Abort`` instead, after the failing ranks have heard of each other: each sends its message to every other
rank (text on :data:`FAIL_TAG`, never pickled) and collects the others' until none has come for
:data:`SETTLE_S` (at most :data:`SETTLE_MAX_S`). The lowest failing rank then writes one line per distinct
message, naming the ranks that had it (``g3-train: error: [ranks 0-3] ...``), and aborts; the others wait for
that abort (at most :data:`LEADER_WAIT_S`, then each says its own line and aborts). A rank that did not fail
needs to do nothing: the abort ends it wherever it waits.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .abort import wait_stderr_read, write_line
from .report import report_lines
from .watchdog import decode_text, encode_text

#: the failure notices' tag (above the exchanges' and the roll call's)
FAIL_TAG = 32003
#: the failing ranks collect each other's notices until none came for this long...
SETTLE_S = 0.5
#: ...but at most this long (then the job's lines name the ranks heard of by then)
SETTLE_MAX_S = 2.0
#: a failing rank that is not the lowest waits this long for the lowest one's abort before it aborts itself
LEADER_WAIT_S = 5.0


def fail_job(comm, prog: str, msg: str, code: int = 1, abort=None, settle: float = SETTLE_S) -> None:
    """This rank failed with ``msg`` where its peers may wait for it: tell them, collect the other failing
    ranks' messages, and end the job (``comm.Abort(code)``; ``abort``, a callable taking the code, replaces it
    in tests and then returns) with one line per distinct message written by the lowest failing rank."""
    rank, size = comm.rank, comm.size
    data = encode_text(msg)
    sends = [comm.Isend([data, MPI.BYTE], dest=r, tag=FAIL_TAG) for r in range(size) if r != rank]
    errs = {rank: msg}
    t0 = last = time.monotonic()

    def collect() -> None:
        nonlocal last
        status = MPI.Status()
        while True:
            m = comm.Improbe(source=MPI.ANY_SOURCE, tag=FAIL_TAG, status=status)
            if m is None:
                return
            buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
            m.Recv([buf, MPI.BYTE])
            errs[status.Get_source()] = decode_text(buf)
            last = time.monotonic()
    while size > 1 and time.monotonic() - last < settle and time.monotonic() - t0 < SETTLE_MAX_S:
        collect()
        time.sleep(0.01)
    if min(errs) == rank:
        for line in report_lines(prog, [errs.get(r) for r in range(size)]):
            write_line(line)
    else:   # the lowest failing rank says the job's lines and aborts: this one only waits for that
        end = time.monotonic() + LEADER_WAIT_S
        while time.monotonic() < end:
            collect()
            MPI.Request.Testall(sends)
            time.sleep(0.01)
        write_line(f"{prog}: error: [rank {rank}] {msg}")
    wait_stderr_read()
    (abort or comm.Abort)(code)
