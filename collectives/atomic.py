"""Atomic file writing, for everything ringtune writes (profiles, topologies, reports, JSON).

Readers see the old file or the whole new one, never half of it: the text goes to a
temporary file in the same folder, is fsynced, renamed over the target, and the folder is
synced so the rename itself survives a crash.
"""

from __future__ import annotations

import os
import tempfile


def write_text_atomic(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` to ``path`` atomically and return the path. ``OSError`` (with the
    temporary file removed) when the folder cannot be written."""
    name = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(name))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(name)}.", suffix=".tmp",
                               dir=folder)
    try:
        # mkstemp creates the file 0600; what we write is meant to be shared like any file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, name)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
    return name
