"""Per-stage wall time, peak memory and I/O of a data tool (g3-prepare; meant for g3-partition too).

>>> meter = StageMeter()
>>> with meter.stage("read"):
...     ...
>>> meter.records            # [{"stage": "read", "seconds": ..., "peak_rss_bytes": ..., ...}]
>>> meter.report(log)        # one info line per stage
>>> meter.write(out_path)    # OUT.prepare.json (or another name) beside the output

Peak RSS of a stage is the kernel's high-water mark of this process (``VmHWM`` in ``/proc/self/status``), reset
at the start of every stage by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0), so each stage reports
its own peak. Where the reset is refused (another OS, a locked-down /proc), the fallback is ``ru_maxrss``, the
peak since the process started: a stage's figure is then the peak so far, and ``peak_rss_source`` says so
(``"VmHWM"`` or ``"ru_maxrss (since process start)"``). Bytes written and read are ``wchar`` / ``rchar`` of
``/proc/self/io`` (every ``write``/``read`` call: output, temporaries, stdout), 0 where unavailable. Only
this process is measured (MPI callers record one meter per rank and sum them).
"""
from __future__ import annotations

import contextlib
import logging
import resource
import sys
import time
from pathlib import Path

from g3mpi.format import write_json

STATUS = "/proc/self/status"
CLEAR_REFS = "/proc/self/clear_refs"
IO = "/proc/self/io"


def _status_kib(key: str) -> int | None:
    try:
        with open(STATUS) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _io_counters() -> dict:
    try:
        with open(IO) as f:
            return {k: int(v) for k, v in (line.split(":") for line in f)}
    except (OSError, ValueError):
        return {}


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel refuses."""
    try:
        with open(CLEAR_REFS, "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _maxrss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024      # bytes on macOS, KiB on Linux


class StageMeter:
    """Measure consecutive stages of one process; ``records`` lists them in order (see the module docstring)."""

    def __init__(self):
        self.records: list[dict] = []

    @contextlib.contextmanager
    def stage(self, name: str):
        """Time and measure the block as stage ``name``; yields its record, to which the caller may add keys.
        A stage that raises is recorded too, with ``completed`` false."""
        reset = _reset_peak()
        io0 = _io_counters()
        t0 = time.perf_counter()
        rec = {"stage": name}
        done = False
        try:
            yield rec
            done = True
        finally:
            hwm = _status_kib("VmHWM") if reset else None
            io1 = _io_counters()
            rec.update(seconds=round(time.perf_counter() - t0, 3),
                       peak_rss_bytes=hwm * 1024 if hwm is not None else _maxrss_bytes(),
                       peak_rss_source="VmHWM" if hwm is not None else "ru_maxrss (since process start)",
                       bytes_written=io1.get("wchar", 0) - io0.get("wchar", 0),
                       bytes_read=io1.get("rchar", 0) - io0.get("rchar", 0))
            self.records.append(rec)
            rec["completed"] = done

    def report(self, log: logging.Logger) -> None:
        """One info line per stage (after the run: a failing tool prints only its error)."""
        for r in self.records:
            log.info("stage %-9s %8.2f s  peak RSS %7.1f MiB  wrote %7.1f MiB", r["stage"], r["seconds"],
                     r["peak_rss_bytes"] / 2**20, r["bytes_written"] / 2**20)

    def summary(self) -> dict:
        """Totals over the stages: wall seconds, the largest peak RSS, bytes written and read."""
        return {"seconds": round(sum(r["seconds"] for r in self.records), 3),
                "peak_rss_bytes": max((r["peak_rss_bytes"] for r in self.records), default=0),
                "bytes_written": sum(r["bytes_written"] for r in self.records),
                "bytes_read": sum(r["bytes_read"] for r in self.records)}

    def write(self, path, **extra) -> Path:
        """Write ``{"stages": records, "total": summary(), **extra}`` as JSON to ``path`` (atomically)."""
        path = Path(path)
        write_json(path, dict(extra, stages=self.records, total=self.summary()), sort_keys=False)
        return path
