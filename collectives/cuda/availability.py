"""Which transports can move GPU buffers here, and the one used when none is named.

Use ``available_transports(comm)`` (collective) when every rank must agree, as the tuner
does; ``default_gpu_transport()`` is this rank's choice for an unnamed transport.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..mpi.launcher import local_size
from .binding import bind_device, current_binding, shared_gpus
from .detect import cuda_aware_mpi, cupy_status, nccl_status


def gpus_shared_here() -> bool:
    """Local heuristic: True when the launcher puts more ranks on this host than CUDA shows
    GPUs (then ranks share GPUs and ``nccl`` cannot be used). False when either number is
    unknown. It is wrong where the launcher gives each rank its own ``CUDA_VISIBLE_DEVICES``
    (Slurm, one GPU per task: every rank sees one GPU); ``available_transports(comm)``
    decides from the ranks' actual devices instead."""
    ranks = local_size()
    if ranks is None:
        return False
    ok, _ = cupy_status()
    if not ok:
        return False
    import cupy

    return ranks > int(cupy.cuda.runtime.getDeviceCount())


def gpu_record() -> tuple[str, str] | None:
    """This rank's (host name, GPU key) for the one-GPU-per-rank decision: the key is the
    bound device's PCI bus id (``device N`` when CUDA gives none). Binds the device by local
    rank when nothing is bound yet (what the CuPy backend would do on first use). ``None``
    without CuPy or a usable GPU."""
    ok, _ = cupy_status()
    if not ok:
        return None
    from mpi4py import MPI

    try:
        binding = current_binding() or bind_device()
    except Exception:  # noqa: BLE001 - no usable GPU on this rank: it cannot take part
        return None
    return (MPI.Get_processor_name(), binding.pci_bus_id or f"device {binding.device}")


def nccl_one_gpu_per_rank(records: Sequence[tuple[str, str] | None]) -> bool:
    """The collective ``nccl`` decision from every rank's ``gpu_record()``: every rank has
    a GPU and no two ranks of one host use the same one (``records[r]`` is rank r's)."""
    if any(rec is None for rec in records):
        return False
    return not shared_gpus([rec for rec in records if rec is not None])


def available_transports(comm: Any = None) -> list[str]:
    """The transports that can move GPU buffers here, best first: ``nccl`` (NCCL installed
    and one GPU per rank), ``mpi`` (MPI is CUDA-aware), ``staged`` (always, given a GPU).
    Empty without CuPy or a GPU.

    With ``comm`` (an mpi4py communicator; collective: call it on every rank of ``comm``)
    "one GPU per rank" is decided from every rank's (host name, bound device PCI bus id),
    which also holds where each rank has its own ``CUDA_VISIBLE_DEVICES``; without one, from
    the local heuristic ``gpus_shared_here()``. The other entries stay per-rank facts: a
    caller that needs one list for all ranks intersects the gathered lists (the tuner
    does)."""
    ok, _ = cupy_status()
    if comm is not None:
        # Every rank takes part in the gather, with or without a GPU, so none is left
        # waiting in it.
        records = comm.allgather(gpu_record() if ok else None)
    if not ok:
        return []
    from ..registry import gpu_transport_names, transport_class

    # Each transport says whether it can move GPU buffers here (``usable_on_gpu``), in
    # the order of their ``gpu_preference``.
    here = GpuFacts(records if comm is not None else None)
    return [name for name in gpu_transport_names()
            if (cls := transport_class(name)) is not None and cls.usable_on_gpu(here)]


class GpuFacts:
    """What this machine offers GPU transports, as ``Transport.usable_on_gpu`` asks it;
    each fact is read when asked. ``records``: every rank's ``gpu_record()`` where the
    caller gathered them (``None``: this rank's view)."""

    def __init__(self, records: Sequence[tuple[str, str] | None] | None) -> None:
        self.records = records

    def nccl(self) -> bool:
        """NCCL loads here."""
        return bool(nccl_status()[0])

    def one_gpu_per_rank(self) -> bool:
        """No two ranks share a GPU: from every rank's record where gathered, else from
        the local heuristic (``gpus_shared_here``)."""
        if self.records is not None:
            return nccl_one_gpu_per_rank(self.records)
        return not gpus_shared_here()

    def cuda_aware_mpi(self) -> bool:
        """MPI may be handed GPU memory."""
        return bool(cuda_aware_mpi())


def default_gpu_transport() -> str:
    """The transport for GPU buffers when neither the call nor the profile names one: the
    first of ``available_transports()``, or the fallback (``fallback_gpu_transport``,
    whose errors then explain what is missing)."""
    from ..registry import fallback_gpu_transport

    found = available_transports()
    return found[0] if found else fallback_gpu_transport()
