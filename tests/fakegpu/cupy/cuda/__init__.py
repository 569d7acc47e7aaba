"""``cupy.cuda`` of the simulated GPU: devices, streams, events, pinned memory.

Streams queue their work (``_enqueue``); the engine runs it later (see ``.._engine``).
The default (null) stream runs work at once — as if the GPU
had finished it before the call returned, one of the orders a real GPU may pick; ringtune's
own work always goes to its non-blocking streams, which is what the simulation tests.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections import deque
from typing import Any

import numpy as np

from .._engine import ENGINE, MEMORY, _Wait
from . import nccl, runtime

__all__ = ["Device", "Event", "Stream", "alloc_pinned_memory",
           "get_current_stream", "get_elapsed_time", "nccl", "runtime"]

_ptrs = itertools.count(0x1000, 0x10)
#: Streams by handle, for ``runtime.memcpyAsync(..., stream_ptr)``.
STREAMS: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
_current: list[Stream] = []


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = runtime.getDevice() if device is None else int(device)
        if not 0 <= self.id < runtime.getDeviceCount():
            raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: device {self.id}")
        self._saved: list[int] = []

    def use(self) -> None:
        runtime.setDevice(self.id)

    def __enter__(self) -> Device:
        self._saved.append(runtime.getDevice())
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc: Any) -> None:
        runtime.setDevice(self._saved.pop())


class Stream:
    """A CUDA stream; ``non_blocking`` streams queue their work for the engine."""

    null: Stream

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
                 priority: Any = None) -> None:
        self._eager = null
        self.ptr = 0 if null else next(_ptrs)
        self._non_blocking = bool(non_blocking)
        self.device_id = runtime.getDevice()
        self.queue: deque[Any] = deque()
        self.completed = 0
        self.inflight: Any = None  # poll function of started communication
        self._watch: dict[int, list[Event]] = {}  # events waiting for a completion count
        if not self._eager:
            ENGINE.register(self)
            STREAMS[self.ptr] = self

    def _complete(self) -> None:
        """One more queued item finished: the events recorded at this point happen now."""
        self.completed += 1
        for ev in self._watch.pop(self.completed, ()):
            ev._when = time.perf_counter()

    @property
    def is_non_blocking(self) -> bool:
        return self._non_blocking

    def _enqueue(self, op: Any) -> None:
        if self._eager:
            poll = op()
            while callable(poll) and not poll():
                ENGINE.background()
            self._complete()
        else:
            self.queue.append(op)

    def _idle(self) -> bool:
        return not self.queue and self.inflight is None

    def synchronize(self) -> None:
        ENGINE.run_until(self._idle)

    @property
    def done(self) -> bool:
        ENGINE.background()
        return self._idle()

    def wait_event(self, event: Event) -> None:
        if event._stream is None:
            return  # never recorded: nothing to wait for (as CUDA)
        w = _Wait(event._stream, event._count)
        if self._eager:
            ENGINE.run_until(w.ready)
        else:
            self.queue.append(w)

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        _current.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _current.pop()


Stream.null = Stream(null=True)


def get_current_stream(device_id: int = -1) -> Stream:
    return _current[-1] if _current else Stream.null


class Event:
    """A point in a stream's work; ``done`` once the stream has run up to it. Its time is
    the host's clock when the stream got there (the simulation's times mean nothing)."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False) -> None:
        self._stream: Stream | None = None
        self._count = 0
        self._when: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else Stream.null
        self._stream = s
        self._count = s.completed + len(s.queue) + (s.inflight is not None)
        if self._count == s.completed:
            self._when = time.perf_counter()
        else:
            self._when = None
            s._watch.setdefault(self._count, []).append(self)

    def _happened(self) -> bool:
        return self._stream is None or self._stream.completed >= self._count

    @property
    def done(self) -> bool:
        ENGINE.background()
        return self._happened()

    def synchronize(self) -> None:
        ENGINE.run_until(self._happened)


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    """Milliseconds between two events (both must have happened)."""
    if not (start_event._happened() and end_event._happened()):
        raise runtime.CUDARuntimeError("cudaErrorNotReady: an event has not happened yet")
    assert start_event._when is not None and end_event._when is not None
    return (end_event._when - start_event._when) * 1e3


def alloc_pinned_memory(size: int) -> np.ndarray:
    """Page-locked host memory: an ordinary host buffer the copies know to be pinned (they
    then read and write it when they run, not when they are queued)."""
    buf = np.zeros(max(1, int(size)), dtype=np.uint8)
    MEMORY.add(int(buf.__array_interface__["data"][0]), buf.nbytes, buf, pinned=True,
               device=-1)
    return buf
