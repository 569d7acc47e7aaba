"""A simulated CuPy: the GPU tests (``tests/gpu``) on the CPU, for what a fake can check.

``make gpu-sim`` (part of ``make test``) puts ``tests/fakegpu`` first on ``sys.path`` with
``RINGTUNE_FAKE_GPU=1`` (``tests/gpu/conftest.py``), so ``import cupy`` finds this package
and the whole GPU suite — ``CupyBackend``, ``CudaOps``, the ``staged`` and CUDA-aware
``mpi`` transports, every algorithm through ``Communicator``, ``ringtune tune --backend
cupy`` — runs here at several ranks. It implements only the CuPy surface ringtune and its
tests use, with the semantics that matter to them:

* device memory is host memory; arrays remember their device, and ``CUDA_VISIBLE_DEVICES``
  is replaced by ``RINGTUNE_FAKE_GPUS`` (default 1 GPU, shared by every rank);
* array writes (``a[...] = v``, ``a += 1``) are queued on the current stream like CuPy's
  kernels, and results computed at once (``a + b``, ``float(a)``) first let the current
  stream finish — so a caller writing on its own stream is ordered only by events;
* work queued on a non-default stream — ``RawKernel``/``ElementwiseKernel`` launches inside
  ``with stream:``, ``runtime.memcpyAsync`` — runs later, in a seeded random order across
  streams, only as events and streams allow (``_engine``): a missing wait gives a wrong
  result here as it may on a GPU;
* ``RawKernel`` compiles ringtune's CUDA source for the CPU and runs every thread of the
  grid (``_hostkernels``); ``ElementwiseKernel`` evaluates its C body with C's rules
  (``_cexpr``), half types computed in float and rounded on assignment;
* ``cupy.cuda.nccl`` is NCCL's interface carried by MPI on the streams (``cuda/nccl.py``);
  with ``RINGTUNE_FAKE_GPUS`` ≥ ranks every rank has its own GPU and the ``nccl`` transport
  runs.

The GPU progresses only while the host waits for it or polls it (a real one runs on its
own), so a rank blocked in MPI while its peer waits for this rank's queued NCCL work would
hang — correct code never leaves GPU communication un-awaited. What it cannot tell:
anything about CUDA itself (concurrency inside a kernel, speed, driver errors, CuPy's
pinned-pool reuse, the real NCCL library). Those need ``tests/gpu/device_check.sh``.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import numpy as np

from . import _cexpr, _hostkernels, cuda
from ._engine import MEMORY

__version__ = "14.2.0+ringtune.fake"

float16, float32, float64 = np.float16, np.float32, np.float64
int32, int64, uint8, complex64 = np.int32, np.int64, np.uint8, np.complex64


class _MemoryPointer:
    __slots__ = ("ptr", "device_id")

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr = ptr
        self.device_id = device_id


def _new(a: np.ndarray, device: int | None = None) -> ndarray:
    """A device array over ``a``, a fresh host allocation standing for device memory."""
    dev = cuda.runtime.getDevice() if device is None else device
    cuda.runtime.check_allocation(a.nbytes, dev)
    owner = a
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    MEMORY.add(int(owner.__array_interface__["data"][0]), owner.nbytes, owner, pinned=False,
               device=dev)
    return ndarray(a, dev, keep=owner)


def _settle() -> None:
    """Before array work done here at once: let the current stream finish what it has
    queued (work on one stream runs in order; running it now is one order a GPU may pick)."""
    cuda.get_current_stream().synchronize()


def _on_stream(fn: Any) -> None:
    """Array work that writes: queued on the current stream, like CuPy's kernels."""
    cuda.get_current_stream()._enqueue(fn)


def _unwrap(v: Any) -> Any:
    if isinstance(v, ndarray):
        return v._a
    if isinstance(v, tuple):
        return tuple(_unwrap(x) for x in v)
    return v


