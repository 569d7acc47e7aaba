"""One machine's hardware as the topology records it: NUMA nodes, PCI devices, GPUs and how
they are linked, network ports, and the ``Host`` that holds them (frozen dataclasses,
declared for ``safefiles.records``: a topology file's ``hosts[i]`` is a ``Host``).

``probes.topology`` puts hosts together into a world (``Topology``: hosts, rank places,
measured links) and re-exports every name here; the detectors (``probes.gpu``, ``.pci``,
``.net``, ``.host``) build these records. Unknown facts are ``None`` (or empty tuples),
never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from safefiles.records import RecordError, declare, key_path, show

#: PCIe path classes, best first, as ``nvidia-smi topo -m`` labels them.
PCIE_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
#: ``nvmlGpuTopologyLevel_t`` -> label (INTERNAL, a two-GPU board, counts as PIX).
NVML_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: ``nvmlGpuP2PStatus_t`` -> ``nvidia-smi topo -p2p`` labels.
P2P_STATUS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
NIC_KINDS = ("ethernet", "infiniband", "roce", "other")

#: Largest CPU number in a CPU list (Linux's NR_CPUS is at most 8192 today): a range such as
#: ``0-1000000000`` would otherwise expand to a billion numbers.
MAX_CPUS = 1 << 16
#: Size caps of one host's lists (``probes.topology`` has the world's and the file's), each
#: checked before any of its entries is read: at most 64 GPUs (a DGX has 8-16), 64 NUMA
#: nodes, 256 network ports and 4,096 PCI devices. ``ringtune probe`` prints a GPU matrix
#: per host: with the GPU cap its output is linear in the hosts.
MAX_GPUS_PER_HOST = 64
MAX_NUMA_NODES = 64
MAX_NICS = 256
MAX_PCI_DEVICES = 4096
#: Why a list over its cap is refused.
CAP_WHY = "is this the right file?"


def _cpus(default: Any = ()) -> Any:
    """A CPU list: numbers below ``MAX_CPUS``, or their text as sysfs writes it."""
    return declare(default, le=MAX_CPUS - 1, text=lambda text, where: _cpu_list(text, where))


@dataclass(frozen=True)
class NumaNode:
    """A NUMA node: its CPUs and its distances to every node (in ``Host.numa`` order)."""

    id: int
    cpus: tuple[int, ...] = _cpus()
    distances: tuple[int, ...] = ()
    memory_mb: int | None = None


@dataclass(frozen=True)
class PciDevice:
    """A PCI device of interest (GPU, NIC, NVSwitch) or a bridge on the path to one.

    ``parents`` are the PCI addresses from the device's parent up to its root port
    (closest first); ``root`` is the root complex (``"pci0000:3a"``). Link speeds are GT/s
    (``pcie_gen`` maps them to generations).
    """

    address: str
    kind: str = "other"
    class_code: str | None = None
    vendor: str | None = None
    device: str | None = None
    numa_node: int | None = None
    link_speed_gts: float | None = None
    link_width: int | None = None
    max_link_speed_gts: float | None = None
    max_link_width: int | None = None
    parents: tuple[str, ...] = ()
    root: str | None = None


@dataclass(frozen=True)
class NvLink:
    """Active NVLinks of a GPU towards one remote device (``kind`` gpu/switch/cpu/unknown)."""

    remote: str | None
    kind: str = "unknown"
    links: int = 0


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML sees it; ``index`` is the NVML index, ``bus_id`` the sysfs form."""

    index: int
    name: str | None = None
    uuid: str | None = None
    memory_bytes: int | None = None
    bus_id: str | None = None
    numa_node: int | None = None
    cpus: tuple[int, ...] = _cpus()
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    nvlinks: tuple[NvLink, ...] = ()


@dataclass(frozen=True)
class GpuPair:
    """How GPUs ``a`` < ``b`` of one host are connected: PCIe level (PIX … SYS), NVLinks
    between them (direct or through NVSwitches) and NVML's P2P status labels."""

    a: int
    b: int
    level: str | None = declare(None, choices=PCIE_LEVELS)
    nvlinks: int = 0
    p2p_read: str | None = None
    p2p_write: str | None = None
    p2p_nvlink: str | None = None

    @property
    def label(self) -> str:
        """The ``nvidia-smi topo -m`` cell: ``NV#`` when NVLinked, else the PCIe level."""
        return f"NV{self.nvlinks}" if self.nvlinks > 0 else (self.level or "?")


@dataclass(frozen=True)
class Nic:
    """A network port: Ethernet interface, InfiniBand port or RoCE port."""

    name: str
    kind: str = declare("other", choices=NIC_KINDS)
    speed_mbps: int | None = None
    state: str | None = None
    mtu: int | None = None
    pci: str | None = None
    numa_node: int | None = None
    netdev: str | None = None
    port: int | None = None
    link_layer: str | None = None


