"""What the benchmark suites produce and how it travels: :class:`BenchError`, and results as JSON between the ranks
of one run (never pickled) and on disk. Imports nothing else of the bench (the worker and the suites use it)."""
from __future__ import annotations

import json
from pathlib import Path, PurePath

import numpy as np


class BenchError(RuntimeError):
    """A benchmark could not run (the message says which step and why). ``every_rank``: raised on every rank
    together (by ``common.on_root``), not on one rank alone."""

    every_rank = False


def write_json(path: Path, obj) -> None:
    """:func:`g3mpi.format.write_json` (strict JSON, written atomically), its failures as :class:`BenchError`."""
    from g3mpi.format import FormatError
    from g3mpi.format import write_json as write
    path = Path(path)
    if path.is_dir():
        raise BenchError(f"{path}: is a directory, not a JSON file")
    try:
        write(path, obj)
    except FormatError as e:
        raise BenchError(str(e)) from None


def to_json(obj) -> str:
    """``obj`` as JSON text for the other ranks of the same run: numpy numbers and arrays as numbers and lists,
    paths as strings, NaN and infinities kept (Python's JSON reads them back). Results travel between g3-bench's
    ranks as this text, never pickled."""
    def plain(o):
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, PurePath):
            return str(o)
        raise TypeError(f"{type(o).__name__} cannot go to another rank as JSON")
    return json.dumps(obj, default=plain)


def gather_json(comm, obj) -> list | None:
    """Every rank's ``obj`` (JSON-able, see :func:`to_json`) in rank order on rank 0; None on the others."""
    from g3mpi.mpi.watchdog import Watchdog
    texts = Watchdog(comm, 0).allgather_text(to_json(obj), "g3-bench: per-rank results")
    return [json.loads(t) for t in texts] if comm.rank == 0 else None
