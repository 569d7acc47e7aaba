"""GPU support of the runtime: the CuPy backend, the ``staged`` and ``nccl`` transports,
CUDA-aware MPI detection, and one-rank-per-GPU device binding.

Nothing here imports CuPy until GPU work is asked for: ``CupyBackend`` is loaded on first
access (``collectives.backend`` does that when a GPU buffer arrives or ``get_backend("cupy")``
is called), and the probes import CuPy, NCCL or NVML only when called. So
``import collectives`` stays light on machines without a GPU.

Entry points:

- ``CupyBackend`` — array ops and CUDA reduction kernels on a dedicated stream;
- ``make_gpu_transport(name, comm, backend)`` — ``staged`` or ``nccl``;
- ``default_gpu_transport()`` — the transport used when none is named;
- ``available_transports()`` — GPU transports usable here (for the tuner's search space);
- ``cuda_aware_mpi()`` — may MPI be handed GPU memory (``RINGTUNE_CUDA_AWARE`` overrides);
- ``bind_device(device=None)`` — choose this rank's GPU (by local rank by default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .binding import DeviceBinding, bind_device, current_binding
from .detect import cuda_aware_mpi, cuda_aware_reason, cupy_status, local_size, nccl_status
from .errors import GpuError

if TYPE_CHECKING:
    from .backend import CupyBackend

#: GPU transport names, in order of preference when several are available.
GPU_TRANSPORTS: tuple[str, ...] = ("nccl", "mpi", "staged")


def __getattr__(name: str) -> Any:
    # CupyBackend lives in a module that imports CuPy at its top; load it on first access
    # so that ``from collectives.cuda import CupyBackend`` raises ImportError (which
    # ``collectives.backend.get_backend`` turns into "install ringtune[cuda]") only then.
    if name == "CupyBackend":
        from .backend import CupyBackend

        return CupyBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gpus_shared_here() -> bool:
    """True when the launcher puts more ranks on this host than CUDA shows GPUs (then ranks
    share GPUs and ``nccl`` cannot be used). False when either number is unknown."""
    ranks = local_size()
    if ranks is None:
        return False
    ok, _ = cupy_status()
    if not ok:
        return False
    import cupy

    return ranks > int(cupy.cuda.runtime.getDeviceCount())


def available_transports() -> list[str]:
    """The transports that can move GPU buffers here, best first: ``nccl`` (NCCL installed
    and one GPU per rank), ``mpi`` (MPI is CUDA-aware), ``staged`` (always, given a GPU).
    Empty without CuPy or a GPU. Per-rank facts: the tuner should decide on rank 0 and
    broadcast."""
    ok, _ = cupy_status()
    if not ok:
        return []
    out = []
    if nccl_status()[0] and not gpus_shared_here():
        out.append("nccl")
    if cuda_aware_mpi():
        out.append("mpi")
    out.append("staged")
    return out


def default_gpu_transport() -> str:
    """The transport for GPU buffers when neither the call nor the profile names one: the
    first of ``available_transports()``, or ``staged`` (whose errors then explain what is
    missing)."""
    found = available_transports()
    return found[0] if found else "staged"


def make_gpu_transport(name: str, comm: Any, backend: Any) -> Any:
    """A GPU transport (``staged`` or ``nccl``) over ``comm`` for ``backend``'s buffers.
    Collective over ``comm`` (the set-up agrees on what every rank can do). Raises
    ``GpuError`` naming the rank and the fix when the transport cannot work here."""
    if not getattr(backend, "on_gpu", False):
        raise ValueError(f"transport {name!r} moves GPU buffers; host (NumPy) buffers use "
                         "'mpi'")
    from .transports import NcclTransport, StagedTransport

    if name == "staged":
        return StagedTransport(comm, backend)
    if name == "nccl":
        return NcclTransport(comm, backend)
    raise ValueError(f"unknown GPU transport {name!r}: use one of {', '.join(GPU_TRANSPORTS)}")


__all__ = [
    "CupyBackend",
    "DeviceBinding",
    "GpuError",
    "GPU_TRANSPORTS",
    "available_transports",
    "bind_device",
    "cuda_aware_mpi",
    "cuda_aware_reason",
    "current_binding",
    "default_gpu_transport",
    "make_gpu_transport",
]
