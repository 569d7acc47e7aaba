"""The CuPy backend on one GPU: binding, reduction kernels against NumPy for every dtype and
op (aligned, misaligned and tiny views), avg division, copies, zero-copy views of CuPy /
``__cuda_array_interface__`` / DLPack / PyTorch buffers, and its errors. Skipped without a
GPU (tests/gpu/conftest.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from collectives.cuda import kernels as K
from collectives.ops import DTYPES

OPS = ("sum", "prod", "min", "max")


def _upload(*hosts: np.ndarray) -> list[Any]:
    """The arrays on the GPU, ready for the backend's stream. ``cupy.asarray`` copies on
    CuPy's current stream and may return before the copy is done (CuPy ≥ 13), and the
    backend's non-blocking stream is not ordered after it: ``Communicator.allreduce`` orders
    them (``as_flat``); tests that call the backend directly must wait here."""
    import cupy

    out = [cupy.asarray(h) for h in hosts]
    cupy.cuda.get_current_stream().synchronize()
    return out


def _host(dtype: Any, n: int, rng: np.random.Generator, op: str) -> np.ndarray:
    if np.dtype(dtype).kind == "i":
        return rng.integers(-9, 10, size=n).astype(dtype)
    lo, hi = (0.5, 1.5) if op == "prod" else (-4, 4)
    return rng.uniform(lo, hi, size=n).astype(dtype)


def test_binding_follows_local_rank_and_names_the_bus(backend: Any) -> None:
    import cupy

    from collectives.cuda import current_binding
    from collectives.cuda.binding import normalize_bus_id
    from collectives.mpi.launcher import local_rank

    b = current_binding()
    assert b is not None and b.device == backend.device
    count = cupy.cuda.runtime.getDeviceCount()
    assert b.device == local_rank()[0] % count
    assert b.pci_bus_id == normalize_bus_id(cupy.cuda.runtime.deviceGetPCIBusId(b.device))
    assert cupy.cuda.runtime.getDevice() == b.device
    # A property or a method depending on the CuPy version: a bound method is always true.
    nb = backend.stream.is_non_blocking
    assert (nb() if callable(nb) else nb) is True


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_into_matches_numpy(backend: Any, dtype: str, op: str) -> None:
    import cupy

    rng = np.random.default_rng(3)
    fails = []
    for n in (1, 3, 4, 5, 17, 1000, (1 << 20) + 5):
        for doff, soff in ((0, 0), (1, 1), (3, 3), (1, 2), (0, 3)):
            dh = _host(dtype, n + 4, rng, op)
            sh = _host(dtype, n + 4, rng, op)
            d, s = _upload(dh, sh)
            dv, sv = d[doff:doff + n], s[soff:soff + n]
            backend.reduce_into(dv, sv, op)
            backend.synchronize()
            want = dh.copy()
            with np.errstate(all="ignore"):
                {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                 "max": np.maximum}[op](want[doff:doff + n], sh[soff:soff + n],
                                        out=want[doff:doff + n])
            got = cupy.asnumpy(d)
            if not np.array_equal(got, want):
                i = int(np.flatnonzero(got != want)[0])
                fails.append(f"n={n} offsets=({doff},{soff}) index {i}: expected {want[i]!r}, "
                             f"got {got[i]!r}")
    assert not fails, fails[:5]


@pytest.mark.parametrize("op", ("min", "max"))
def test_min_max_propagate_nan(backend: Any, op: str) -> None:
    dh = np.array([1, np.nan, 3, np.nan, 5, 6, 7, 8], dtype=np.float32)
    sh = np.array([2, 2, np.nan, np.nan, 4, 7, 7, 0], dtype=np.float32)
    d, s = _upload(dh, sh)
    backend.reduce_into(d, s, op)
    want = (np.minimum if op == "min" else np.maximum)(dh, sh)
    assert np.array_equal(backend.to_numpy(d), want, equal_nan=True)


def test_bfloat16_when_supported(backend: Any) -> None:
    if "bfloat16" not in backend.extra_dtypes:
        pytest.skip("this CuPy has no bfloat16 (needs CuPy ≥ 14 with ml_dtypes)")
    dt = backend.dtype("bfloat16")
    for op in OPS:
        dh = np.arange(-8, 8).astype(np.float32).astype(dt)
        sh = np.full(16, 2).astype(np.float32).astype(dt)
        d, s = _upload(dh, sh)
        backend.reduce_into(d, s, op)
        ref = {"sum": np.add, "prod": np.multiply, "min": np.minimum,
               "max": np.maximum}[op](dh.astype(np.float32), sh.astype(np.float32))
        assert np.array_equal(backend.to_numpy(d).astype(np.float32), ref), op


def test_divide_truncates_integers_toward_zero(backend: Any) -> None:
    for dtype in ("int32", "int64"):
        (a,) = _upload(np.array([-7, -6, -1, 0, 1, 6, 7], dtype=dtype))
        backend.divide(a, 3)
        assert backend.to_numpy(a).tolist() == [-2, -2, 0, 0, 0, 2, 2]
    for dtype in ("float16", "float32", "float64"):
        (a,) = _upload(np.array([3, -6, 1], dtype=dtype))
        backend.divide(a, 3)
        np.testing.assert_allclose(backend.to_numpy(a).astype(np.float64), [1, -2, 1 / 3],
                                   rtol=1e-3)


def test_copies_between_host_and_device(backend: Any) -> None:
    a = backend.empty(1000, "float32")
    host = np.arange(1000, dtype=np.float32)
    backend.copy_into(a, host)
    b = backend.empty(1000, "float32")
    backend.copy_into(b, a)
    out = np.zeros(1000, dtype=np.float32)
    backend.copy_into(out, b)
    assert np.array_equal(out, host)
    ints = backend.empty(5, "int64")
    backend.copy_into(ints, np.arange(5, dtype=np.float32))  # cast on the host
    assert backend.to_numpy(ints).tolist() == [0, 1, 2, 3, 4]


class _Cai:
    """Only ``__cuda_array_interface__`` (what Numba and others export)."""

    def __init__(self, arr: Any) -> None:
        self.__cuda_array_interface__ = arr.__cuda_array_interface__
        self._keep = arr


class _DLPack:
    """Only DLPack."""

    def __init__(self, arr: Any) -> None:
        self._arr = arr

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._arr.__dlpack_device__()


def test_views_without_copy(backend: Any) -> None:
    import cupy

    from collectives.registry import backend_for

    base = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    for obj in (base, _Cai(base), _DLPack(base)):
        assert backend_for(obj) is backend
        flat = backend.as_flat(obj)
        assert flat.shape == (12,) and int(flat.data.ptr) == int(base.data.ptr)


def test_torch_tensor_zero_copy(backend: Any) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    t = torch.arange(10, dtype=torch.float32, device=f"cuda:{backend.device}")
    flat = backend.as_flat(t)
    assert int(flat.data.ptr) == t.data_ptr()
    if "bfloat16" in backend.extra_dtypes:
        tb = torch.ones(8, dtype=torch.bfloat16, device=f"cuda:{backend.device}")
        assert int(backend.as_flat(tb).data.ptr) == tb.data_ptr()


def test_errors_name_value_and_fix(backend: Any) -> None:
    import cupy

    with pytest.raises(ValueError, match="not C-contiguous"):
        backend.as_flat(cupy.zeros((4, 4), dtype=cupy.float32)[:, 1])
    with pytest.raises(TypeError, match="no GPU reduction kernel for dtype complex64"):
        backend.reduce_into(cupy.zeros(4, cupy.complex64), cupy.zeros(4, cupy.complex64), "sum")
    with pytest.raises(TypeError, match="unsupported dtype float128|unsupported dtype"):
        backend.dtype("float128")
    if cupy.cuda.runtime.getDeviceCount() > 1:
        other = (backend.device + 1) % cupy.cuda.runtime.getDeviceCount()
        with cupy.cuda.Device(other):
            elsewhere = cupy.zeros(4, dtype=cupy.float32)
        with pytest.raises(ValueError, match=f"on GPU {other}.*bound to"):
            backend.as_flat(elsewhere)


def test_caller_stream_is_respected(backend: Any) -> None:
    """Data written on the caller's stream is seen by a reduction queued right after."""
    import cupy

    user = cupy.cuda.Stream(non_blocking=True)
    n = 1 << 24
    with user:
        a = cupy.zeros(n, dtype=cupy.float32)
        b = cupy.ones(n, dtype=cupy.float32)
        for _ in range(3):
            a += 1  # keeps the user stream busy
        flat = backend.as_flat(a)
        backend.reduce_into(flat, b, "sum")
    backend.synchronize()
    assert float(cupy.asnumpy(a[-1])) == 4.0 and float(cupy.asnumpy(a[0])) == 4.0


def test_raw_kernels_exist_for_every_raw_dtype() -> None:
    assert set(K.RAW_TYPES) | set(K.EW_DTYPES) >= set(DTYPES)