@dataclass(frozen=True)
class Host:
    """One machine. ``gpu_source`` says where GPU facts came from or why there are none."""

    name: str = ""
    cpu_model: str | None = None
    sockets: int | None = None
    cores: int | None = None
    cpus: int | None = None
    numa: tuple[NumaNode, ...] = declare((), max_items=MAX_NUMA_NODES, why=CAP_WHY)
    gpus: tuple[Gpu, ...] = declare((), max_items=MAX_GPUS_PER_HOST, noun="GPUs", why=CAP_WHY)
    gpu_pairs: tuple[GpuPair, ...] = declare(
        (), max_items=MAX_GPUS_PER_HOST * (MAX_GPUS_PER_HOST - 1) // 2, why=CAP_WHY)
    nics: tuple[Nic, ...] = declare((), max_items=MAX_NICS, why=CAP_WHY)
    pci: tuple[PciDevice, ...] = declare((), max_items=MAX_PCI_DEVICES, why=CAP_WHY)
    gpu_source: str | None = None

    def gpu_pair(self, a: int, b: int) -> GpuPair | None:
        """The pair record of GPUs ``a`` and ``b`` (positions in ``gpus``), either order."""
        lo, hi = min(a, b), max(a, b)
        for p in self.gpu_pairs:
            if p.a == lo and p.b == hi:
                return p
        return None

    def gpu_matrix(self) -> list[list[str]]:
        """The GPU-to-GPU block of ``nvidia-smi topo -m``: ``X`` on the diagonal."""
        n = len(self.gpus)
        out = [["X" if i == j else "?" for j in range(n)] for i in range(n)]
        for p in self.gpu_pairs:
            if 0 <= p.a < n and 0 <= p.b < n:
                out[p.a][p.b] = out[p.b][p.a] = p.label
        return out

    def pci_device(self, address: str | None) -> PciDevice | None:
        for d in self.pci:
            if d.address == address:
                return d
        return None

    def __check__(self, where: str) -> None:
        """One host's facts agree with each other: NUMA ids, distances, GPU indexes and
        pairs, the NUMA nodes devices name (``safefiles.records`` runs it on loading)."""
        ids = [x.id for x in self.numa]
        if len(set(ids)) != len(ids):
            raise RecordError(key_path(where, "numa"), f"node ids {ids} repeat; each node once")
        for ni, node in enumerate(self.numa):
            if node.distances and len(node.distances) != len(self.numa):
                raise RecordError(key_path(where, f"numa[{ni}].distances"),
                                  f"{len(node.distances)} distances, expected one per NUMA "
                                  f"node ({len(self.numa)}) or none")
        seen: set[int] = set()
        for gi, g in enumerate(self.gpus):
            if g.index in seen:
                raise RecordError(key_path(where, f"gpus[{gi}].index"),
                                  f"{g.index} is listed twice; each GPU once, with its own "
                                  "index")
            seen.add(g.index)
            self.check_numa(g.numa_node, key_path(where, f"gpus[{gi}].numa_node"))
        for ni, nic in enumerate(self.nics):
            self.check_numa(nic.numa_node, key_path(where, f"nics[{ni}].numa_node"))
        for pi, dev in enumerate(self.pci):
            self.check_numa(dev.numa_node, key_path(where, f"pci[{pi}].numa_node"))
        n = len(self.gpus)
        for pi, p in enumerate(self.gpu_pairs):
            if not (0 <= p.a < n and 0 <= p.b < n and p.a != p.b):
                raise RecordError(key_path(where, f"gpu_pairs[{pi}]"),
                                  f"GPUs {p.a},{p.b} are not two different GPUs of the {n} "
                                  "listed")

    def check_numa(self, node: int | None, where: str) -> None:
        """``RecordError`` at ``where`` unless ``node`` is one of this host's NUMA nodes
        (or unknown, or the host lists none)."""
        if node is not None and self.numa and node not in {x.id for x in self.numa}:
            raise RecordError(where, f"{node} is not a NUMA node of this host (it lists "
                                     f"{', '.join(str(x.id) for x in self.numa)})")

    def numa_of_cpus(self, cpus: Sequence[int]) -> int | None:
        """The NUMA node holding all of ``cpus``, else ``None`` (unbound or spread)."""
        want = set(cpus)
        if not want:
            return None
        for node in self.numa:
            if want <= set(node.cpus):
                return node.id
        return None


def _cpu_list(text: str, where: str) -> tuple[int, ...]:
    """A CPU list as sysfs writes it (``"0-3,8,10-11"``), strictly: a file is refused for
    a malformed part or a CPU number of ``MAX_CPUS`` or more (``parse_cpulist``, which reads
    what the kernel writes, skips malformed parts)."""
    cpus: set[int] = set()
    body = text.strip()
    if not body:
        return ()
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise RecordError(where, f"{show(text)} has an empty part; write CPUs as 0-3,8 "
                                     "(numbers and ranges, one comma between)")
        lo, sep, hi = part.partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise RecordError(where, f"{show(part)} is not a CPU number or a range such as "
                                     "0-3") from None
        if not 0 <= first <= last < MAX_CPUS:
            raise RecordError(where, f"CPU range {show(part)}: expected 0 ≤ first ≤ last < "
                                     f"{MAX_CPUS}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))
