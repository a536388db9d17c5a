"""The temporaries a killed writer leaves: named after their host and process (:func:`temp_prefix`), so
that the next write of the same output on that host removes them once their process is gone."""
from __future__ import annotations

import logging
import os
import re
import shutil
import socket
from pathlib import Path

log = logging.getLogger(__name__)


def temp_prefix(path: Path) -> str:
    """``.NAME.HOST-PID.``: a temporary beside ``path`` names its writer, so a later writer can tell whether it
    is still running."""
    return f".{path.name}.{socket.gethostname()}-{os.getpid()}."


def remove_stale_temporaries(path: os.PathLike | str) -> list[Path]:
    """Remove the temporaries (``.NAME.HOST-PID.*.tmp`` / ``.old``) that a writer of ``path`` on this host left
    when it was killed outright (SIGKILL, e.g. after a batch job's ``KillWait``, or the out-of-memory killer);
    return them. An old directory that ``atomic_dir`` had moved aside is first put back if ``path`` is missing.
    Only those of this host whose process is gone: another host's process cannot be checked, and a live one (a
    concurrent writer) still owns its temporary."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.{re.escape(socket.gethostname())}-(\d+)\.[^./]+\.(tmp|old)")
    removed = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or _process_alive(int(m.group(1))):
            continue
        stale = Path(entry.path)
        if m.group(2) == "old" and (stale / "x").is_dir() and not os.path.lexists(path):
            # killed between moving the old directory aside and renaming the new one in: put the old one back
            os.replace(stale / "x", path)
            log.warning("%s: restored from %s, left by process %s on this host, which is no longer running",
                        path, stale.name, m.group(1))
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
        if not os.path.lexists(stale):
            log.warning("%s: removed %s, left by process %s on this host, which is no longer running",
                        path, stale.name, m.group(1))
            removed.append(stale)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: another user's live process
        return True
    return True

