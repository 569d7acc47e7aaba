"""Array backends: the few array operations the algorithms need, on NumPy or CuPy arrays.

Algorithms never call NumPy or CuPy directly; they call a ``Backend``. That keeps one
implementation of each algorithm for host and GPU buffers. This module holds the interface
and the NumPy backend; ``collectives.registry`` finds backends by name (``get_backend``) or
from a buffer (``backend_for``), and loads a plug-in's backend (CuPy) only when a GPU buffer
arrives or it is asked for by name, so ``import collectives`` stays light.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from .ops import check_dtype, is_integer


class Backend(ABC):
    """Array operations on one kind of memory. One instance per kind, shared by plans."""

    #: Name used in profiles and on the command line (``numpy`` | ``cupy``).
    name: str = ""
    #: True when arrays live in GPU memory (transports must treat them accordingly).
    on_gpu: bool = False
    #: Dtypes supported beyond ``ops.DTYPES``.
    extra_dtypes: tuple[str, ...] = ()

    @abstractmethod
    def as_flat(self, buf: Any) -> Any:
        """A 1-D writable view of ``buf`` without copying; ``TypeError``/``ValueError`` if
        ``buf`` is not C-contiguous or not writable."""

    @abstractmethod
    def empty(self, count: int, dtype: str) -> Any:
        """A new 1-D array for scratch space (allocated once per plan, not per call)."""

    @abstractmethod
    def reduce_into(self, dst: Any, src: Any, op: str) -> None:
        """``dst = dst (op) src`` elementwise, in place. ``op`` is sum/prod/min/max."""

    @abstractmethod
    def copy_into(self, dst: Any, src: Any) -> None:
        """``dst[...] = src``."""

    @abstractmethod
    def divide(self, buf: Any, n: int) -> None:
        """In place ``buf /= n`` for ``avg``; integers truncate toward zero (as NCCL)."""

    def synchronize(self) -> None:
        """Wait until queued work on this backend's arrays is done (no-op on the host)."""

    def default_transport(self) -> str:
        """The transport for this backend's buffers when neither the call nor the profile
        names one."""
        return "mpi"

    def mpi_refusal(self) -> str | None:
        """Why MPI cannot be handed this backend's buffers (the sentence says what to do),
        or ``None`` when it can."""
        return None

    def to_numpy(self, buf: Any) -> np.ndarray:
        """``buf``'s contents on the host: a host array as it is, a GPU buffer copied down
        once the work queued on it has finished."""
        return np.asarray(buf)


class NumpyBackend(Backend):
    """Host arrays. Reductions use NumPy ufuncs with ``out=`` so they allocate nothing."""

    name = "numpy"
    on_gpu = False

    _UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
               "max": np.maximum}

    def as_flat(self, buf: Any) -> np.ndarray:
        if not isinstance(buf, np.ndarray):
            raise TypeError(f"expected a NumPy array, got {type(buf).__name__}")
        if not buf.flags.c_contiguous:
            raise ValueError(
                "buffer is not C-contiguous: pass numpy.ascontiguousarray(buf) and copy the "
                "result back"
            )
        if not buf.flags.writeable:
            raise ValueError("buffer is read-only: allreduce works in place, pass a writable "
                             "array (buf.copy())")
        return buf.reshape(-1)

    def empty(self, count: int, dtype: str) -> np.ndarray:
        return np.empty(count, dtype=np.dtype(dtype))

    def reduce_into(self, dst: np.ndarray, src: np.ndarray, op: str) -> None:
        self._UFUNCS[op](dst, src, out=dst)

    def copy_into(self, dst: np.ndarray, src: np.ndarray) -> None:
        np.copyto(dst, src)

    def divide(self, buf: np.ndarray, n: int) -> None:
        if is_integer(str(buf.dtype)):
            # Truncate toward zero, as C and NCCL's ncclAvg do (floor_divide rounds down).
            neg = buf < 0
            np.abs(buf, out=buf)
            np.floor_divide(buf, n, out=buf)
            np.negative(buf, out=buf, where=neg)
        else:
            np.divide(buf, buf.dtype.type(n), out=buf)


#: The one NumPy backend instance (backends are shared by plans).
NUMPY = NumpyBackend()


def is_gpu_array(buf: Any) -> bool:
    """Whether ``buf`` lives in GPU memory: it exposes ``__cuda_array_interface__`` (CuPy)
    or a CUDA DLPack device (a torch CUDA tensor)."""
    try:
        # A property that raises (torch bfloat16 tensors do) still marks a GPU array.
        buf.__cuda_array_interface__  # noqa: B018 - evaluated for its exception
        return True
    except AttributeError:
        pass
    except Exception:
        return True
    dev = getattr(buf, "__dlpack_device__", None)
    if dev is not None:
        try:
            kind = dev()[0]
        except Exception:
            return False
        return int(kind) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
    return False


def check_buffer_dtype(backend: Backend, dtype: Any) -> str:
    """Canonical dtype name of a buffer, or ``TypeError`` naming the supported ones."""
    return check_dtype(dtype, backend.extra_dtypes)
