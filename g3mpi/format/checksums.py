"""SHA-256 of arrays, HDF5 datasets and whole files, read in bounded blocks: the checksums a graph file, a
partition's meta.json and its part files record."""
from __future__ import annotations

import hashlib
import os

import numpy as np

from .schema import STREAM_BYTES


def array_sha256(arrays) -> str:
    """sha256 of the raw C-order bytes of one array or of several arrays in turn."""
    h = hashlib.sha256()
    if isinstance(arrays, np.ndarray):
        arrays = [arrays]
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def dataset_sha256(ds) -> str:
    """sha256 of an h5py dataset's raw bytes, read in row blocks (never the whole dataset at once)."""
    h = hashlib.sha256()
    n = ds.shape[0] if ds.shape else 0
    if n == 0:
        return h.hexdigest()
    row_bytes = max(1, ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64)))
    step = max(1, STREAM_BYTES // row_bytes)
    for s in range(0, n, step):
        blk = np.ascontiguousarray(ds[s:s + step])
        h.update(memoryview(blk.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def file_sha256(path: os.PathLike | str) -> str:
    """SHA-256 of a whole file, read into one buffer of at most :data:`STREAM_BYTES` (no larger than the file:
    ``f.read(STREAM_BYTES)`` would allocate all of it for every block, also for a file of a few KiB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        buf = memoryview(bytearray(max(1, min(STREAM_BYTES, os.fstat(f.fileno()).st_size))))
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(buf[:n])
    return h.hexdigest()


class IncrementalSha256:
    """sha256 of a dataset written in row blocks, in the order they are written."""

    def __init__(self):
        self._h = hashlib.sha256()

    def update(self, block: np.ndarray) -> None:
        block = np.ascontiguousarray(block)
        self._h.update(memoryview(block.reshape(-1).view(np.uint8)))

    def hexdigest(self) -> str:
        return self._h.hexdigest()

