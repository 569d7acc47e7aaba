"""What every GPU transport checks at set-up, and the byte size of a buffer.

Use ``peer_records`` in a GPU transport's constructor: one allgather tells each rank its
peers' transport choice, host name and GPU (two ranks on one GPU; NCCL present or not), and
``check_same_transport`` fails every rank alike when the ranks chose different transports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import require_agreement


def byte_size(arr: Any) -> int:
    """Bytes of a (CuPy or NumPy) array."""
    return int(arr.size) * int(arr.dtype.itemsize)


def peer_records(comm: Any, backend: Any, extra: Any) -> list[Any]:
    """Allgather of (transport-specific payload, host name, GPU key) over ``comm``."""
    from mpi4py import MPI

    binding = getattr(backend, "binding", None)
    key = (binding.pci_bus_id or f"device {binding.device}") if binding is not None else (
        f"device {getattr(backend, 'device', 0)}")
    return comm.allgather((extra, MPI.Get_processor_name(), key))


def check_same_transport(everyone: Sequence[Any]) -> None:
    # Communicator._context checks this generally; a transport built directly (as its
    # tests do) must fail together too, and the gather it needs is already made.
    require_agreement([e[0][0] for e in everyone], "GPU transports",
                      "name the transport explicitly (allreduce(transport=...) or the "
                      "profile's `transport:`) so every rank uses the same one")


def require_gpu_backend(name: str, backend: Any) -> None:
    """``ValueError`` when GPU transport ``name`` is asked to move host buffers."""
    if not getattr(backend, "on_gpu", False):
        raise ValueError(f"transport {name!r} moves GPU buffers; host (NumPy) buffers use "
                         "'mpi'")
