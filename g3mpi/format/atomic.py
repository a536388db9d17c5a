"""Atomic writes: an output file or directory is replaced only once the new one is complete and durable, and
never over anything of the user's that ``--out`` named by mistake (:func:`check_output`)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from .errors import FormatError
from .stale import remove_stale_temporaries, temp_prefix


def check_output(path: os.PathLike | str, force: bool, marker: str | None = None) -> Path:
    """Refuse an existing output unless ``force``, and even with it anything this writer would not have written
    there: with ``marker`` None (a file output) anything but a regular file; with ``marker`` (a directory output,
    e.g. a partition's ``meta.json``) anything but an empty directory or one that holds the file ``marker``. So
    ``--force`` replaces an earlier output, never a directory (or a device, or a file) of the user's that
    ``--out`` named by mistake. Returns the path."""
    path = Path(path)
    if path.exists():
        why = _not_an_output(path, marker)
        if why:
            raise FormatError(path, f"{why}: not replaced, even with --force (remove it yourself or choose another "
                                    f"output)")
        if not force:
            raise FormatError(path, "output already exists (use --force to replace it)")
    if not path.parent.exists():
        raise FormatError(path, f"output directory {path.parent} does not exist")
    return path


def _not_an_output(path: Path, marker: str | None) -> str | None:
    """Why the existing ``path`` is not an output that a writer of :func:`check_output`'s kind would have left
    (None if it is one)."""
    if marker is None:
        if path.is_dir():
            return "is a directory, not an output file"
        if not path.is_file():
            return "is not a regular file (a device, FIFO or socket?), not an output file"
        return None
    if not path.is_dir():
        return "is a file, not an output directory"
    if (path / marker).is_file() or not any(path.iterdir()):
        return None
    return f"is a directory with no {marker} (not one this tool wrote) and not empty"


@contextlib.contextmanager
def atomic_file(path: os.PathLike | str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` only if the block succeeds.

    An exception (or a signal turned into one) leaves nothing behind: the temporary file is removed. A process
    killed outright leaves its ``.NAME.HOST-PID.*.tmp``; the next write of ``path`` on that host removes it
    (``remove_stale_temporaries``).
    """
    remove_stale_temporaries(path)
    path = check_output(path, force)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the user's usual permissions
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)   # never over a directory: check_output refused one, os.replace refuses one made since
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_dir(path: os.PathLike | str, marker: str, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; it replaces ``path`` only if the block succeeds. Its files
    and itself are fsync'ed before the rename, and the parent directory after it: after a crash or a power loss
    ``path`` is the old directory or the complete new one (a crash while the block runs leaves the temporary
    directory, ``.NAME.HOST-PID.*.tmp``, beside it, which the next write of ``path`` on that host removes).

    An existing ``path`` is swapped with the new directory in one step (Linux ``renameat2(RENAME_EXCHANGE)``)
    and then removed; where the filesystem cannot swap, it is moved aside and the new one renamed in, and an
    error or Ctrl-C between the two renames moves it back. ``marker`` is the file the block writes that marks
    the directory as this writer's: only an existing directory that holds it, or an empty one, is replaced
    (:func:`check_output`)."""
    remove_stale_temporaries(path)
    path = check_output(path, force, marker)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700
    try:
        yield tmp
        for f in sorted(tmp.iterdir()):
            if f.is_file():
                fsync_path(f)
        fsync_path(tmp)
        if not path.exists():
            os.replace(tmp, path)
        elif exchange(tmp, path):
            _remove(tmp)   # now the old directory
        else:
            old = Path(tempfile.mkdtemp(prefix=temp_prefix(path), suffix=".old", dir=path.parent))
            os.replace(path, old / "x")
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(old / "x", path)
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        fsync_path(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _remove(path: Path) -> None:
    """Remove a directory tree or a file (whatever ``atomic_dir`` swapped out)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def exchange(a: os.PathLike | str, b: os.PathLike | str) -> bool:
    """Swap two existing paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``). False where the C
    library or the filesystem cannot (the caller then renames in two steps); OSError for any other failure."""
    import ctypes
    import errno
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_path(path: os.PathLike | str) -> None:
    """fsync a file or a directory by its path (a directory's fsync makes its entries, e.g. a rename, durable).
    A file's failure raises; a directory's is ignored (some filesystems cannot fsync directories)."""
    is_dir = os.path.isdir(path)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if is_dir:
            return
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not is_dir:
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

