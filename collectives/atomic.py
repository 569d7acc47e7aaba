"""Atomic file writing, for everything ringtune writes (profiles, topologies, reports, plots,
JSON).

Readers see the old file or the whole new one, never half of it: the content goes to a
temporary file in the same folder, is fsynced, renamed over the target, and the folder is
synced so the rename itself survives a crash.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a temporary path beside ``path`` to write (by any means: ``open``, a plotting
    library's ``savefig``); on success it is fsynced and renamed over ``path``, on error it
    is removed. ``OSError`` when the folder cannot be written."""
    name = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(name))
    base, ext = os.path.splitext(os.path.basename(name))
    # Keep the extension last: writers such as savefig infer the format from it.
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{ext}", dir=folder)
    try:
        # mkstemp creates the file 0600; what we write is meant to be shared like any file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        os.close(fd)
        yield tmp
        with open(tmp, "rb+") as fh:
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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` to ``path`` atomically and return the path. ``OSError`` (with the
    temporary file removed) when the folder cannot be written."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    return os.fspath(path)