class ndarray:  # noqa: N801 - CuPy's name
    """A device array: a NumPy array standing for device memory, and its device."""

    __slots__ = ("_a", "_device", "_keep", "__weakref__")

    def __init__(self, a: np.ndarray, device: int, keep: Any = None) -> None:
        self._a = a
        self._device = device
        self._keep = keep  # what keeps the memory alive (a view of foreign memory)

    # -- what CuPy arrays have --------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    dtype = property(lambda self: self._a.dtype)
    itemsize = property(lambda self: self._a.itemsize)
    nbytes = property(lambda self: self._a.nbytes)
    strides = property(lambda self: self._a.strides)

    @property
    def flags(self) -> Any:
        return SimpleNamespace(c_contiguous=self._a.flags.c_contiguous,
                               f_contiguous=self._a.flags.f_contiguous, owndata=False)

    @property
    def data(self) -> _MemoryPointer:
        return _MemoryPointer(int(self._a.__array_interface__["data"][0]), self._device)

    def _view(self, a: np.ndarray) -> ndarray:
        return ndarray(a, self._device, self._keep)

    def reshape(self, *shape: Any) -> ndarray:
        return self._view(self._a.reshape(*shape))

    def view(self, dtype: Any) -> ndarray:
        return self._view(self._a.view(dtype))

    def __getitem__(self, key: Any) -> ndarray:
        key = _unwrap(key)
        out = self._a[key]
        if not isinstance(out, np.ndarray):  # an element: CuPy gives a 0-d view of it
            k = key if isinstance(key, tuple) else (key,)
            return self._view(self._a[(*k, Ellipsis)])
        return self._view(out)

    def __setitem__(self, key: Any, value: Any) -> None:
        a, k = self._a, _unwrap(key)

        def write() -> None:
            a[k] = _unwrap(value)

        _on_stream(write)

    def __len__(self) -> int:
        return len(self._a)

    def astype(self, dtype: Any, copy: bool = True) -> ndarray:
        _settle()
        return _new(self._a.astype(dtype), self._device)

    def copy(self) -> ndarray:
        _settle()
        return _new(self._a.copy(), self._device)

    def all(self) -> ndarray:
        _settle()
        return _new(np.array(self._a.all()), self._device)

    # Reading a value on the host: a blocking copy on the current stream.
    def __bool__(self) -> bool:
        _settle()
        return bool(self._a)

    def __float__(self) -> float:
        _settle()
        return float(self._a)

    def __int__(self) -> int:
        _settle()
        return int(self._a)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed: use "
                        "cupy.asnumpy()")

    def __repr__(self) -> str:
        return f"fake_cupy.ndarray(device={self._device}, {self._a!r})"

    # -- interchange --------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if self._a.dtype.kind == "V":
            raise TypeError(f"dtype {self._a.dtype} has no __cuda_array_interface__ typestr")
        return {"shape": self._a.shape, "typestr": self._a.dtype.str,
                "data": (self.data.ptr, False), "version": 3,
                "strides": None if self._a.flags.c_contiguous else self._a.strides}

    def __dlpack__(self, **kwargs: Any) -> Any:
        # The host capsule of the memory, in the version the consumer asked for; ``stream``
        # is a GPU notion NumPy refuses (the simulated GPU has no stream to order against).
        # NumPy's DLPack has no bfloat16 (CuPy's has): export its bytes as uint16.
        a = self._a.view(np.uint16) if self._a.dtype.kind == "V" else self._a
        return a.__dlpack__(**{k: v for k, v in kwargs.items() if k != "stream"})

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._device)  # kDLCUDA

    # -- arithmetic: writes are queued on the current stream; results computed here at once
    #    come after what that stream has queued (``_settle``) ----------------------------
    def _binop(self, other: Any, fn: Any) -> ndarray:
        _settle()
        return _new(np.asarray(fn(self._a, _unwrap(other))), self._device)

    def _inplace(self, other: Any, fn: Any) -> ndarray:
        a, o = self._a, other

        def update() -> None:
            fn(a, _unwrap(o), out=a)

        _on_stream(update)
        return self

    def __add__(self, o: Any) -> ndarray:
        return self._binop(o, np.add)

    def __iadd__(self, o: Any) -> ndarray:
        return self._inplace(o, np.add)

    def __eq__(self, o: Any) -> ndarray:  # type: ignore[override]
        return self._binop(o, np.equal)

    def __ne__(self, o: Any) -> ndarray:  # type: ignore[override]
        return self._binop(o, np.not_equal)

    __hash__ = None  # type: ignore[assignment]


# -- creation and transfer -------------------------------------------------------------------


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.empty(shape, dtype=dtype))


def zeros(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.zeros(shape, dtype=dtype))


def ones(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return _new(np.ones(shape, dtype=dtype))


def full(shape: Any, fill_value: Any, dtype: Any = None) -> ndarray:
    return _new(np.full(shape, fill_value, dtype=dtype))


def arange(*args: Any, dtype: Any = None) -> ndarray:
    return _new(np.arange(*args, dtype=dtype))


def _foreign(ptr: int, shape: tuple[int, ...], dt: np.dtype, strides: Any) -> ndarray:
    """A device array over memory another object owns (``__cuda_array_interface__``)."""
    found = MEMORY.find(ptr)
    if found is None:
        raise ValueError(f"pointer {ptr:#x} is not simulated device memory")
    owner, pinned, device = found
    if pinned:
        raise ValueError(f"pointer {ptr:#x} is pinned host memory, not device memory")
    count = int(np.prod(shape)) if shape else 1
    span = (count - 1) * max(abs(s) for s in strides) + dt.itemsize if (
        strides and count) else count * dt.itemsize
    raw = (ctypes.c_char * max(span, 1)).from_address(ptr)
    a = np.frombuffer(raw, dtype=np.uint8, count=span)
    arr = (np.lib.stride_tricks.as_strided(a.view(dt), shape, strides) if strides
           else a.view(dt).reshape(shape))
    return ndarray(arr, device, keep=owner)


def asarray(obj: Any, dtype: Any = None) -> ndarray:
    if isinstance(obj, ndarray):
        return obj if dtype is None or np.dtype(dtype) == obj.dtype else obj.astype(dtype)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        arr = _foreign(int(cai["data"][0]), tuple(cai["shape"]), np.dtype(cai["typestr"]),
                       cai.get("strides"))
        return arr if dtype is None else arr.astype(dtype)
    # Host data: a copy to the device (CuPy stages pageable memory before returning).
    return _new(np.array(obj, dtype=dtype, copy=True))


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None, *,
            blocking: bool = True) -> np.ndarray:
    """Blocking copy to the host, ordered on ``stream`` (default: the current stream)."""
    if not isinstance(a, ndarray):
        return np.asarray(a)
    (stream or cuda.get_current_stream()).synchronize()
    return np.array(a._a, copy=True)


