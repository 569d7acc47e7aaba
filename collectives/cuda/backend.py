"""``CupyBackend``: the algorithms' array operations on GPU memory, on a dedicated stream.

Loaded only when GPU work is asked for (this module imports CuPy at its top). One instance
per process, bound to this rank's GPU (``binding.bind_device``).

Streams. Every operation — reductions, copies, ``divide`` — is queued on the backend's own
non-blocking stream, and the transports chain their streams to it with events, so the host
never waits for the GPU inside an allreduce except where MPI must read device memory.
The caller's work is ordered around it: ``as_flat`` makes the backend's stream wait for
what the caller queued so far on CuPy's current stream (where the buffer was written),
and ``synchronize`` — which ``Communicator.allreduce`` calls before returning a GPU buffer
— waits until the backend's stream has finished, so the result may be read on any stream.
A PyTorch caller on a non-default stream should make it CuPy's current stream
(``cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)``), or synchronize
before the call.

Inputs. CuPy arrays, and any object exposing ``__cuda_array_interface__`` or DLPack (a
PyTorch CUDA tensor) are viewed without copying (``cupy.asarray`` / ``cupy.from_dlpack``);
the view's address is checked against the source's, so a copy can never be reduced in
place of the caller's memory.

Kernels. float32/float64/int32/int64 use the vectorised ``RawKernel`` of
``collectives.cuda.kernels``; float16 and bfloat16 (when CuPy supports it: CuPy ≥ 14 with
``ml_dtypes``) use ``ElementwiseKernel``. Each is compiled once per (dtype, op) on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backend import Backend
from ..ops import DTYPES
from .binding import DeviceBinding, bind_device, current_binding
from .detect import cuda_aware_mpi, world_rank
from .errors import GpuError
from .kernels import (
    BLOCK,
    EW_DTYPES,
    EW_OPS,
    KERNEL_OPS,
    RAW_TYPES,
    kernel_name,
    launch_plan,
    reduce_source,
)

try:
    import cupy
except ImportError as _exc:  # re-raised with the rank: get_backend turns it into the fix
    raise ImportError(f"rank {world_rank()}: CuPy is not installed ({_exc})") from _exc

#: Number of CupyBackend instances created in this process (``bind_device`` refuses to
#: move a binding that a backend already uses).
_INSTANCES = 0


def bfloat16_dtype() -> np.dtype | None:
    """NumPy's bfloat16 (from ml_dtypes) when CuPy can hold it on the GPU, else ``None``."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    dt = np.dtype(ml_dtypes.bfloat16)
    try:
        # Run the kernel the backend would use: an older CuPy may allocate arrays of a dtype
        # it has no C type for, and only fail when a kernel is compiled for it.
        probe = cupy.zeros(2, dtype=dt)
        cupy.ElementwiseKernel("T x", "T y", EW_OPS["sum"], "ringtune_sum_half")(
            probe[:1], probe[1:])
        cupy.cuda.get_current_stream().synchronize()
    except Exception:  # noqa: BLE001 - CuPy < 14 rejects the dtype
        return None
    return dt


