"""Which GPU this rank uses: one rank per GPU, by local rank, matched to NVML by PCI bus id.

Call ``bind_device()`` (or let the CuPy backend call it on first use) before allocating GPU
buffers: it makes device ``local_rank % visible_devices`` current, where the visible devices
are those ``CUDA_VISIBLE_DEVICES`` leaves (so a launcher that gives each rank its own
``CUDA_VISIBLE_DEVICES`` gets device 0 everywhere, as intended). ``bind_device(k)`` chooses
device ``k`` explicitly instead. The binding records the device's PCI bus id and the index
of the matching NVML device — CUDA numbers devices fastest-first and after
``CUDA_VISIBLE_DEVICES``, NVML numbers them all by bus, so only the bus id links the two.

The pure helpers (``choose_device``, ``normalize_bus_id``, ``nvml_index_for``,
``shared_gpus``) need no GPU and are what the unit tests exercise.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probes.sysfs import normalize_bus_id as parse_bus_id

from ..mpi.launcher import local_rank, local_size
from .detect import visible_devices_text, world_rank
from .errors import GpuError


@dataclass(frozen=True)
class DeviceBinding:
    """The GPU of this rank and how it was chosen."""

    #: CUDA device ordinal (among the visible devices).
    device: int
    #: Rank among the ranks of this host, and where that number came from (an environment
    #: variable name, ``explicit`` for ``bind_device(k)``, or ``default``).
    local_rank: int
    source: str
    #: Ranks on this host when the launcher says, else ``None``.
    local_size: int | None
    #: Devices CUDA sees in this process.
    visible: int
    #: PCI bus id, normalised (``0000:3b:00.0``); empty when CUDA does not say.
    pci_bus_id: str = ""
    #: Index of the same GPU in NVML (``nvidia-ml-py``), when NVML is available.
    nvml_index: int | None = None

    def describe(self) -> str:
        """One line for logs and errors."""
        nvml = "" if self.nvml_index is None else f", NVML {self.nvml_index}"
        bus = f" ({self.pci_bus_id}{nvml})" if self.pci_bus_id else ""
        return (f"GPU {self.device}{bus} of {self.visible} visible, local rank "
                f"{self.local_rank} [{self.source}]")


def choose_device(local_rank: int, visible: int) -> int:
    """One rank per GPU: ``local_rank % visible``. More local ranks than GPUs share them
    round-robin (fine for ``staged``/``mpi``; ``nccl`` refuses it at set-up)."""
    if visible < 1:
        raise GpuError(f"rank {world_rank()}: no GPU is visible "
                       f"({visible_devices_text()}): GPU buffers need a GPU on every rank")
    if local_rank < 0:
        raise ValueError(f"local rank must be ≥ 0, got {local_rank}")
    return local_rank % visible


def normalize_bus_id(bus_id: str | bytes) -> str:
    """A PCI bus id as ``dddd:bb:dd.f`` in lower case (NVML's 8-digit domain, CUDA's and
    sysfs's 4 digits, or none). The reading is the probes' own, so a GPU bound here and the
    same GPU found by ``probes`` compare equal; unlike it, an unreadable id raises."""
    norm = parse_bus_id(bus_id)
    if norm is None:
        text = bus_id.decode("ascii", "replace") if isinstance(bus_id, bytes) else str(bus_id)
        raise ValueError(f"not a PCI bus id: {text.strip()!r} (expected "
                         "domain:bus:device.function)")
    return norm


def nvml_index_for(bus_id: str, nvml_bus_ids: Sequence[str | bytes]) -> int | None:
    """The NVML index whose bus id equals ``bus_id`` (both normalised), else ``None``."""
    want = normalize_bus_id(bus_id)
    for i, other in enumerate(nvml_bus_ids):
        try:
            if normalize_bus_id(other) == want:
                return i
        except ValueError:
            continue
    return None


@functools.lru_cache(maxsize=1)
def nvml_bus_ids() -> tuple[str, ...] | None:
    """Bus ids of every NVML device in NVML order (all GPUs of the host, whatever
    ``CUDA_VISIBLE_DEVICES`` says), or ``None`` without NVML. Imported lazily: NVML is
    optional and ``import collectives`` must not load it."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver / no NVML library
        return None
    try:
        out = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            info = pynvml.nvmlDeviceGetPciInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(normalize_bus_id(info.busId))
        return tuple(out)
    except Exception:  # noqa: BLE001 - a partial NVML is as good as none here
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def shared_gpus(records: Sequence[tuple[str, str]]) -> list[list[int]]:
    """Groups (≥ 2 ranks) that use the same GPU. ``records[r]`` is rank r's (host name, GPU
    key), the key being the PCI bus id (or the device number when CUDA gives none)."""
    by_gpu: dict[tuple[str, str], list[int]] = {}
    for rank, rec in enumerate(records):
        by_gpu.setdefault((rec[0], rec[1]), []).append(rank)
    return [ranks for ranks in by_gpu.values() if len(ranks) > 1]


def shared_gpu_message(groups: Sequence[Sequence[int]], records: Sequence[tuple[str, str]],
                       what: str = "transport 'nccl'") -> str:
    """The error for ranks sharing a GPU where one GPU per rank is required."""
    first = groups[0]
    host, gpu = records[first[0]]
    ranks = ", ".join(str(r) for r in first)
    more = f" (and {len(groups) - 1} more group(s))" if len(groups) > 1 else ""
    return (f"{what} needs one GPU per rank, but ranks {ranks} on host {host} all use GPU "
            f"{gpu}{more}: start at most one rank per GPU on each host (or give each rank "
            "its own CUDA_VISIBLE_DEVICES), or use transport 'staged' (or 'mpi' when MPI is "
            "CUDA-aware), which work with ranks sharing a GPU")


_binding: DeviceBinding | None = None


def current_binding() -> DeviceBinding | None:
    """The binding made by ``bind_device`` in this process, if any."""
    return _binding


def bind_device(device: int | None = None) -> DeviceBinding:
    """Choose this rank's GPU and make it current (CuPy's current device, which is the
    CUDA runtime's). ``device=None``: by local rank; an int: that device. Call it before
    allocating GPU buffers; calling it again with another device after the CuPy backend is
    in use raises (its stream and scratch buffers live on the first device)."""
    global _binding
    import cupy

    try:
        visible = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver or no device
        raise GpuError(f"rank {world_rank()}: got GPU work but CUDA sees no GPU ({exc}; "
                       f"{visible_devices_text()}): run GPU buffers only on ranks with a "
                       "GPU, or pass NumPy arrays") from None
    lr, source = local_rank()
    if device is None:
        dev = choose_device(lr, visible)
    else:
        if not isinstance(device, int) or isinstance(device, bool) or not (
                0 <= device < visible):
            raise ValueError(f"bind_device: device must be an integer 0..{visible - 1} "
                             f"({visible} visible; {visible_devices_text()}), got {device!r}")
        dev, source = device, "explicit"
    if _binding is not None and _binding.device != dev and _backend_in_use():
        raise GpuError(
            f"rank {world_rank()}: already bound to GPU {_binding.device} and the CuPy "
            f"backend is in use there; call bind_device({dev}) before the first GPU allreduce"
        )
    cupy.cuda.Device(dev).use()
    try:
        bus = normalize_bus_id(cupy.cuda.runtime.deviceGetPCIBusId(dev))
    except Exception:  # noqa: BLE001 - bus id is informative; binding works without it
        bus = ""
    ids = nvml_bus_ids() if bus else None
    _binding = DeviceBinding(device=dev, local_rank=lr, source=source,
                             local_size=local_size(), visible=visible, pci_bus_id=bus,
                             nvml_index=nvml_index_for(bus, ids) if ids else None)
    return _binding


def _backend_in_use() -> bool:
    import sys

    mod: Any = sys.modules.get("collectives.cuda.backend")
    return bool(mod is not None and getattr(mod, "_INSTANCES", 0))
