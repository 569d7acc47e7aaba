"""The generated CUDA reduction kernels, checked without a GPU.

* ``launch_plan`` (pure): the vector body starts 16-byte aligned for both pointers, or is
  not used.
* The kernel sources are compiled with the host C++ compiler against a tiny shim (CUDA's
  built-in variables and vector types as plain C++), and every (dtype, op) kernel is run
  thread by thread over misaligned views: the head/vector/tail split must cover each
  element exactly once and compute what NumPy computes (NaN propagation included).
* The same sources are compiled by ``nvcc`` to PTX when it is installed (syntax and types
  as the GPU compiler sees them).
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives.cuda import kernels as K

from ..fakegpu.cupy import _hostkernels as hostkernels

CXX = hostkernels.compiler()
NVCC = shutil.which("nvcc")

CASES = [(d, op) for d in K.RAW_TYPES for op in K.KERNEL_OPS]


def _all_sources(wrap_launcher: bool) -> str:
    parts = []
    for i, (dtype, op) in enumerate(CASES):
        name, ns = K.kernel_name(dtype, op), f"k{i}"
        source = K.reduce_source(dtype, op)
        parts.append(hostkernels.wrap(source, name, ns) if wrap_launcher else
                     f"namespace {ns} {{\n{source}\n}}\n")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if CXX is None:
        pytest.skip("no host C++ compiler (g++/clang++) to emulate the kernels")
    return hostkernels.build(_all_sources(True), tmp_path_factory.mktemp("kern"))


def _data(dtype: str, n: int, rng: np.random.Generator, nans: bool) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-50, 50, size=n).astype(dtype)
    a = rng.standard_normal(n).astype(dtype)
    if nans and n > 4:
        a[rng.choice(n, size=max(1, n // 7), replace=False)] = np.nan
    return a


def _expected(dst: np.ndarray, src: np.ndarray, op: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                "max": np.maximum}[op](dst, src)


@pytest.mark.parametrize("dtype,op", CASES)
def test_emulated_kernel_matches_numpy(emulated: ctypes.CDLL, dtype: str, op: str) -> None:
    rng = np.random.default_rng(7)
    item = np.dtype(dtype).itemsize
    fn = hostkernels.launcher(emulated, K.kernel_name(dtype, op))
    checked_vec = checked_scalar = 0
    for n in (1, 2, 3, 5, 8, 17, 64, 1000, 4099):
        for doff in range(0, 16 // item + 1):
            for soff in (doff, (doff + 1) % (16 // item)):
                dbuf = _data(dtype, n + 8, rng, op in ("min", "max"))
                sbuf = _data(dtype, n + 8, rng, op in ("min", "max"))
                dst, src = dbuf[doff:doff + n], sbuf[soff:soff + n]
                orig = dst.copy()
                want = _expected(orig, src, op)
                for max_blocks in (1, 3):
                    # In place in the misaligned view itself: its address is what matters.
                    dst[...] = orig
                    got = dst
                    plan = K.launch_plan(got.ctypes.data, src.ctypes.data, n, item,
                                         max_blocks)
                    fn(got.ctypes.data, src.ctypes.data, n, plan.head, plan.vec, plan.grid,
                       K.BLOCK)
                    assert np.array_equal(got, want, equal_nan=not dtype.startswith("int")), (
                        f"{dtype} {op} n={n} offsets=({doff},{soff}) plan={plan}")
                    checked_vec += plan.vec
                    checked_scalar += 1 - plan.vec
    assert checked_vec and checked_scalar, "both the vector and the scalar path must run"


def test_launch_plan_aligns_both_pointers() -> None:
    for item in (4, 8):
        lanes = 16 // item
        for base in (0x1000, 0x2000):
            for doff in range(0, 64, item):
                for soff in range(0, 64, item):
                    for n in (0, 1, lanes - 1, lanes, 3 * lanes + 1, 10_000):
                        p = K.launch_plan(base + doff, base + 0x100 + soff, n, item, 64)
                        if n == 0:
                            assert p == K.Launch(0, 0, 0)
                            continue
                        assert 1 <= p.grid <= 64
                        if p.vec:
                            assert (base + doff + p.head * item) % 16 == 0
                            assert (base + 0x100 + soff + p.head * item) % 16 == 0
                            assert p.head < lanes and n - p.head >= lanes
                        else:
                            assert p.head == 0
                        if doff % 16 == soff % 16 and n >= 2 * lanes:
                            assert p.vec == 1, (item, doff, soff, n)
                        if doff % 16 != soff % 16:
                            assert p.vec == 0


def test_launch_plan_caps_the_grid() -> None:
    p = K.launch_plan(0, 0, 64 << 20, 4, 132 * 32)
    assert p.grid == 132 * 32 and p.vec == 1
    assert K.launch_plan(0, 0, 100, 4, 4096).grid == 1


def test_bad_dtype_and_op_are_named() -> None:
    with pytest.raises(TypeError, match="float16"):
        K.reduce_source("float16", "sum")
    with pytest.raises(ValueError, match="'avg'"):
        K.reduce_source("float32", "avg")


def test_half_ops_cover_every_kernel_op() -> None:
    assert set(K.EW_OPS) == set(K.KERNEL_OPS)
    for body in K.EW_OPS.values():
        assert body.startswith("y = ") and "x" in body


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed: GPU compile check skipped")
def test_sources_compile_with_nvcc(tmp_path: Path) -> None:
    src = tmp_path / "kernels.cu"
    src.write_text(_all_sources(False))
    out = subprocess.run([str(NVCC), "-arch=sm_80", "--ptx", "-o", str(tmp_path / "k.ptx"),
                          str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ptx = (tmp_path / "k.ptx").read_text()
    for dtype, op in CASES:
        assert K.kernel_name(dtype, op) in ptx


def test_bfloat16_is_claimed_only_when_its_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bfloat16_dtype`` must run the half kernel, not just allocate: an older CuPy may
    allocate arrays of ml_dtypes' bfloat16 and fail only when compiling a kernel for it.
    CuPy and ml_dtypes are faked (neither is needed here)."""
    import importlib
    import sys
    import types

    import collectives.cuda as cuda_pkg

    state = {"compiles": False}
    launched: list[str] = []

    class FakeKernel:
        def __init__(self, params_in: str, params_out: str, body: str, name: str) -> None:
            self.body = body

        def __call__(self, x: np.ndarray, y: np.ndarray) -> None:
            if not state["compiles"]:
                raise TypeError("Unsupported type bfloat16")
            launched.append(self.body)

    fake_cupy: Any = types.ModuleType("cupy")
    fake_cupy.zeros = lambda n, dtype: np.zeros(n, dtype=dtype)  # allocation always works
    fake_cupy.ElementwiseKernel = FakeKernel
    fake_cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None))
    fake_ml: Any = types.ModuleType("ml_dtypes")
    fake_ml.bfloat16 = np.dtype("V2")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "ml_dtypes", fake_ml)
    monkeypatch.setattr(cuda_pkg, "backend", None, raising=False)
    saved = sys.modules.pop("collectives.cuda.backend", None)
    try:
        mod = importlib.import_module("collectives.cuda.backend")
        assert mod.bfloat16_dtype() is None
        state["compiles"] = True
        assert mod.bfloat16_dtype() == np.dtype("V2")
        assert launched == [K.EW_OPS["sum"]]
    finally:
        sys.modules.pop("collectives.cuda.backend", None)
        if saved is not None:
            sys.modules["collectives.cuda.backend"] = saved
