"""What this process can do with GPU buffers, found without importing CuPy where possible.

Use these probes to decide which GPU transports exist here: ``cuda_aware_mpi()`` (can MPI
move device memory?), ``cupy_status()`` / ``nccl_status()`` (are CuPy, a GPU and NCCL
usable?), and the launcher's view of the rank layout (``local_rank()``, ``local_size()``,
``world_rank()``) read from environment variables so no collective is needed.

Every probe is cheap after its first call (results are cached per process) and never
raises for "not available": it returns ``False``/``None`` and a reason that error messages
quote. Only a malformed ``RINGTUNE_CUDA_AWARE`` raises, because silently ignoring a typo
in an override would be worse than stopping.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from ..mpi.launcher import launcher_rank

ENV_CUDA_AWARE = "RINGTUNE_CUDA_AWARE"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

# -- CUDA-aware MPI ----------------------------------------------------------------------


def parse_cuda_aware_env(value: str | None) -> bool | None:
    """The ``RINGTUNE_CUDA_AWARE`` override: ``True``/``False``, or ``None`` when unset or
    empty (detect). Anything else raises ``ValueError`` naming the variable and the fix."""
    if value is None or not value.strip():
        return None
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(
        f"{ENV_CUDA_AWARE}={value!r}: expected 1 (this MPI can move GPU memory) or 0 (it "
        "cannot); unset it to detect with MPIX_Query_cuda_support"
    )


def mpi_library_candidates() -> list[str]:
    """Files that may hold this process's MPI library: the mpi4py extension module (dlsym
    through it also searches the libmpi it links), every loaded ``libmpi*`` (from
    /proc/self/maps), then whatever ``ctypes.util.find_library('mpi')`` names."""
    out: list[str] = []
    mod = sys.modules.get("mpi4py.MPI")
    if mod is not None and getattr(mod, "__file__", None):
        out.append(str(mod.__file__))
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                if os.path.basename(path).startswith("libmpi") and path not in out:
                    out.append(path)
    except OSError:
        pass  # not Linux, or /proc hidden: fall through to find_library
    found = ctypes.util.find_library("mpi")
    if found and found not in out:
        out.append(found)
    return out


def query_cuda_support(paths: list[str] | None = None) -> tuple[bool | None, str]:
    """Call ``MPIX_Query_cuda_support()`` (MPICH ≥ 4, Open MPI ≥ 4) from the first library
    in ``paths`` that exports it. Returns ``(answer, where)``; ``(None, reason)`` when no
    library exports it (then the MPI cannot tell us, and we assume it is not CUDA-aware)."""
    for path in mpi_library_candidates() if paths is None else paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        fn = getattr(lib, "MPIX_Query_cuda_support", None)
        if fn is None:
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return bool(fn()), path
    return None, "no loaded MPI library exports MPIX_Query_cuda_support"


@functools.lru_cache(maxsize=1)
def _detected_cuda_support() -> tuple[bool, str]:
    try:
        from mpi4py import MPI  # noqa: F401 - loads (and initialises) the MPI library
    except ImportError as exc:
        return False, f"mpi4py is not importable ({exc})"
    answer, where = query_cuda_support()
    if answer is None:
        return False, where
    return answer, f"MPIX_Query_cuda_support() = {int(answer)} in {where}"


def cuda_aware_mpi(env: Mapping[str, str] | None = None) -> bool:
    """True when MPI may be handed GPU memory: ``RINGTUNE_CUDA_AWARE`` if set, else what the
    MPI library says through ``MPIX_Query_cuda_support`` (False where it is not exported —
    the MPI wheels from PyPI are not CUDA-aware)."""
    override = parse_cuda_aware_env((os.environ if env is None else env).get(ENV_CUDA_AWARE))
    if override is not None:
        return override
    return _detected_cuda_support()[0]


def cuda_aware_reason(env: Mapping[str, str] | None = None) -> str:
    """One line saying how ``cuda_aware_mpi()`` decided (for logs and error messages)."""
    environ = os.environ if env is None else env
    override = parse_cuda_aware_env(environ.get(ENV_CUDA_AWARE))
    if override is not None:
        return f"{ENV_CUDA_AWARE}={environ.get(ENV_CUDA_AWARE)} (override)"
    return _detected_cuda_support()[1]


# -- rank layout from the launcher ---------------------------------------------------------


def world_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank in MPI_COMM_WORLD, for error messages: from mpi4py when MPI is
    running (no communication), else from the launcher's variables, else 0."""
    if env is None:
        mod = sys.modules.get("mpi4py.MPI")
        if mod is not None:
            try:
                if mod.Is_initialized() and not mod.Is_finalized():
                    return int(mod.COMM_WORLD.Get_rank())
            except Exception:  # noqa: BLE001 - a rank number for a message only
                pass
    return launcher_rank(env)


