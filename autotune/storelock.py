"""One tuning run per study storage: an advisory lock next to a SQLite storage file.

Use ``storage_lock(comm, opts)`` around a whole tuning run (``autotune.tuning.tune`` does).
Two runs on one storage would corrupt each other's studies: the newcomer takes the other
run's RUNNING trial for one left by a killed run, marks it FAIL, and the first run dies when
it reports that trial. So rank 0 takes an exclusive ``flock`` on ``<database>.lock`` before
opening the storage and holds it until the profile is written. A second run refuses at once
(``TuneError``, bad usage: exit 2) naming the holder's PID and host, or with
``opts.wait`` (``ringtune tune --wait [SECONDS]``) waits for it to end, up to
SECONDS.

A run that dies, even by SIGKILL, releases the lock with its last file descriptor, so a
stale lock file never blocks anyone; the file is removed on a normal release. Only SQLite
storages that are files are locked: a server database (PostgreSQL, MySQL) has no file to
lock here, and an in-memory one belongs to one process.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from .lockstep import on_root
from .naming import default_storage
from .records import TuneError, TuneOptions


def lock_path(url: str) -> str | None:
    """The lock file of a storage URL: ``<database>.lock`` for a SQLite file, else
    ``None`` (nothing to lock, or a URL the storage itself will refuse)."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - a bad URL is reported when the storage is opened
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    db = parsed.database
    if not db or db == ":memory:":
        return None
    if db.startswith("file:"):  # a SQLite URI filename (?uri=true)
        if parsed.query.get("mode") == "memory":
            return None
        db = db[len("file:"):]
    return os.path.abspath(db) + ".lock"


class StorageLock:
    """An exclusive ``flock`` held on a lock file, which records the holder."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: str, url: str, wait: float = 0.0) -> StorageLock:
        """Lock ``path`` (the lock file of storage ``url``). Held by another run: wait up to
        ``wait`` seconds for it to be released (``math.inf``: no limit; ``True`` is that,
        ``False`` 0, the switch ``--wait`` was), then ``TuneError``."""
        from collectives.plumbing.lockfile import LockBusy, take

        limit = math.inf if wait is True else float(wait)
        launcher = os.environ.get("RINGTUNE_LAUNCHED", "")
        who = (f"pid {launcher} (its rank 0: pid {os.getpid()})" if launcher.isdigit()
               and launcher != "1" else f"pid {os.getpid()}")

        def announce(holder: str) -> None:
            upto = "" if limit == math.inf else f" up to {limit:g} s"
            print(f"ringtune tune: waiting{upto} for the run holding {url} ({holder})",
                  file=sys.stderr, flush=True)

        deadline = time.monotonic() + limit
        told = False
        while True:
            try:
                # No limit: a blocking lock; a limit: polled, to give up at the deadline.
                fd = take(path, who, announce if limit == math.inf else None)
                break
            except OSError as exc:
                raise TuneError(f"--storage {url}: cannot create the lock file {path} "
                                f"({exc.strerror or exc})", usage=True) from None
            except LockBusy as busy:
                if time.monotonic() >= deadline:
                    waited = f" after waiting {limit:g} s" if limit > 0 else ""
                    raise TuneError(
                        f"--storage {url} is in use by another ringtune tune ({busy.holder}; "
                        f"lock {path}){waited}: wait for it to finish or stop it, use another "
                        "--storage/--out, or pass --wait [SECONDS] to start when it ends",
                        usage=True) from None
                if not told:
                    announce(busy.holder)
                    told = True
                time.sleep(max(0.0, min(0.2, deadline - time.monotonic())))
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and unlock (``collectives.plumbing.lockfile.release``)."""
        if self._fd is None:
            return
        from collectives.plumbing.lockfile import release

        release(self.path, self._fd)
        self._fd = None


@contextlib.contextmanager
def storage_lock(comm: Any, opts: TuneOptions) -> Iterator[None]:
    """Hold the storage lock of ``opts`` on rank 0 for the body (collective: a refusal
    raises the same ``TuneError`` on every rank). Fills in the default storage URL."""
    opts.storage = opts.storage or default_storage(opts.out)
    url = str(opts.storage)
    path = lock_path(url)
    held: StorageLock | None = None

    def take() -> None:
        nonlocal held
        if path is not None:
            held = StorageLock.acquire(path, url, wait=opts.wait)

    on_root(comm, take)
    try:
        yield
    finally:
        if held is not None:
            held.release()
