"""``cupy.cuda.runtime`` of the simulated GPU: device queries and ``memcpyAsync``.

``RINGTUNE_FAKE_GPUS`` sets how many GPUs every process sees (default 1). ``memcpyAsync``
checks that the copy kind matches the memory (device arrays vs host memory) as a real
driver would reject, then queues the copy on the stream: a pageable host source is read
at once (CUDA stages it before returning), a device-to-pageable-host copy completes before
returning, and copies to or from pinned memory or between device arrays run when the
stream runs.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from .._engine import MEMORY

memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost = 0, 1, 2  # noqa: N816 - CuPy's
memcpyDeviceToDevice, memcpyDefault = 3, 4  # noqa: N816

_KINDS = {1: ("host", "device"), 2: ("device", "host"), 3: ("device", "device")}


class CUDARuntimeError(RuntimeError):
    pass


_device = 0


def getDeviceCount() -> int:  # noqa: N802 - CuPy's names
    return int(os.environ.get("RINGTUNE_FAKE_GPUS", "1"))


def getDevice() -> int:  # noqa: N802
    return _device


def setDevice(device: int) -> None:  # noqa: N802
    global _device
    if not 0 <= int(device) < getDeviceCount():
        raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {device}")
    _device = int(device)


def getDeviceProperties(device: int) -> dict[str, Any]:  # noqa: N802
    # Few SMs: the kernels run thread by thread on the CPU, so grids stay small.
    return {"name": b"Simulated GPU", "multiProcessorCount": 2, "warpSize": 32,
            "totalGlobalMem": 1 << 34, "pciBusID": 0x1B + int(device)}


def device_memory_bytes() -> int:
    """Each simulated GPU's memory: ``RINGTUNE_FAKE_GPU_MEM_BYTES`` (default 16 GiB), so a
    test can make a gradient set larger than free device memory."""
    return int(os.environ.get("RINGTUNE_FAKE_GPU_MEM_BYTES", str(1 << 34)))


def memGetInfo() -> tuple[int, int]:  # noqa: N802
    """(free, total) bytes of the current device: total less its live allocations."""
    total = device_memory_bytes()
    return max(0, total - MEMORY.device_bytes(_device)), total


def check_allocation(nbytes: int, device: int) -> None:
    """cudaMalloc's failure when ``nbytes`` more would exceed the device's memory (only
    checked when a test sets a size: the scan is linear in live allocations)."""
    if "RINGTUNE_FAKE_GPU_MEM_BYTES" not in os.environ:
        return
    total = device_memory_bytes()
    used = MEMORY.device_bytes(device)
    if used + nbytes > total:
        raise CUDARuntimeError(f"cudaErrorMemoryAllocation: out of memory allocating "
                               f"{nbytes} B on device {device} ({total - used} B free)")


def deviceGetPCIBusId(device: int) -> str:  # noqa: N802
    if not 0 <= int(device) < getDeviceCount():
        raise CUDARuntimeError(f"cudaErrorInvalidDevice: device {device}")
    return f"0000:{0x1B + int(device):02X}:00.0"


def _where(ptr: int) -> tuple[str, Any]:
    found = MEMORY.find(ptr)
    if found is None:
        return "pageable", None
    owner, pinned, _device_id = found
    return ("pinned" if pinned else "device"), owner


def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:  # noqa: N802
    from . import STREAMS, Stream

    size = int(size)
    if size == 0:
        return
    want = _KINDS.get(int(kind))
    if want is None:
        raise CUDARuntimeError(f"memcpyAsync: copy kind {kind} is not simulated")
    s_kind, s_owner = _where(int(src))
    d_kind, d_owner = _where(int(dst))
    got = ("device" if s_kind == "device" else "host", "device" if d_kind == "device" else "host")
    if got != want:
        raise CUDARuntimeError(f"cudaErrorInvalidValue: memcpyAsync kind {kind} copies "
                               f"{want[0]}->{want[1]} but got {s_kind}->{d_kind} memory")
    st = Stream.null if int(stream) == 0 else STREAMS.get(int(stream))
    if st is None:
        raise CUDARuntimeError(f"cudaErrorInvalidResourceHandle: stream {stream:#x}")
    if s_kind == "pageable":
        data = ctypes.string_at(int(src), size)  # staged now: the caller may free src

        def op() -> None:
            ctypes.memmove(int(dst), data, size)
    else:
        keep = [s_owner, d_owner]

        def op() -> None:
            ctypes.memmove(int(dst), int(src), size)
            keep.clear()
    st._enqueue(op)
    if d_kind == "pageable":
        st.synchronize()  # to pageable host memory: returns once the copy is done


def runtimeGetVersion() -> int:  # noqa: N802
    return 12090  # what the simulated GPU answers: it has no CUDA


def driverGetVersion() -> int:  # noqa: N802
    return 12090
