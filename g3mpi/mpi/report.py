"""One report per job: the ranks' errors gathered, grouped, and said once, by rank 0.

When a step fails on several ranks, each rank knows its own error; printing it on every rank gives P copies of one
message at P ranks. Here every rank hands its error (or None) to one text allgather, and rank 0 writes one line per
distinct message, naming the ranks that had it::

    g3-train: error: [ranks 0-63] p2/meta.json: the partition has 2 parts but 64 ranks were started (...)
    g3-train: error: [rank 5] p/part-00005.h5: checksum mismatch (...)

Lines come in the order of the lowest rank of each message. The gather is passed in (any function from this
rank's message to every rank's, in rank order: ``Watchdog.allgather_text`` with its deadline, or
:func:`g3mpi.mpi.collectives.allgather_text`), so this module needs no torch and no communicator of its own.
"""
from __future__ import annotations

from typing import Callable, Sequence

from .abort import write_line


def rank_list(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``"0-2,5,7-8"``: runs of consecutive ranks as ``first-last``."""
    out, rs = [], sorted(ranks)
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        out.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(out)


def who(ranks: Sequence[int]) -> str:
    """``"rank 3"`` or ``"ranks 0-2,5"``."""
    return f"rank{'' if len(ranks) == 1 else 's'} {rank_list(ranks)}"


def grouped(errs: Sequence[str | None]) -> list[tuple[list[int], str]]:
    """(ranks, message) for each distinct message of ``errs`` (rank r's error or None), in order of the lowest
    rank that had it."""
    groups: dict[str, list[int]] = {}
    for r, e in enumerate(errs):
        if e is not None:
            groups.setdefault(e, []).append(r)
    return [(ranks, msg) for msg, ranks in groups.items()]


def report_lines(prog: str, errs: Sequence[str | None]) -> list[str]:
    """The job's error lines: ``{prog}: error: [ranks 0-3] message``, one per distinct message."""
    return [f"{prog}: error: [{who(ranks)}] {msg}" for ranks, msg in grouped(errs)]


def report(rank: int, prog: str, errs: Sequence[str | None], write: Callable[[str], None] = write_line) -> None:
    """Rank 0 writes the job's lines for ``errs`` (every rank's error or None); the other ranks write nothing."""
    if rank == 0:
        for line in report_lines(prog, errs):
            write(line)


def agree(rank: int, prog: str, err: str | None, gather: Callable[[str | None], list],
          write: Callable[[str], None] = write_line) -> list[int]:
    """Every rank's ``err`` (this rank's error, or None) through ``gather`` (every rank calls it); rank 0 reports
    them (:func:`report`). Returns the ranks that failed, the same list on every rank (empty: none did)."""
    errs = gather(err)
    report(rank, prog, errs, write)
    return [r for r, e in enumerate(errs) if e is not None]
