"""Run ringtune's generated CUDA reduction kernels on the CPU, thread by thread.

The kernel source of ``collectives.cuda.kernels.reduce_source`` is compiled by the host C++
compiler against ``SHIM`` (CUDA's built-in index variables and 16-byte vector types as plain
C++) with a launcher that calls the kernel once per (block, thread) of the grid. So the
very code the GPU would run — head, vector body, tail, grid-stride loops — runs here on the
real (misaligned) addresses. Used by ``tests/cli/test_cuda_kernels.py`` and by the
simulated GPU's ``RawKernel``.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

SHIM = """
#include <cstdint>
struct rt_dim3 { unsigned int x, y, z; };
static rt_dim3 blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) longlong2 { long long x, y; };
"""

LAUNCHER = """
extern "C" void launch_{name}(void* dst, const void* src, long long n, long long head,
                              int vec, unsigned grid, unsigned block) {{
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {ns}::{name}(({ns}::rt_t*)dst, (const {ns}::rt_t*)src, n, head, vec);
        }}
}}
"""

ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong,
            ctypes.c_int, ctypes.c_uint, ctypes.c_uint]


def compiler() -> str | None:
    """The host C++ compiler, or None."""
    return shutil.which("g++") or shutil.which("clang++")


def wrap(source: str, name: str, ns: str) -> str:
    """One kernel source in its own namespace, with its launcher ``launch_<name>``."""
    return f"namespace {ns} {{\n{source}\n}}\n" + LAUNCHER.format(name=name, ns=ns)


def build(sources: str, workdir: Path | None = None) -> ctypes.CDLL:
    """Compile ``SHIM + sources`` into a shared library and load it."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no host C++ compiler (g++/clang++) to run CUDA kernels on the CPU")
    digest = hashlib.sha256(sources.encode()).hexdigest()[:16]
    where = workdir or Path(tempfile.gettempdir()) / "ringtune-hostkernels"
    where.mkdir(parents=True, exist_ok=True)
    lib = where / f"k{digest}.so"
    if not lib.exists():
        src = where / f"k{digest}.cpp"
        src.write_text(SHIM + sources)
        tmp = where / f"k{digest}.{id(src)}.so"
        subprocess.run([cxx, "-O1", "-std=c++17", "-shared", "-fPIC", "-o", str(tmp), str(src)],
                       check=True, capture_output=True, text=True)
        tmp.replace(lib)  # atomic: ranks compiling the same kernel at once do not collide
    return ctypes.CDLL(str(lib))


def launcher(lib: ctypes.CDLL, name: str) -> ctypes._CFuncPtr:
    fn = getattr(lib, "launch_" + name)
    fn.argtypes = ARGTYPES
    return fn
