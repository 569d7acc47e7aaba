"""This host's facts and the MPI rank layout: rank -> host, local rank, GPU, NUMA node.

Use ``read_host(root)`` for one machine (CPU, NUMA, PCI, NICs, GPUs; cached per root in
this process) and ``gather(comm)`` for a world: ranks that share memory are found with
``Split_type(COMM_TYPE_SHARED)``; only local rank 0 of each host reads the host's facts,
and one ``allgather`` gives every rank the same ``Topology``.

A rank's GPU is the NVML position of the device it will use: with ``CUDA_VISIBLE_DEVICES``
the entry at ``local_rank % len(visible)`` (a UUID, or an index in PCI bus order), else
``local_rank % gpus``; when CuPy is already imported, the current CUDA device's PCI bus id
decides (CUDA orders devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from .topology import Host, RankPlace, Topology

_HOSTS: dict[str, Host] = {}


def read_host(root: str = "/", responder: Any = None, name: str | None = None) -> Host:
    """All facts of one host read under ``root`` (``responder``: recorded NVML answers)."""
    key = os.path.abspath(root)
    if responder is None and name is None and key in _HOSTS:
        return _HOSTS[key]
    from .gpu import read_gpus
    from .host import hostname, read_cpu, read_numa
    from .net import read_nics
    from .pci import interesting, read_pci

    devices = read_pci(root)
    model, sockets, cores, ncpus = read_cpu(root)
    gpus, pairs, source = read_gpus(root, devices, responder)
    h = Host(
        name=name if name is not None else (hostname() if key == "/" else
                                            os.path.basename(key)),
        cpu_model=model, sockets=sockets, cores=cores, cpus=ncpus,
        numa=read_numa(root), gpus=gpus, gpu_pairs=pairs,
        nics=read_nics(root, devices), pci=interesting(devices), gpu_source=source,
    )
    if responder is None and name is None:
        _HOSTS[key] = h
    return h


def _affinity() -> tuple[int, ...]:
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return ()


def _cuda_bus_id() -> str | None:
    """The current CUDA device's PCI bus id, only if CuPy is already in use (importing it
    here would cost seconds and a CUDA context)."""
    cupy = sys.modules.get("cupy")
    if cupy is None:
        return None
    try:
        rt = cupy.cuda.runtime
        return str(rt.deviceGetPCIBusId(rt.getDevice()))
    except Exception:  # noqa: BLE001 - no device, no driver: unknown
        return None


def rank_info(local_rank: int) -> dict[str, Any]:
    """What a rank knows about itself (sent to everyone in one allgather)."""
    return {"local_rank": local_rank, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "order": os.environ.get("CUDA_DEVICE_ORDER"), "cuda_bus": _cuda_bus_id(),
            "cpus": _affinity()}


def bind_gpu(host: Host, info: dict[str, Any]) -> int | None:
    """The position in ``host.gpus`` of the GPU this rank uses, or ``None``."""
    from .sysfs import normalize_bus_id

    gpus = host.gpus
    if not gpus:
        return None
    bus = normalize_bus_id(info.get("cuda_bus"))
    if bus:
        for i, g in enumerate(gpus):
            if g.bus_id == bus:
                return i
    visible = info.get("visible")
    local = int(info.get("local_rank") or 0)
    if visible is None:
        return local % len(gpus)
    entries = [v.strip() for v in str(visible).split(",") if v.strip()]
    if not entries or entries[0] in ("-1", "none", "NoDevFiles"):
        return None
    entry = entries[local % len(entries)]
    if entry.isdigit():
        # NVML numbers GPUs in PCI bus order; CUDA does too with CUDA_DEVICE_ORDER=PCI_BUS_ID
        # and for GPUs of one model (the usual case), which is what we assume here.
        idx = int(entry)
        return idx if idx < len(gpus) else None
    for i, g in enumerate(gpus):
        if g.uuid and (g.uuid == entry or g.uuid.startswith(entry)):
            return i
    return None  # MIG instance or unknown spelling: honest unknown


def place(rank: int, host_index: int, host: Host, info: dict[str, Any]) -> RankPlace:
    gpu = bind_gpu(host, info)
    numa = host.gpus[gpu].numa_node if gpu is not None else None
    if numa is None:
        numa = host.numa_of_cpus(info.get("cpus") or ())
    return RankPlace(rank=rank, host=host_index, local_rank=int(info.get("local_rank") or 0),
                     gpu=gpu, numa_node=numa)


def single(host: Host | None = None, source: str = "detected") -> Topology:
    """The topology of a process that is not part of an MPI world (one rank)."""
    h = host or read_host()
    return Topology(hosts=(h,), ranks=(place(0, 0, h, rank_info(0)),), source=source)


def gather(comm: Any, hosts_from_file: Sequence[Host] | None = None,
           source: str = "detected") -> Topology:
    """Collective over ``comm``: every rank returns the same ``Topology``.

    ``hosts_from_file``: host facts loaded from a topology file instead of read here (one
    entry for all hosts, or one per host in host order).
    """
    rank = comm.Get_rank()
    if hasattr(comm, "Split_type"):
        from mpi4py import MPI

        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        try:
            local_rank = local.Get_rank()
            leader = local.bcast(rank, root=0)
        finally:
            local.Free()
    else:
        # A communicator without MPI's shared-memory split (a torch.distributed group,
        # collectives.engines.torch): ranks with the same host name share a host, the
        # lowest-ranked leads it (what Split_type + bcast give under MPI).
        names = comm.allgather(socket.gethostname())
        same = [r for r, n in enumerate(names) if n == names[rank]]
        local_rank, leader = same.index(rank), same[0]
    facts: Host | Exception | None = None
    if local_rank == 0 and hosts_from_file is None:
        try:
            facts = read_host()
        except Exception as exc:  # noqa: BLE001 - reported on every rank below
            facts = RuntimeError(f"rank {rank}: reading host facts failed: "
                                 f"{type(exc).__name__}: {exc}")
    everyone = comm.allgather((leader, rank_info(local_rank), facts))
    errors = [f for _, _, f in everyone if isinstance(f, Exception)]
    if errors:
        raise errors[0]
    leaders = sorted({ld for ld, _, _ in everyone})
    index = {ld: i for i, ld in enumerate(leaders)}
    if hosts_from_file is not None:
        given = list(hosts_from_file)
        if len(given) == 1:
            hosts = [given[0]] * len(leaders)
        elif len(given) == len(leaders):
            hosts = given
        else:
            from .topology import TopologyError

            raise TopologyError(f"{source}: hosts: the file lists {len(given)} hosts but this "
                                f"world runs on {len(leaders)}; list one host (used for "
                                f"all) or one per host")
    else:
        hosts = [everyone[ld][2] for ld in leaders]  # type: ignore[misc]
    places = tuple(place(r, index[ld], hosts[index[ld]], info)
                   for r, (ld, info, _) in enumerate(everyone))
    return Topology(hosts=tuple(hosts), ranks=places, source=source)
