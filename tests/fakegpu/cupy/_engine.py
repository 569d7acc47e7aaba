"""The simulated GPU's clock: streams of queued work that run later, in a random order.

Real GPU work is asynchronous: a copy or kernel queued on a stream runs some time after the
call returns, concurrently with other streams, ordered only by its own stream and by the
events other streams wait for. Code that reads a result without waiting for it is wrong,
but on a real GPU it is often *lucky*. Here nothing runs when it is queued: work runs when
the host waits for it (``Event.synchronize``, ``Stream.synchronize``, a blocking copy),
and, to stand for the GPU's own progress, a little at a time whenever the host asks whether
something is done (``Event.done``). Which runnable stream goes next is drawn from a seeded
random generator (``RINGTUNE_FAKE_GPU_SEED``), so a missing wait shows up as a wrong
result — deterministically for a given seed — instead of going unnoticed.

Device memory is host memory. The registry maps addresses to the allocations that contain
them, so work queued with raw pointers (``memcpyAsync``) keeps its memory alive until it
has run, and so the pinned allocations are known (a pageable host source is read when the
copy is queued, as CUDA does; a pinned one when the copy runs).
"""

from __future__ import annotations

import bisect
import os
import random
import weakref
from collections.abc import Callable
from typing import Any


class SimulatedDeadlock(RuntimeError):
    """Every queued stream waits for an event that nothing will ever complete."""


class _Wait:
    """A stream's wait for another stream to reach a point (``Stream.wait_event``)."""

    __slots__ = ("stream", "count")

    def __init__(self, stream: Any, count: int) -> None:
        self.stream = stream
        self.count = count

    def ready(self) -> bool:
        return bool(self.stream.completed >= self.count)


class Engine:
    """All streams of the process and the order their work runs in."""

    def __init__(self) -> None:
        self.rng = random.Random(int(os.environ.get("RINGTUNE_FAKE_GPU_SEED", "0")))
        self.streams: weakref.WeakSet[Any] = weakref.WeakSet()

    def register(self, stream: Any) -> None:
        self.streams.add(stream)

    def _runnable(self) -> list[Any]:
        # Satisfied waits complete at once; one completing may satisfy another stream's
        # wait, so repeat until nothing changes.
        changed = True
        while changed:
            changed = False
            for s in list(self.streams):
                if s.inflight is not None and s.inflight():
                    s.inflight = None
                    s._complete()
                    changed = True
                while (s.inflight is None and s.queue and isinstance(s.queue[0], _Wait)
                       and s.queue[0].ready()):
                    s.queue.popleft()
                    s._complete()
                    changed = True
        return [s for s in list(self.streams) if s.inflight is None and s.queue
                and not isinstance(s.queue[0], _Wait)]

    def step(self) -> bool:
        """Run one queued operation of a randomly chosen runnable stream; False when nothing
        is runnable or in flight. An operation may return a poll function (communication
        it has started): its stream then stays busy until the poll says done. Raises
        ``SimulatedDeadlock`` when work is queued but all of it waits for nothing."""
        ready = self._runnable()
        if not ready:
            if any(s.inflight is not None for s in list(self.streams)):
                # Communication in flight: polling it is the progress. Yield the CPU so
                # that oversubscribed peer ranks get to post what it waits for.
                os.sched_yield()
                return True
            stuck = [s for s in list(self.streams) if s.queue]
            if stuck:
                detail = "; ".join(
                    f"stream {s.ptr:#x} (ran {s.completed}, {len(s.queue)} queued) waits for "
                    f"stream {s.queue[0].stream.ptr:#x} to reach {s.queue[0].count} (it ran "
                    f"{s.queue[0].stream.completed}, {len(s.queue[0].stream.queue)} queued)"
                    for s in stuck)
                raise SimulatedDeadlock(f"GPU work that can never run: {detail}")
            return False
        s = self.rng.choice(sorted(ready, key=lambda x: x.ptr))
        op = s.queue.popleft()
        poll = op()
        if callable(poll):
            s.inflight = poll
        else:
            s._complete()
        return True

    def run_until(self, done: Callable[[], bool]) -> None:
        while not done():
            if not self.step():
                if not done():
                    raise SimulatedDeadlock("waiting for GPU work that was never queued")
                return

    def background(self) -> None:
        """The GPU's own progress while the host polls: sometimes one operation."""
        if self.rng.random() < 0.5:
            self.step()


ENGINE = Engine()


# -- memory -----------------------------------------------------------------------------------


class Registry:
    """Live allocations by address: ``(start, end) -> owner`` with weak references, so a
    pointer can be mapped back to the object that keeps its memory alive."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._items: dict[int, tuple[int, Any, bool, int]] = {}

    def add(self, start: int, nbytes: int, owner: Any, pinned: bool, device: int) -> None:
        if start in self._items:
            self._starts.remove(start)
        bisect.insort(self._starts, start)
        self._items[start] = (start + max(nbytes, 1), weakref.ref(owner), pinned, device)

    def device_bytes(self, device: int) -> int:
        """Bytes of live device allocations on ``device`` (for ``memGetInfo``)."""
        total = 0
        for start in list(self._starts):
            end, ref, pinned, dev = self._items[start]
            if not pinned and dev == device and ref() is not None:
                total += end - start
        return total

    def find(self, ptr: int) -> tuple[Any, bool, int] | None:
        """(owner, pinned, device) of the live allocation holding ``ptr``, else None."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        while i >= 0:
            start = self._starts[i]
            end, ref, pinned, device = self._items[start]
            owner = ref()
            if owner is None:
                del self._items[start]
                del self._starts[i]
                i -= 1
                continue
            return (owner, pinned, device) if ptr < end else None
        return None


MEMORY = Registry()