# -- CuPy, the GPU, NCCL -------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def cupy_status() -> tuple[bool, str]:
    """``(True, "N GPUs")`` when CuPy imports and CUDA sees at least one device, else
    ``(False, reason)``. Imports CuPy: call it only when GPU work is actually asked for."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        return False, (f"CuPy is not importable ({type(exc).__name__}: {exc}); install it "
                       "with `pip install ringtune[cuda]`")
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        return False, f"CUDA sees no GPU ({exc})"
    if count < 1:
        return False, "CUDA sees no GPU (0 devices)"
    return True, f"{count} GPU(s) visible"


def visible_devices_text(env: Mapping[str, str] | None = None) -> str:
    """``CUDA_VISIBLE_DEVICES=…`` as set, or ``unset``, for messages."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    return "CUDA_VISIBLE_DEVICES unset" if value is None else f"CUDA_VISIBLE_DEVICES={value!r}"


def load_nccl() -> tuple[Any, str]:
    """``(cupy.cuda.nccl module, "NCCL x.y.z")`` when NCCL is usable, else ``(None, why)``.

    CuPy imports its NCCL wrapper even when ``libnccl.so.2`` is missing (it sets
    ``available = False`` and warns); that warning is turned into our reason instead."""
    ok, why = cupy_status()
    if not ok:
        return None, why
    return _load_nccl()


@functools.lru_cache(maxsize=1)
def _load_nccl() -> tuple[Any, str]:
    caught: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            from cupy.cuda import nccl
        caught = [str(w.message).strip().splitlines()[0] for w in seen if str(w.message)]
    except Exception as exc:  # noqa: BLE001 - any failure means "no NCCL"
        return None, f"cupy.cuda.nccl cannot be imported ({exc})"
    if not getattr(nccl, "available", False):
        detail = "; ".join(caught) or "libnccl.so.2 not found"
        return None, (f"NCCL is not installed ({detail}): install it with "
                      "`pip install nvidia-nccl-cu12` (part of ringtune[cuda])")
    try:
        v = int(nccl.get_version())
    except Exception as exc:  # noqa: BLE001
        return None, f"NCCL does not load ({exc})"
    if v < 2700:
        return None, f"NCCL {v} has no send/recv (needs ≥ 2.7); upgrade nvidia-nccl-cu12"
    return nccl, f"NCCL {nccl_version_text(v)}"


def nccl_version_text(code: int) -> str:
    """``NCCL_VERSION_CODE`` as ``x.y.z`` (the encoding changed at 2.9: 2708 is 2.7.8,
    21805 is 2.18.5)."""
    if code >= 10000:
        return f"{code // 10000}.{(code // 100) % 100}.{code % 100}"
    return f"{code // 1000}.{(code // 100) % 10}.{code % 100}"


def nccl_status() -> tuple[bool, str]:
    """``(True, "NCCL x.y.z")`` when the ``nccl`` transport can be built here."""
    mod, why = load_nccl()
    return mod is not None, why
