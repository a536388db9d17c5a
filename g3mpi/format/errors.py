"""The errors of the on-disk format and how a message shows what went wrong: a :class:`FormatError` always
names the offending path, so a user on any rank knows which file to fix."""
from __future__ import annotations

import os
import re
import stat

import numpy as np

#: what h5py raises for a file it cannot read: OSError (not HDF5, truncated, a damaged chunk), RuntimeError (a
#: damaged object header or attribute message: "Can't synchronously determine if attribute exists by name (bad
#: version number for datatype message)"), KeyError ("Unable to synchronously open object (unable to determine
#: object type)"), ValueError ("Insufficient precision in available types to represent (31, 23, 8, 0, 23)") or
#: TypeError ("data type '<i5' not understood", "Unknown string encoding (value 10)") for damaged type messages
H5_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


class FormatError(Exception):
    """A graph file, partition directory or part file is missing, corrupt or inconsistent.

    The message always names the offending path, so a user on any rank knows which file to fix.
    """

    def __init__(self, path: os.PathLike | str, message: str):
        self.path = str(path)
        self.reason = message
        super().__init__(f"{self.path}: {message}")


def check_regular_file(path: os.PathLike | str, what: str = "file") -> None:
    """FormatError unless ``path`` (after symlinks) is a regular file: a device (``/dev/zero``: endless), a FIFO
    (blocks until a writer comes), a socket or a directory is refused before any read, which could hang."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FormatError(path, "no such file") from None
    except OSError as e:
        raise FormatError(path, f"cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise FormatError(path, f"is {kind}, expected a regular {what}")


def unreadable(path: os.PathLike | str, e: BaseException) -> FormatError:
    """The error for an HDF5 file that h5py cannot read (``e`` one of :data:`H5_READ_ERRORS`, raised opening it or
    reading its attributes or datasets): the path, then h5py's own reason on one line (some of h5py's take
    two: a directory's "file read failed: time = ..." then ", filename = ...")."""
    return FormatError(path, f"not a readable HDF5 file (truncated or corrupt?): {' '.join(str(e).split())}")


def failure_reason(e: BaseException) -> str:
    """One line for a failed read or write: the OS's words for its errno, also when h5py wraps it in a RuntimeError
    ("... errno = 28, error message = 'No space left on device' ..."), else the first line of the message."""
    if isinstance(e, FormatError):
        return e.reason
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno)
    m = re.search(r"error message = '([^']*)'", str(e))
    if m:
        return m.group(1)
    return str(e).splitlines()[0] if str(e) else repr(e)


def shown(value, width: int = 40) -> str:
    """``value`` as an error message shows it: repr cut to ``width`` characters, a numpy scalar (an HDF5
    attribute) as the Python number it holds (``2``, not ``np.int64(2)``)."""
    if isinstance(value, np.generic):
        value = value.item()
    return f"{value!r:.{width}}"

