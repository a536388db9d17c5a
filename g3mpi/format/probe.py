"""Read an HDF5 file's structure in a child interpreter, so that damage that crashes libhdf5 crashes the child.

A part file whose bytes were damaged in its HDF5 structure (an object header, an attribute or datatype message, a
chunk index) can make the HDF5 library itself fail with a segmentation fault while h5py reads it: no Python
exception, no message, the rank just dies. The whole-file checksum (``read_part(verify=True)``, the default)
refuses such a file before h5py opens it. Without it (``g3-train --no-verify``, for parts too large to hash at
every start), ``read_part`` first runs :func:`probe_structure`: a child interpreter opens the file and touches
every attribute, every dataset's header and every chunk index entry (no raw data), then exits. A child killed
by a signal, or one that does not finish within ``PROBE_TIMEOUT`` seconds, becomes a :class:`FormatError`-style
reason naming the file on the caller's side; ordinary read errors in the child are ignored (the caller's own
read reports them with its usual messages).

Run as a script (``python probe.py FILE``) it imports only the standard library and h5py, so it starts in a
fraction of a second and does not depend on how g3mpi was put on the parent's ``sys.path``.
"""
from __future__ import annotations

import signal
import subprocess
import sys

#: seconds the child may take to read a file's structure (a few thousand objects and chunk entries take well
#: under one second; a damaged index that loops never ends)
PROBE_TIMEOUT = 60.0


def probe_structure(path, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None if a child interpreter read every attribute, dataset header and chunk index entry of ``path``
    without being killed; otherwise the reason, one line."""
    cmd = [sys.executable, "-P", __file__, str(path)]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return (f"its HDF5 structure could not be read within {timeout:g} s (in a probe process; a damaged "
                f"file? --no-verify skipped its checksum)")
    if r.returncode < 0:
        try:
            sig = signal.Signals(-r.returncode).name
        except ValueError:
            sig = f"signal {-r.returncode}"
        return (f"its HDF5 structure is damaged: reading it crashed the HDF5 library ({sig}, in a probe "
                f"process; --no-verify skipped its checksum)")
    return None


def _walk(path: str) -> None:
    """Touch every attribute, dataset header and chunk index entry of ``path``; errors are skipped."""
    import h5py

    def attrs(obj):
        try:
            names = list(obj.attrs.keys())
        except Exception:
            return
        for k in names:
            try:
                obj.attrs[k]
            except Exception:
                pass

    def dataset(ds):
        try:
            ds.shape, ds.dtype, ds.chunks
            if ds.chunks is not None:
                ds.id.chunk_iter(lambda info: None)   # H5Dchunk_iter: one pass over the chunk index
        except Exception:
            pass

    def visit(_name, obj):
        attrs(obj)
        if isinstance(obj, h5py.Dataset):
            dataset(obj)

    try:
        with h5py.File(path, "r") as f:
            attrs(f)
            f.visititems(visit)
    except Exception:
        pass


if __name__ == "__main__":
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # a crash here is expected: no core file
    _walk(sys.argv[1])