class CupyBackend(Backend):
    """GPU arrays through CuPy; see the module docstring."""

    name = "cupy"
    on_gpu = True

    def __init__(self, binding: DeviceBinding | None = None) -> None:
        global _INSTANCES
        self.binding = binding or current_binding() or bind_device()
        self.device = self.binding.device
        self.rank = world_rank()
        with cupy.cuda.Device(self.device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._begin = cupy.cuda.Event(disable_timing=True)
            props = cupy.cuda.runtime.getDeviceProperties(self.device)
            self._bf16 = bfloat16_dtype()
        # A few waves of blocks per SM; the grid-stride loops cover the rest.
        self.max_blocks = int(props.get("multiProcessorCount", 80)) * 32
        self.extra_dtypes = ("bfloat16",) if self._bf16 is not None else ()
        self._dtypes: dict[str, np.dtype] = {n: np.dtype(n) for n in DTYPES}
        if self._bf16 is not None:
            self._dtypes["bfloat16"] = self._bf16
        self._reducers: dict[tuple[Any, str], Callable[[Any, Any, int], None]] = {}
        self._ew: dict[str, Any] = {}
        # avg: C division truncates integers toward zero (as NCCL's ncclAvg); half types
        # divide in float and round once.
        self._div = cupy.ElementwiseKernel("T n", "T y", "y = y / n", "ringtune_div")
        self._div_half = cupy.ElementwiseKernel("float32 n", "T y", "y = (float)y / n",
                                                "ringtune_div_half")
        _INSTANCES += 1

    # -- buffers ----------------------------------------------------------------------

    def _view(self, buf: Any) -> Any:
        """A CuPy array sharing ``buf``'s memory (never a copy)."""
        if isinstance(buf, cupy.ndarray):
            return buf
        cai_error: Exception | None = None
        try:
            cai = buf.__cuda_array_interface__
        except AttributeError:
            cai = None
        except Exception as exc:  # noqa: BLE001 - e.g. a dtype CAI cannot describe
            cai, cai_error = None, exc
        if cai is not None:
            ptr, readonly = cai.get("data", (0, False))
            if readonly:
                raise ValueError(f"rank {self.rank}: GPU buffer is read-only: allreduce works "
                                 "in place, pass a writable array")
            arr = cupy.asarray(buf)
            if arr.size and int(arr.data.ptr) != int(ptr):
                raise ValueError(f"rank {self.rank}: CuPy copied the buffer instead of "
                                 "viewing it; pass a contiguous CUDA array")
            return arr
        if hasattr(buf, "__dlpack__"):
            try:
                return cupy.from_dlpack(buf)
            except Exception as exc:  # noqa: BLE001 - reported with the likely fix
                hint = ("; bfloat16 needs CuPy ≥ 14 with ml_dtypes installed"
                        if "bfloat16" in f"{exc}{cai_error}".lower()
                        or "bfloat" in str(getattr(buf, "dtype", "")).lower() else "")
                raise TypeError(f"rank {self.rank}: GPU buffer of type {type(buf).__name__} "
                                f"cannot be viewed by CuPy without a copy ({exc}){hint}"
                                ) from exc
        raise TypeError(f"rank {self.rank}: unsupported GPU buffer {type(buf).__name__}: pass "
                        "a CuPy array or an object exposing __cuda_array_interface__ or DLPack")

    def as_flat(self, buf: Any) -> Any:
        arr = self._view(buf)
        dev = int(arr.data.device_id)
        if dev != self.device:
            raise GpuError(
                f"rank {self.rank}: the buffer is on GPU {dev}, but this rank is bound to "
                f"{self.binding.describe()}; allocate buffers after "
                "collectives.cuda.bind_device(), or call bind_device(<device>) before the "
                "first GPU allreduce to choose the device yourself"
            )
        if not arr.flags.c_contiguous:
            raise ValueError("buffer is not C-contiguous: pass cupy.ascontiguousarray(buf) and "
                             "copy the result back")
        current = int(cupy.cuda.runtime.getDevice())
        if current != self.device:
            raise GpuError(f"rank {self.rank}: the current CUDA device is {current}, but this "
                           f"rank's buffers and stream are on GPU {self.device}: call "
                           f"cupy.cuda.Device({self.device}).use() (or torch.cuda.set_device) "
                           "before allreduce")
        # Order our stream after what the caller queued on the current stream (which wrote
        # the buffer); no host wait.
        caller = cupy.cuda.get_current_stream()
        if caller.ptr != self.stream.ptr:
            self._begin.record(caller)
            self.stream.wait_event(self._begin)
        return arr.reshape(-1)

    def dtype(self, name: str) -> np.dtype:
        try:
            return self._dtypes[name]
        except KeyError:
            raise TypeError(f"unsupported dtype {name} on the GPU: use one of "
                            f"{', '.join(self._dtypes)}") from None

    def free_bytes(self) -> int:
        """Device memory this process can still allocate: the driver's free memory plus
        what CuPy's pool holds unused (``allreduce_many`` sizes GPU buckets by it)."""
        with cupy.cuda.Device(self.device):
            free = int(cupy.cuda.runtime.memGetInfo()[0])
            pool = getattr(cupy, "get_default_memory_pool", None)
        return free + (int(pool().free_bytes()) if pool is not None else 0)

    def empty(self, count: int, dtype: str) -> Any:
        # Allocated for our stream: CuPy's pool then reuses it only in this stream's order.
        with cupy.cuda.Device(self.device), self.stream:
            return cupy.empty(int(count), dtype=self.dtype(dtype))

    # -- operations ------------------------------------------------------------------

    def reduce_into(self, dst: Any, src: Any, op: str) -> None:
        n = int(dst.size)
        if n == 0:
            return
        run = self._reducers.get((dst.dtype, op))
        if run is None:
            run = self._reducer(dst.dtype, op)
        run(dst, src, n)

    def _reducer(self, dtype: np.dtype, op: str) -> Callable[[Any, Any, int], None]:
        name = str(dtype)
        stream = self.stream
        if op not in KERNEL_OPS:
            raise ValueError(f"no GPU reduction for op {op!r}: use one of "
                             f"{', '.join(KERNEL_OPS)}")
        if name in RAW_TYPES:
            kern = cupy.RawKernel(reduce_source(name, op), kernel_name(name, op))
            itemsize = RAW_TYPES[name][3]
            max_blocks = self.max_blocks
            plan, block = launch_plan, (BLOCK,)
            i64, i32 = np.int64, np.int32

            def run(dst: Any, src: Any, n: int) -> None:
                g = plan(int(dst.data.ptr), int(src.data.ptr), n, itemsize, max_blocks)
                with stream:
                    kern((g.grid,), block, (dst, src, i64(n), i64(g.head), i32(g.vec)))
        elif name in EW_DTYPES and name in self._dtypes:
            ew = self._ew.get(op)
            if ew is None:
                ew = self._ew[op] = cupy.ElementwiseKernel(
                    "T x", "T y", EW_OPS[op], f"ringtune_{op}_half")

            def run(dst: Any, src: Any, n: int) -> None:
                with stream:
                    ew(src, dst)
        else:
            supported = ", ".join(sorted(set(RAW_TYPES) | (set(EW_DTYPES)
                                                             & set(self._dtypes))))
            raise TypeError(f"rank {self.rank}: no GPU reduction kernel for dtype {name}: use "
                            f"one of {supported}")
        self._reducers[(dtype, op)] = run
        return run

    def copy_into(self, dst: Any, src: Any) -> None:
        """``dst[...] = src`` on the backend's stream; either side may be a host (NumPy)
        array, which is then copied up or down (a host source of another dtype is cast on
        the host first — the bench fills bfloat16 buffers from float32)."""
        rt = cupy.cuda.runtime
        if isinstance(src, np.ndarray) and not isinstance(dst, np.ndarray):
            if src.dtype != dst.dtype:
                src = src.astype(dst.dtype)
            src = np.ascontiguousarray(src)
            self._check_sizes(dst, src)
            if src.nbytes:
                rt.memcpyAsync(int(dst.data.ptr), src.ctypes.data, src.nbytes,
                               rt.memcpyHostToDevice, self.stream.ptr)
            # Pageable memory: the call returns once ``src`` has been staged, so it may be
            # freed; the device copy itself stays ordered on our stream.
            return
        if isinstance(dst, np.ndarray):
            self._check_sizes(dst, src)
            tmp = cupy.asnumpy(src, stream=self.stream)
            np.copyto(dst, tmp.astype(dst.dtype, copy=False).reshape(dst.shape))
            return
        self._check_sizes(dst, src)
        if dst.dtype != src.dtype:
            raise TypeError(f"copy_into: dtype {src.dtype} into {dst.dtype}")
        nbytes = int(dst.size) * int(dst.dtype.itemsize)
        if nbytes:
            rt.memcpyAsync(int(dst.data.ptr), int(src.data.ptr), nbytes,
                           rt.memcpyDeviceToDevice, self.stream.ptr)

    @staticmethod
    def _check_sizes(dst: Any, src: Any) -> None:
        if int(dst.size) != int(src.size):
            raise ValueError(f"copy_into: {src.size} elements into {dst.size}")

    def divide(self, buf: Any, n: int) -> None:
        if n == 1 or int(buf.size) == 0:
            return
        with self.stream:
            if str(buf.dtype) in EW_DTYPES:
                self._div_half(np.float32(n), buf)
            else:
                self._div(buf.dtype.type(n), buf)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def default_transport(self) -> str:
        from .availability import default_gpu_transport

        return default_gpu_transport()

    def mpi_refusal(self) -> str | None:
        if cuda_aware_mpi():
            return None
        return ("this MPI is not CUDA-aware (set RINGTUNE_CUDA_AWARE=1 if it is); use "
                "transport 'staged' or 'nccl'")

    def to_numpy(self, buf: Any) -> np.ndarray:
        self.synchronize()
        arr = self._view(buf)
        return cupy.asnumpy(arr, stream=self.stream)
