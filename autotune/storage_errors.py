"""What went wrong when the Optuna storage could not be written, in words that name the file.

Optuna wraps every failed commit in ``StorageInternalError("… e.g. exceeding max length")``,
which names neither the disk nor the file: a full disk read like a bug. ``failure_text(exc)``
finds the database error under it (SQLite's "database or disk is full", a read-only file,
an I/O error, ``ENOSPC``) and says which storage file, how much space is left there and
what to do. ``watch(url)`` tells it the storage of this run (``tune`` calls it when it
opens the storage); ``lockstep.on_root`` uses ``failure_text`` for every unexpected error
so that all ranks raise the clear message.
"""

from __future__ import annotations

import errno
import os
import shutil

_watched: str | None = None

#: Database messages (SQLite's, lower case) -> what they mean for the user.
_KNOWN = (
    ("database or disk is full", "the disk is full"),
    ("disk i/o error", "a disk I/O error"),
    ("readonly database", "the file is read-only"),
    ("unable to open database file", "the file cannot be opened"),
    ("database is locked", "another process holds the database locked"),
)
_OS_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
              errno.EROFS: "the file system is read-only", errno.EIO: "a disk I/O error"}


#: Free space above which "database or disk is full" cannot have been the disk.
ROOMY_BYTES = 64 << 20


def watch(url: str | None) -> None:
    """Name ``url`` (an SQLAlchemy URL such as ``sqlite:////path/x.db``) as this run's
    storage in later messages."""
    global _watched
    _watched = url


def sqlite_path(url: str | None) -> str | None:
    """The file of an SQLite URL (``sqlite:///rel.db``, ``sqlite:////abs.db``), else
    ``None``."""
    if not url or not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return path or None


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(out) < 16:
        seen.add(id(cur))
        out.append(cur)
        orig = getattr(cur, "orig", None)  # SQLAlchemy's DBAPIError keeps the driver's
        if isinstance(orig, BaseException) and id(orig) not in seen:
            out.append(orig)
            seen.add(id(orig))
        cur = cur.__cause__ or cur.__context__
    return out


def storage_failure(exc: BaseException, url: str | None = None) -> str | None:
    """One line for a storage write that failed for a reason of the disk or the file, or
    ``None`` when ``exc`` is something else."""
    url = url or _watched
    meaning = detail = None
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _OS_ERRNOS:
            meaning, detail = _OS_ERRNOS[e.errno], e.strerror or str(e)
            break
        text = str(e).lower()
        if type(e).__module__.startswith(("sqlite3", "sqlalchemy", "optuna")):
            for needle, what in _KNOWN:
                if needle in text:
                    meaning, detail = what, needle
                    break
        if meaning:
            break
    if meaning is None:
        return None
    path = sqlite_path(url)
    where = f"storage file {os.path.abspath(path)}" if path else f"storage {url or '?'}"
    free = ""
    if path:
        try:
            left = shutil.disk_usage(os.path.dirname(os.path.abspath(path)) or ".").free
        except OSError:
            left = None
        if left is not None:
            free = f", {left / (1 << 20):.0f} MiB free on its file system"
            if meaning == "the disk is full" and left > ROOMY_BYTES:
                # SQLite says "database or disk is full" for a size limit too.
                meaning = "the database reached a size limit (or the disk was full then)"
    return (f"cannot write the Optuna {where}: {meaning} (database: {detail}{free}); free "
            "space or give --storage on another disk; the trials stored so far are kept")


def failure_text(exc: BaseException) -> str:
    """The one-line text of an unexpected error: ``storage_failure``'s when it is one,
    else ``Type: message``."""
    return storage_failure(exc) or f"{type(exc).__name__}: {exc}"

