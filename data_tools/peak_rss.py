"""Run a command and record its peak resident memory: the per-process figure the scale benchmark reports.

    python -m data_tools.peak_rss DIR CMD [ARGS...]
    mpiexec -n 4 python -m data_tools.peak_rss DIR python -m mpi4py -m data_tools.partition ...

Runs CMD as a child, waits for it and writes ``DIR/<host>-<pid>.json`` with the child's peak RSS (``ru_maxrss``
from ``wait4``, which also covers children it waited for), its wall time and exit status; then exits with CMD's
status. Under mpiexec every rank gets a wrapper of its own, so DIR ends with one record per rank, measured from
outside the tool (no tool's own bookkeeping counted or missed). The wrapper itself never initialises MPI: file
descriptors are inherited, so the child finds the launcher's PMI connection. SIGINT and SIGTERM are passed on.
A tool that resets its own high-water mark (``/proc/self/clear_refs``, as g3-prepare's per-stage meter does) is
seen here only from its last reset on: take such a tool's own record.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def read_records(directory) -> list[dict]:
    """The records in ``directory``, ordered by host and process ID."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 2:
        print("usage: python -m data_tools.peak_rss DIR CMD [ARGS...]", file=sys.stderr)
        return 2
    directory, cmd = Path(argv[0]), argv[1:]
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    try:
        child = subprocess.Popen(cmd, close_fds=False)
    except OSError as e:
        print(f"peak_rss: error: cannot run {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    while True:
        try:
            _, status, usage = os.wait4(child.pid, 0)
            break
        except InterruptedError:
            continue
    child.returncode = os.waitstatus_to_exitcode(status)
    record = dict(host=socket.gethostname(), pid=child.pid, command=cmd, returncode=child.returncode,
                  seconds=round(time.time() - t0, 3), peak_rss_bytes=int(usage.ru_maxrss) * 1024)
    path = directory / f"{record['host']}-{child.pid}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


if __name__ == "__main__":
    sys.exit(main())
