"""What the machine is: hosts, GPUs, PCIe, NVLink, NUMA, NICs, the rank layout, and
(optionally) measured links between ranks.

    import probes
    topo = probes.detect(MPI.COMM_WORLD)          # collective; every rank gets the same
    topo = probes.detect(MPI.COMM_WORLD, measure=True)   # + bandwidth/latency matrix
    topo = probes.load_topology("cluster.yaml")   # a saved or hand-written topology
    topo.summary(), topo.fingerprint(), topo.to_yaml(), topo.ring_order()

``detect`` honours ``$RINGTUNE_TOPOLOGY`` (a topology file used instead of detecting, for
VMs and containers that hide the hardware). Nothing is required to exist: no GPU, no NVML
library, no InfiniBand, ``numa_node = -1`` all give honest unknown/empty fields.

This package imports nothing from ``collectives`` or ``autotune``; NVML and MPI are imported
only when used.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .topology import (
    Gpu,
    GpuPair,
    Host,
    Links,
    Nic,
    NumaNode,
    NvLink,
    PciDevice,
    RankPlace,
    Topology,
    TopologyError,
)

ENV_TOPOLOGY = "RINGTUNE_TOPOLOGY"

__all__ = [
    "detect",
    "load_topology",
    "world_fingerprint",
    "Topology",
    "TopologyError",
    "Host",
    "Gpu",
    "GpuPair",
    "NvLink",
    "Nic",
    "NumaNode",
    "PciDevice",
    "RankPlace",
    "Links",
    "ENV_TOPOLOGY",
]


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read a topology file (YAML, or JSON when it ends in ``.json``). Any problem raises
    ``TopologyError`` naming the file and the key."""
    from safefiles.safeload import InputError, load_file

    from .topology import MAX_FILE_BYTES, MAX_FILE_VALUES

    name = os.fspath(path)
    try:
        data = load_file(name, "topology", max_bytes=MAX_FILE_BYTES, max_nodes=MAX_FILE_VALUES)
    except InputError as exc:
        raise TopologyError(str(exc)) from None
    topo = Topology.from_dict(data, source=name)
    return dataclasses.replace(topo, source=name)


def _agreed_load(path: str, comm: Any) -> Topology:
    """Load on every rank; if any rank fails, every rank raises the same error."""
    result: Topology | TopologyError
    try:
        result = load_topology(path)
    except TopologyError as exc:
        result = exc
    if comm is not None and comm.Get_size() > 1:
        errors = comm.allgather(None if isinstance(result, Topology) else str(result))
        bad = [(r, e) for r, e in enumerate(errors) if e]
        if bad:
            r, e = bad[0]
            raise TopologyError(e if len(bad) == len(errors) else f"rank {r}: {e}")
    if isinstance(result, TopologyError):
        raise result
    return result


def detect(comm: Any = None, measure: bool = False, topology_file: str | None = None,
           **measure_args: Any) -> Topology:
    """The topology of this world (collective when ``comm`` is given; ``None``: this
    process alone, without initialising MPI).

    ``topology_file`` (else ``$RINGTUNE_TOPOLOGY``) replaces detection: a file with a rank
    layout must match the world size; a file with hosts only gets the layout from MPI.
    ``measure=True`` adds the measured link matrix (``probes.links.measure``, which takes
    ``measure_args``).
    """
    from . import layout

    size = 1 if comm is None else comm.Get_size()
    # An empty path is a mistake (an unset shell variable in `--topology "$F"`), never a
    # request to detect: only an absent option and an unset variable mean "detect".
    if topology_file is not None:
        file: str | None = topology_file
        if not file:
            raise TopologyError("--topology: the path is empty; give a topology file, or "
                                "leave the option out to detect this machine")
    else:
        file = os.environ.get(ENV_TOPOLOGY)
        if file is not None and not file:
            raise TopologyError(f"{ENV_TOPOLOGY}: set but empty; give a topology file, or "
                                f"unset {ENV_TOPOLOGY} to detect this machine")
    if file:
        given = _agreed_load(file, comm)
        if given.ranks:
            if len(given.ranks) != size:
                raise TopologyError(f"{file}: ranks: the file describes {len(given.ranks)} "
                                    f"ranks but this world has {size}; remove 'ranks' to "
                                    f"take the layout from MPI, or record it at this size")
            topo = given
        elif comm is None:
            topo = layout.single(given.hosts[0], source=file)
        else:
            topo = layout.gather(comm, hosts_from_file=given.hosts, source=file)
        if given.links is not None and not measure:
            topo = dataclasses.replace(topo, links=given.links)
    elif comm is None:
        topo = layout.single()
    else:
        topo = layout.gather(comm)
    if measure and comm is not None:
        from .links import measure as measure_links

        topo = dataclasses.replace(topo, links=measure_links(comm, **measure_args))
    return topo


def world_fingerprint(comm: Any, topology: Topology | None = None) -> str:
    """The structural fingerprint of this world (``"sha256:…"``), equal on every rank.
    Collective when ``topology`` is not given (no link measurement: cheap)."""
    topo = topology if topology is not None else detect(comm)
    return topo.fingerprint()
