"""One array of an ``.npz`` archive read in blocks, never whole (OGB's binary layout: ogbn-papers100M's
``raw/data.npz`` holds 1.6 billion edges and 28 GB of features).

An ``.npz`` is a zip of ``.npy`` files. A member stored uncompressed (``np.savez``) is read at its offset in
the archive, ``os.pread`` by block; a deflated one (``np.savez_compressed``) is decompressed in blocks by
``zipfile`` (skipping to a start position decompresses what lies before it). Either way a block's bytes are
the only copy in memory: nothing is memory-mapped, so a pass over a 28 GB member does not leave 28 GB of
mapped pages in the resident set. Object arrays (pickles) are refused.

The zip member's CRC-32 is verified while reading: each pass of :meth:`NpyMember.chunks` keeps the CRC of the
range it read, and once the ranges read cover the whole member their CRCs are combined and compared with the
archive's, before the last block is handed out (one flipped byte in a stored member is otherwise accepted).
"""
from __future__ import annotations

import os
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from g3mpi.format import FormatError

from .common import NUMPY_READ_ERRORS

#: bytes decompressed and discarded at a time when a deflated member is read from an offset
SKIP_BYTES = 16 << 20
#: a zip local file header: signature, then name and extra-field lengths at bytes 26..29
LOCAL_HEADER = struct.Struct("<4s22xHH")
#: zeros fed to crc32 at a time to shift a range's CRC past the bytes that follow it (crc32_combine)
_ZEROS = bytes(1 << 20)


def crc32_combine(crc_a: int, crc_b: int, len_b: int) -> int:
    """The CRC-32 of A+B from A's, B's and len(B): the CRC is affine in its start value for data of a fixed length,
    so crc(B, start=crc_a) = crc_b ^ crc(zeros(len_b), crc_a) ^ crc(zeros(len_b), 0)."""
    za, z0 = crc_a, 0
    while len_b:
        k = min(len_b, len(_ZEROS))
        za, z0 = zlib.crc32(_ZEROS[:k], za), zlib.crc32(_ZEROS[:k], z0)
        len_b -= k
    return crc_b ^ za ^ z0


