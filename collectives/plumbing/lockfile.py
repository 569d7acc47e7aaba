"""An exclusive ``flock`` on a lock file that records who holds it.

Use it where two processes must not write the same file at once (the tuner's storage,
online tuning's profile): ``take`` returns the descriptor that holds the lock, ``release``
removes the file and unlocks. Callers turn ``LockBusy`` and ``OSError`` into their own
one-line errors.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable


class LockBusy(Exception):
    """Another process holds the lock; ``holder`` is what it wrote into the file."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


def holder(fd: int) -> str:
    """What the holder wrote into the lock file (it may still be writing it)."""
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"


def take(path: str, who: str, on_wait: Callable[[str], None] | None = None) -> int:
    """Lock ``path`` and write ``who`` (with host and time) into it; return the descriptor
    that holds the lock. Held by another process: ``LockBusy`` without ``on_wait``, else
    ``on_wait(holder)`` once and block until it is released. ``OSError`` when the file
    cannot be created."""
    announced = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is None:
                busy = LockBusy(holder(fd))
                os.close(fd)
                raise busy from None
            if not announced:
                on_wait(holder(fd))
                announced = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        # The holder removes the file when it releases: a lock taken on a file that is no
        # longer the one at ``path`` locks nothing; take the current one instead.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{who} on {socket.gethostname()} since "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
    return fd


def release(path: str, fd: int) -> None:
    """Remove the lock file, then unlock (in that order: a waiter that wakes on the old
    file sees it is gone and takes the new one)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)
