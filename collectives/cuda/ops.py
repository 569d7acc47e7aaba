"""The handful of CUDA calls the GPU transports make, behind one small class.

``StagedTransport`` and ``NcclTransport`` never call CuPy directly: they use a
``CudaOps`` (streams, events, asynchronous copies between device and pinned host memory,
pinned allocation, device pointers). That keeps the transports' logic — piece splitting,
posting order, event chaining — independent of CuPy, so the unit tests can run it on the
CPU with a fake whose "device memory" is host memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CudaOps:
    """CuPy implementation, on the backend's device."""

    def __init__(self, device: int) -> None:
        import cupy

        self._cupy = cupy
        self._rt = cupy.cuda.runtime
        self.device = device
        self._d2h = int(self._rt.memcpyDeviceToHost)
        self._h2d = int(self._rt.memcpyHostToDevice)

    def new_stream(self) -> Any:
        """A non-blocking stream (no implicit synchronisation with the legacy null stream)."""
        with self._cupy.cuda.Device(self.device):
            return self._cupy.cuda.Stream(non_blocking=True)

    def new_event(self) -> Any:
        with self._cupy.cuda.Device(self.device):
            return self._cupy.cuda.Event(disable_timing=True)

    def record(self, event: Any, stream: Any) -> None:
        # Pass the stream explicitly: Event.record() defaults to the current stream.
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        """Future work on ``stream`` starts after ``event`` (no host blocking)."""
        stream.wait_event(event)

    def done(self, event: Any) -> bool:
        # ``Event.done`` is a property in CuPy; should a version make it a method, a bare
        # ``bool(event.done)`` would be always true and sends would leave before their copy.
        flag = event.done
        return bool(flag() if callable(flag) else flag)

    def sync_event(self, event: Any) -> None:
        """Block the host until ``event`` has happened."""
        event.synchronize()

    def sync_stream(self, stream: Any) -> None:
        stream.synchronize()

    def ptr(self, arr: Any) -> int:
        return int(arr.data.ptr)

    def d2h(self, host: np.ndarray, dev_ptr: int, nbytes: int, stream: Any) -> None:
        """Queue a device-to-host copy into pinned ``host`` on ``stream``."""
        if nbytes:
            self._rt.memcpyAsync(host.ctypes.data, dev_ptr, nbytes, self._d2h, stream.ptr)

    def h2d(self, dev_ptr: int, host: np.ndarray, nbytes: int, stream: Any) -> None:
        """Queue a host-to-device copy from pinned ``host`` on ``stream``."""
        if nbytes:
            self._rt.memcpyAsync(dev_ptr, host.ctypes.data, nbytes, self._h2d, stream.ptr)

    def pinned(self, nbytes: int) -> np.ndarray:
        """A page-locked host byte array (CuPy's pinned pool caches the allocations)."""
        mem = self._cupy.cuda.alloc_pinned_memory(max(1, nbytes))
        # As cupyx.empty_pinned: the array's base keeps ``mem`` alive while it lives.
        return np.ndarray((max(1, nbytes),), dtype=np.uint8, buffer=mem)

    def device_context(self) -> Any:
        """A context manager making the backend's device current."""
        return self._cupy.cuda.Device(self.device)

    def stream_ptr(self, stream: Any) -> int:
        return int(stream.ptr)
