"""Reading numeric text tables (CSV / TSV / whitespace, optionally gzipped) in chunks, with exact line numbers.

Each chunk of lines is parsed by ``np.loadtxt`` (C speed); only when a chunk fails is it re-parsed line by
line in Python to name the first bad line, so good input pays nothing for the precise error message.
"""
from __future__ import annotations

import gzip
import io
import warnings
import zlib
from itertools import islice
from pathlib import Path
from typing import Iterator

import numpy as np

from g3mpi.format import FormatError
from g3mpi.format.errors import check_regular_file

CHUNK_LINES = 1 << 20
#: text held at once while parsing (wide tables such as OGB node features get fewer lines per chunk)
CHUNK_BYTES = 32 << 20
COMMENTS = ("#", "%")
GZIP_MAGIC = b"\x1f\x8b"
#: leading bytes of a text file checked before it is parsed (its kind, NUL bytes)
HEAD_BYTES = 4096
#: leading bytes of files that are not text (read as text, they gave misleading parse errors)
_ONLY_GZIP = "only gzip is read directly, decompress it first"
_ONLY_UTF8 = "only UTF-8 (or ASCII) text is read, convert it first (iconv -f {} -t UTF-8)"
NOT_TEXT = {b"BZh": f"bzip2-compressed: {_ONLY_GZIP}", b"\xfd7zXZ\x00": f"xz-compressed: {_ONLY_GZIP}",
            b"\x28\xb5\x2f\xfd": f"zstd-compressed: {_ONLY_GZIP}", b"PK\x03\x04": f"a zip archive: {_ONLY_GZIP}",
            b"\x93NUMPY": "a NumPy .npy file, not text", b"\x89HDF": "an HDF5 file, not text",
            # byte-order marks (Windows PowerShell 5 writes UTF-16 by default): read as UTF-8, the first line became
            # a header and the second failed on its NUL bytes
            b"\xff\xfe\x00\x00": "UTF-32 text: " + _ONLY_UTF8.format("UTF-32"),
            b"\x00\x00\xfe\xff": "UTF-32 text: " + _ONLY_UTF8.format("UTF-32"),
            b"\xff\xfe": "UTF-16 text: " + _ONLY_UTF8.format("UTF-16"),
            b"\xfe\xff": "UTF-16 text: " + _ONLY_UTF8.format("UTF-16")}


def open_text(path: Path):
    """Open a text file, transparently gunzipping ``*.gz`` (or any file starting with gzip's magic bytes);
    FormatError if missing, compressed otherwise (bzip2, xz, zstd, zip: named, not parsed as text), or UTF-16 /
    UTF-32 text with its byte-order mark (named, also inside a gzip file).

    A UTF-8 byte-order mark (written by some spreadsheet exports) is dropped ("utf-8-sig"), so it is not
    taken as part of the first field: the first line would otherwise look like a header and be skipped.
    """
    if not path.exists():
        raise FormatError(path, "no such file")
    if path.is_dir():
        raise FormatError(path, "is a directory, expected a file")
    check_regular_file(path, "text file")   # (a FIFO or a device would hang the read)
    with open(path, "rb") as f:
        magic = f.read(HEAD_BYTES)
    if path.suffix == ".gz" or magic.startswith(GZIP_MAGIC):     # also a gzipped file without the .gz suffix
        raw = gzip.open(path, "rb")
        try:
            _refuse_not_text(path, raw.peek(HEAD_BYTES)[:HEAD_BYTES], "holds")
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
            raw.close()
            raise FormatError(path, f"truncated or corrupt compressed file: {e}") from None
        except FormatError:
            raw.close()
            raise
        return io.TextIOWrapper(raw, encoding="utf-8-sig", errors="replace")
    _refuse_not_text(path, magic, "is")
    return open(path, encoding="utf-8-sig", errors="replace")


def _refuse_not_text(path: Path, head: bytes, verb: str) -> None:
    """FormatError if the first bytes of a file (``verb`` "is") or of a gzip file's content ("holds") are not
    UTF-8 text: :data:`NOT_TEXT`, or a NUL byte, which no text holds (UTF-16 without a byte-order mark, binary)."""
    for sig, what in NOT_TEXT.items():
        if head.startswith(sig):
            raise FormatError(path, f"{verb} {what}")
    nul = head.find(b"\x00")
    if nul >= 0:
        raise FormatError(path, f"not UTF-8 text{' once decompressed' if verb == 'holds' else ''}: a NUL byte at "
                                f"offset {nul} (UTF-16 without a byte-order mark? a binary file?)")


def _lines(path: Path, f) -> Iterator[str]:
    """Lines of ``f``, turning a truncated / corrupt gzip stream into a FormatError."""
    try:
        yield from f
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise FormatError(path, f"truncated or corrupt compressed file: {e}") from None


def _strip(line: str, comments) -> str:
    if comments:
        for c in comments:
            i = line.find(c)
            if i >= 0:
                line = line[:i]
    return line.strip()


