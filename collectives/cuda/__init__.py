"""GPU support of the runtime: the CuPy backend, the ``staged`` and ``nccl`` transports
(one module each: ``collectives.cuda.staged``, ``collectives.cuda.nccl``), CUDA-aware MPI
detection, and one-rank-per-GPU device binding.

Nothing here imports CuPy until GPU work is asked for: ``CupyBackend`` is loaded on first
access (``collectives.registry`` does that when a GPU buffer arrives or
``get_backend("cupy")`` is called; importing this package registers the backend and the
transports there — each transport module registers itself), and the probes import CuPy,
NCCL or NVML only when called. So
``import collectives`` stays light on machines without a GPU.

Entry points:

- ``CupyBackend`` — array ops and CUDA reduction kernels on a dedicated stream;
- ``make_gpu_transport(name, comm, backend)`` — a transport that moves GPU buffers;
- ``default_gpu_transport()`` — the transport used when none is named;
- ``available_transports(comm=None)`` — GPU transports usable here (the tuner passes its
  communicator so that ``nccl`` is decided from every rank's bound GPU);
- ``cuda_aware_mpi()`` — may MPI be handed GPU memory (``RINGTUNE_CUDA_AWARE`` overrides);
- ``bind_device(device=None)`` — choose this rank's GPU (by local rank by default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..backend import Backend
from ..registry import register_backend
from ..transport import Transport
from . import nccl, staged  # noqa: F401 - each registers its transport when imported
from .availability import (
    available_transports,
    default_gpu_transport,
    gpu_record,
    gpus_shared_here,
    nccl_one_gpu_per_rank,
)
from .binding import DeviceBinding, bind_device, current_binding
from .detect import cuda_aware_mpi, cuda_aware_reason, nccl_status
from .errors import GpuError
from .peers import require_gpu_backend

if TYPE_CHECKING:
    from .backend import CupyBackend

def __getattr__(name: str) -> Any:
    # CupyBackend lives in a module that imports CuPy at its top; load it on first access
    # so that ``from collectives.cuda import CupyBackend`` raises ImportError (which
    # ``collectives.registry.get_backend`` turns into "install ringtune[cuda]") only then.
    if name == "CupyBackend":
        from .backend import CupyBackend

        return CupyBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_gpu_transport(name: str, comm: Any, backend: Any) -> Transport:
    """A transport that moves GPU buffers (``staged``, ``nccl``, CUDA-aware ``mpi``: the
    registry's ``transports_for("cupy")``) over ``comm`` for ``backend``'s buffers.
    Collective over ``comm`` (the set-up agrees on what every rank can do). Raises
    ``GpuError`` naming the rank and the fix when the transport cannot work here."""
    from ..registry import make_transport, transports_for, user_transport_names

    require_gpu_backend(name, backend)
    names = [t for t in transports_for("cupy") if t in user_transport_names()]
    if name not in names:
        raise ValueError(f"unknown GPU transport {name!r}: use one of {', '.join(names)}")
    return make_transport(name, comm, backend)


def _load_cupy_backend() -> Backend:
    try:
        from .backend import CupyBackend
    except ImportError as exc:
        raise ValueError(
            f"backend 'cupy' is not available ({exc}); install it with "
            "`pip install ringtune[cuda]` on a machine with a GPU"
        ) from exc
    return CupyBackend()


# This plug-in's backend (collectives.registry imports the package on demand); the
# transports registered themselves when their modules were imported above.
register_backend("cupy", _load_cupy_backend)


__all__ = [
    "CupyBackend",
    "DeviceBinding",
    "GpuError",
    "available_transports",
    "gpus_shared_here",
    "gpu_record",
    "nccl_one_gpu_per_rank",
    "bind_device",
    "cuda_aware_mpi",
    "cuda_aware_reason",
    "nccl_status",
    "current_binding",
    "default_gpu_transport",
    "make_gpu_transport",
]
