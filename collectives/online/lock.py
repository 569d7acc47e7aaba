"""The lock on online tuning's output file: rank 0 holds ``FILE.lock`` while the job may
write FILE (``TuneOutLock``), so two jobs never replace each other's choices.
"""

from __future__ import annotations

import os

from .options import OUT_ENV


class TuneOutLock:
    """An exclusive ``flock`` on ``FILE.lock``, held by rank 0 while the job may write FILE:
    two jobs writing one profile would each replace the other's choices. Released (and the
    lock file removed) at close; a killed job releases it with its last descriptor."""

    def __init__(self, path: str) -> None:
        from safefiles.outfile import OutputError, target_of

        # Beside what is written (a symlink's target: two links to one file share the
        # lock); a device or FIFO is written through, not replaced: no lock, and no
        # FILE.lock created in /dev.
        try:
            real, self._through = target_of(path, "")
        except OutputError:  # refused when written; the lock's own error comes first
            real, self._through = os.path.abspath(path), False
        self.path = os.path.abspath(real) + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """``ValueError`` naming the file and the holder when another job holds it."""
        from ..plumbing.lockfile import LockBusy, take

        if self._through:
            return
        try:
            fd = take(self.path, f"pid {os.getpid()}")
        except OSError as exc:
            raise ValueError(f"{OUT_ENV}: cannot create the lock file {self.path} "
                             f"({exc.strerror or exc}); choose a writable file") from None
        except LockBusy as busy:
            raise ValueError(
                f"{OUT_ENV}: {self.path[:-5]} is being written by another job "
                f"({busy.holder}; lock {self.path}): give each job its own file") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        from ..plumbing.lockfile import release

        release(self.path, self._fd)
        self._fd = None