def _markers_in(lines: list[str], comments):
    """The comment markers that occur in ``lines``: with at most one, np.loadtxt stays on its fast C path
    (several markers make it preprocess every line in Python)."""
    if not comments or isinstance(comments, str):
        return comments
    text = "".join(lines)
    found = [c for c in comments if c in text]
    return found[0] if len(found) == 1 else (found or None)


def split_fields(line: str, delimiter: str | None) -> list[str]:
    return [t.strip() for t in line.split(delimiter)] if delimiter is not None else line.split()


def _explain(path, lines, first_line, *, delimiter, usecols, ncols, dtype, comments, err) -> FormatError:
    """Find the first line of a chunk that np.loadtxt rejected and say what is wrong with it."""
    is_int = np.issubdtype(dtype, np.integer)
    kind = "an integer" if is_int else "a number"
    info = np.iinfo(dtype) if is_int else None

    def conv(s: str):
        # as strict as np.loadtxt: Python's int() / float() also take '1_000' and non-ASCII digits ('٣')
        if "_" in s or not s.isascii():
            raise ValueError(s)
        return int(s) if is_int else float(s)
    need = max(usecols) + 1 if usecols is not None else ncols
    for i, line in enumerate(lines):
        text = _strip(line, comments)
        if not text:
            continue
        fields = split_fields(text, delimiter)
        where = f"line {first_line + i}"
        if usecols is None and ncols is None:
            ncols = need = len(fields)              # every line must have as many columns as the first
        if need is not None and len(fields) < need:
            return FormatError(path, f"{where}: expected {'at least ' if usecols is not None else ''}{need} "
                                     f"columns, found {len(fields)}: {text[:80]!r}")
        if usecols is None and ncols is not None and len(fields) != ncols:
            return FormatError(path, f"{where}: expected {ncols} columns, found {len(fields)}")
        for c in (usecols if usecols is not None else range(len(fields))):
            try:
                v = conv(fields[c])
            except ValueError:
                return FormatError(path, f"{where}: column {c + 1}: cannot parse {fields[c][:40]!r} as {kind}")
            if info is not None and not info.min <= v <= info.max:
                return FormatError(path, f"{where}: column {c + 1}: {fields[c][:40]} does not fit in {dtype}")
    last = first_line + len(lines) - 1
    return FormatError(path, f"lines {first_line}-{last}: cannot parse: {err}")


def _loadtxt(lines: list[str], *, dtype, delimiter, usecols, comments) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "input contained no data": comment-only chunk
        return np.loadtxt(lines, dtype=dtype, delimiter=delimiter, usecols=usecols,
                          comments=_markers_in(lines, comments), ndmin=2)


def read_table(path: Path, *, delimiter: str | None, dtype, usecols=None, ncols: int | None = None,
               comments=COMMENTS, skip: int = 0, chunk_lines: int = CHUNK_LINES,
               bar=None) -> Iterator[np.ndarray]:
    """Yield 2-D arrays of consecutive chunks of a numeric text table.

    ``usecols``: columns to keep (more are ignored); otherwise every line must have the same number of
    columns (``ncols`` if given, else that of the first data line). ``skip``: lines to skip at the start
    (a header). Errors name the file and the 1-based line number.
    """
    dtype = np.dtype(dtype)
    with open_text(path) as f:
        it = _lines(path, f)
        for _ in islice(it, skip):
            pass
        line_no = skip + 1
        step = min(chunk_lines, 4096)             # a small first chunk measures the line length
        while True:
            lines = list(islice(it, step))
            if not lines:
                return
            avg = max(1, sum(map(len, lines)) // len(lines))
            step = max(256, min(chunk_lines, CHUNK_BYTES // avg))
            try:
                a = _loadtxt(lines, dtype=dtype, delimiter=delimiter, usecols=usecols, comments=comments)
            except ValueError as e:
                # np.loadtxt skips empty lines but, with a delimiter, not those of only spaces or tabs (or a
                # comment after them): blank lines too, as this module counts them (data_line_number)
                kept = [line for line in lines if _strip(line, comments)]
                try:
                    if len(kept) == len(lines):
                        raise
                    a = _loadtxt(kept, dtype=dtype, delimiter=delimiter, usecols=usecols, comments=comments)
                except ValueError:
                    raise _explain(path, lines, line_no, delimiter=delimiter, usecols=usecols, ncols=ncols,
                                   dtype=dtype, comments=comments, err=e) from None
            if a.size or a.shape[0]:
                if usecols is None:
                    if ncols is None:
                        ncols = a.shape[1]
                    elif a.shape[1] != ncols:
                        raise _explain(path, lines, line_no, delimiter=delimiter, usecols=None, ncols=ncols,
                                       dtype=dtype, comments=comments, err=f"{a.shape[1]} columns, expected {ncols}")
                yield a
            if bar is not None:
                bar.update(len(lines))
            line_no += len(lines)


def data_line_number(path: Path, row: int, *, comments=COMMENTS, skip: int = 0) -> int:
    """1-based line number of data row ``row`` (0-based, comments and blank lines not counted)."""
    with open_text(path) as f:
        k = -1
        for i, line in enumerate(_lines(path, f), start=1):
            if i <= skip or not _strip(line, comments):
                continue
            k += 1
            if k == row:
                return i
    return -1