class NpyMember:
    """The array ``key`` of the archive ``path``: its shape, dtype and order from the .npy header, its elements
    read by :meth:`chunks` (flat, in file order). FormatError naming the archive for a missing member, an
    object dtype or an unreadable header."""

    def __init__(self, path: Path, key: str, zf: zipfile.ZipFile):
        self.path, self.key = Path(path), key
        try:
            self.info = zf.getinfo(key + ".npy")
        except KeyError:
            raise FormatError(path, f"missing array {key!r} (has: {', '.join(members(zf)) or 'nothing'})") from None
        try:
            with zf.open(self.info) as f:
                version = np.lib.format.read_magic(f)
                if version == (1, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
                elif version == (2, 0):
                    shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
                else:
                    raise ValueError(f".npy format version {version} (reads 1.0 and 2.0)")
                self.header_bytes = f.tell()
            with zf.open(self.info) as f:
                self._header_crc = zlib.crc32(f.read(self.header_bytes))
        except NUMPY_READ_ERRORS as e:
            raise FormatError(path, f"array {key!r} cannot be read (truncated or corrupt?): {e}") from None
        if dtype.hasobject:
            raise FormatError(path, f"array {key!r} holds Python objects (pickled data is never loaded)")
        self.shape, self.fortran, self.dtype = tuple(int(s) for s in shape), bool(fortran), dtype
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.stored = self.info.compress_type == zipfile.ZIP_STORED
        self.data_offset = None
        if self.stored:
            with open(path, "rb") as f:
                f.seek(self.info.header_offset)
                sig, name_len, extra_len = LOCAL_HEADER.unpack(f.read(LOCAL_HEADER.size))
            if sig != b"PK\x03\x04":
                raise FormatError(path, f"array {key!r}: bad zip local header (corrupt archive?)")
            self.data_offset = self.info.header_offset + LOCAL_HEADER.size + name_len + extra_len + self.header_bytes
        if self.info.file_size != self.header_bytes + self.size * self.dtype.itemsize:
            raise FormatError(path, f"array {key!r}: {self.info.file_size - self.header_bytes} bytes of data for "
                                    f"shape {list(self.shape)} of {self.dtype} (truncated or corrupt?)")
        #: element ranges read whole: start -> (stop, CRC-32 of their bytes); the member checked once they tile it
        self._ranges: dict[int, tuple[int, int]] = {}
        self.crc_checked = False

    def _read_range(self, start: int, stop: int, crc: int) -> None:
        """Note that elements start..stop-1 were read with CRC ``crc``; FormatError naming the archive and member
        if the ranges now cover the whole member and their CRC differs from the archive's."""
        if self.crc_checked:
            return
        self._ranges[start] = (stop, crc)
        pos, total = 0, self._header_crc
        while pos < self.size and pos in self._ranges:
            end, c = self._ranges[pos]
            total, pos = crc32_combine(total, c, (end - pos) * self.dtype.itemsize), end
        if pos >= self.size:
            self.crc_checked = True
            if total != self.info.CRC:
                raise FormatError(self.path, f"array {self.key!r}: CRC-32 {total:08x} of the data read differs from "
                                             f"the archive's {self.info.CRC:08x} (corrupt archive)")

    def chunks(self, start: int, stop: int, step: int) -> Iterator[np.ndarray]:
        """Elements ``start .. stop-1`` (flat, in file order) in blocks of at most ``step``; FormatError before
        the last block if the member's CRC-32 does not match (see the module's doc)."""
        item, crc = self.dtype.itemsize, 0
        if start >= stop:
            return
        try:
            if self.stored:
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    for s in range(start, stop, step):
                        k = min(step, stop - s)
                        buf = os.pread(fd, k * item, self.data_offset + s * item)
                        if len(buf) != k * item:
                            raise EOFError(f"the archive ends inside array {self.key!r}")
                        crc = zlib.crc32(buf, crc)
                        if s + k == stop:
                            self._read_range(start, stop, crc)
                        yield np.frombuffer(buf, dtype=self.dtype)
                finally:
                    os.close(fd)
                return
            with zipfile.ZipFile(self.path) as zf, zf.open(self.info) as f:
                skip = self.header_bytes + start * item
                while skip:
                    got = len(f.read(min(skip, SKIP_BYTES)))
                    if not got:
                        raise EOFError(f"the archive ends inside array {self.key!r}")
                    skip -= got
                for s in range(start, stop, step):
                    k = min(step, stop - s)
                    buf = f.read(k * item)
                    if len(buf) != k * item:
                        raise EOFError(f"the archive ends inside array {self.key!r}")
                    crc = zlib.crc32(buf, crc)
                    if s + k == stop:
                        self._read_range(start, stop, crc)
                    yield np.frombuffer(buf, dtype=self.dtype)
        except NUMPY_READ_ERRORS as e:
            raise FormatError(self.path, f"array {self.key!r} cannot be read (truncated or corrupt?): {e}") from None

    def read(self) -> np.ndarray:
        """The whole array (small ones: counts, labels), in its shape."""
        flat = np.concatenate(list(self.chunks(0, self.size, max(1, self.size)))) if self.size else \
            np.zeros(0, self.dtype)
        return flat.reshape(self.shape, order="F" if self.fortran else "C")


def members(zf: zipfile.ZipFile) -> list[str]:
    """The array names of an open .npz archive."""
    return sorted(n.removesuffix(".npy") for n in zf.namelist())


def open_archive(path: Path, what: str) -> zipfile.ZipFile:
    """The .npz archive ``path`` holding ``what`` (FormatError naming it if missing or not an archive)."""
    from .common import load_numpy
    load_numpy(path, what, archive=True).close()      # its checks of existence and kind, and their messages
    try:
        return zipfile.ZipFile(path)
    except NUMPY_READ_ERRORS as e:
        raise FormatError(path, f"not a readable .npz archive of {what} (truncated or corrupt?): {e}") from None
