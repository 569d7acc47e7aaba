"""The trial watchdog: a candidate that hangs inside MPI cannot be cancelled, so the job ends.

Use one ``Watchdog`` on rank 0 of a tuning run: ``arm(description, on_timeout)`` before a
trial, ``disarm()`` after it. When a trial is still running ``timeout_s`` seconds after it
was armed, the watchdog thread calls ``on_timeout(description)`` (which records the trial
as TIMEOUT in the storage: the next run retries it once, a second timeout rules it out)
and then aborts the whole MPI job with ``abort(message)``. A thread can do this while the
main thread is blocked in MPI because mpi4py releases the GIL inside blocking calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Watchdog:
    """Fires ``on_timeout`` then ``abort`` for a trial running past ``timeout_s``."""

    def __init__(self, timeout_s: float | None, abort: Callable[[str], None]) -> None:
        self.timeout_s = timeout_s if timeout_s and timeout_s > 0 else None
        self._abort = abort
        self._cond = threading.Condition()
        self._deadline: float | None = None
        self._description = ""
        self._on_timeout: Callable[[str], str] | None = None
        self._closed = False
        self._thread: threading.Thread | None = None
        if self.timeout_s is not None:
            self._thread = threading.Thread(target=self._loop, name="ringtune-watchdog",
                                            daemon=True)
            self._thread.start()

    def arm(self, description: str, on_timeout: Callable[[str], str]) -> None:
        """Start timing a trial. ``on_timeout(description)`` returns the abort message."""
        if self.timeout_s is None:
            return
        with self._cond:
            self._deadline = time.monotonic() + self.timeout_s
            self._description = description
            self._on_timeout = on_timeout
            self._cond.notify_all()

    def disarm(self) -> None:
        if self.timeout_s is None:
            return
        with self._cond:
            self._deadline = None
            self._on_timeout = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._deadline = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(timeout=left)
                    continue
                description, on_timeout = self._description, self._on_timeout
                self._deadline = None
            try:
                message = on_timeout(description) if on_timeout else description
            except Exception as exc:  # noqa: BLE001 - the job must still end
                message = f"{description} (could not record the timeout: {exc})"
            self._abort(message)
            return