class _AsCpu:
    """Presents a DLPack producer as a CPU one, so NumPy imports the (host) memory."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.obj.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def from_dlpack(obj: Any, *, device: Any = None, copy: Any = None) -> ndarray:
    if isinstance(obj, ndarray):
        return obj
    kind, _ = obj.__dlpack_device__()
    if int(kind) != 2:
        raise RuntimeError(f"from_dlpack: not a CUDA DLPack device ({kind})")
    a = np.from_dlpack(_AsCpu(obj))
    found = MEMORY.find(int(a.__array_interface__["data"][0]))
    if found is None:
        raise ValueError("from_dlpack: memory is not simulated device memory")
    return ndarray(a, found[2], keep=found[0])


# -- kernels ------------------------------------------------------------------------------------


class RawKernel:
    """Runs ringtune's raw reduction kernels: compiled for the CPU, launched on the current
    stream, executed thread by thread when the stream runs."""

    def __init__(self, code: str, name: str, options: tuple[str, ...] = (),
                 backend: str = "nvrtc", translate_cucomplex: bool = False, *,
                 enable_cooperative_groups: bool = False, jitify: Any = None) -> None:
        self.code = code
        self.name = name
        self._fn: Any = None

    def __call__(self, grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                 *, shared_mem: int = 0) -> None:
        if self._fn is None:
            lib = _hostkernels.build(_hostkernels.wrap(self.code, self.name, "k"))
            self._fn = _hostkernels.launcher(lib, self.name)
        for a in args:
            if isinstance(a, np.ndarray):
                raise TypeError("RawKernel got a NumPy (host) array: pass device arrays")
        keep = [a for a in args if isinstance(a, ndarray)]
        conv = [a.data.ptr if isinstance(a, ndarray) else int(a) for a in args]
        fn = self._fn
        g, b = int(grid[0]), int(block[0])

        def op() -> None:
            fn(*conv, g, b)
            del keep[:]

        cuda.get_current_stream()._enqueue(op)


_PARAM_TYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
                "int64": np.int64, "float16": np.float16}


class ElementwiseKernel:
    """Evaluates the kernel's C body element-wise on the current stream (see ``_cexpr``)."""

    def __init__(self, in_params: str, out_params: str, operation: str,
                 name: str = "kernel", **kwargs: Any) -> None:
        def parse(text: str) -> list[tuple[str, str]]:
            return [tuple(p.split()[-2:]) for p in text.split(",") if p.strip()]  # type: ignore
        self.ins = parse(in_params)
        self.outs = parse(out_params)
        self.operation = operation
        self.name = name

    def __call__(self, *args: Any) -> None:
        params = self.ins + self.outs
        if len(args) != len(params):
            raise TypeError(f"{self.name}: wrong number of arguments ({len(args)} for "
                            f"{len(params)})")
        t_dtype = next((a.dtype for (t, _), a in zip(params, args)
                        if t == "T" and isinstance(a, ndarray)), None)
        for a in args:
            if isinstance(a, np.ndarray):
                raise TypeError(f"{self.name}: got a NumPy (host) array: pass device arrays")
        arrays = [a for a in args if isinstance(a, ndarray)]
        if arrays and len({a.shape for a in arrays}) > 1:
            raise ValueError(f"{self.name}: shapes differ {[a.shape for a in arrays]}")
        half = t_dtype is not None and (t_dtype == np.float16 or t_dtype.kind == "V"
                                        or t_dtype.name == "bfloat16")

        def value(ptype: str, a: Any) -> Any:
            if isinstance(a, ndarray):
                return a._a.astype(np.float32) if half and ptype == "T" else a._a
            if ptype == "T":
                return np.float32(a) if half else np.asarray(a, dtype=t_dtype)[()]
            return _PARAM_TYPES[ptype](a)

        def op() -> None:
            env = {name: value(ptype, a) for (ptype, name), a in zip(params, args)}
            result = _cexpr.run(self.operation, env)
            for (_ptype, name), a in zip(self.outs, args[len(self.ins):]):
                if name in result:
                    a._a[...] = np.asarray(result[name]).astype(a.dtype)

        cuda.get_current_stream()._enqueue(op)
