"""PCIe devices from ``/sys/bus/pci/devices``: class, NUMA node, link speed/width and the
parent chain up to the root port, plus the ``nvidia-smi topo -m`` level between two devices.

Use ``read_pci(root)`` for every device (cheap: a handful of small files each), then
``interesting(devices)`` to keep GPUs, NICs, NVSwitches and the bridges above them, and
``pcie_level(a, b)`` to classify the path between two devices (PIX/PXB/PHB/NODE/SYS).
"""

from __future__ import annotations

import re

from .hardware import PciDevice
from .sysfs import listdir, path, pci_chain, read_nonneg, read_text, realpath

#: Class code prefixes (``0xCCSS``): what a device is.
_KINDS = (("0x0302", "gpu"), ("0x0300", "gpu"), ("0x0207", "nic"), ("0x0200", "nic"),
          ("0x0680", "switch"), ("0x0604", "bridge"), ("0x0108", "nvme"))
_NVIDIA = "0x10de"


def parse_speed(text: str | None) -> float | None:
    """``"16.0 GT/s PCIe"``, ``"8 GT/s"`` -> GT/s; ``"Unknown"``/junk -> ``None``."""
    if not text:
        return None
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*GT/s", text)
    if not m:
        return None
    value = float(m.group(1))
    return value if value > 0 else None


def gen_of(speed_gts: float | None) -> int | None:
    """GT/s -> PCIe generation (2.5 -> 1, 5 -> 2, 8 -> 3, 16 -> 4, 32 -> 5, 64 -> 6)."""
    if speed_gts is None:
        return None
    for gen, gts in ((1, 2.5), (2, 5.0), (3, 8.0), (4, 16.0), (5, 32.0), (6, 64.0)):
        if abs(speed_gts - gts) < 0.6:
            return gen
    return None


def _kind(class_code: str | None, vendor: str | None) -> str:
    if not class_code:
        return "other"
    for prefix, kind in _KINDS:
        if class_code.startswith(prefix):
            if kind == "switch" and vendor != _NVIDIA:
                return "other"  # 0x0680 is "other bridge"; NVSwitch is NVIDIA's
            return kind
    return "other"


def read_device(root: str, address: str) -> PciDevice:
    """One PCI device by its sysfs address (``"0000:3b:00.0"``)."""
    d = path(root, f"/sys/bus/pci/devices/{address}")
    real = realpath(d) or d
    chain, rc = pci_chain(real)
    class_code = read_text(f"{d}/class")
    vendor = read_text(f"{d}/vendor")
    width = read_nonneg(f"{d}/current_link_width")
    max_width = read_nonneg(f"{d}/max_link_width")
    return PciDevice(
        address=address,
        kind=_kind(class_code, vendor),
        class_code=class_code,
        vendor=vendor,
        device=read_text(f"{d}/device"),
        numa_node=read_nonneg(f"{d}/numa_node"),
        link_speed_gts=parse_speed(read_text(f"{d}/current_link_speed")),
        link_width=width or None,
        max_link_speed_gts=parse_speed(read_text(f"{d}/max_link_speed")),
        max_link_width=max_width or None,
        parents=chain[1:] if chain and chain[0] == address else chain,
        root=rc,
    )


def read_pci(root: str = "/") -> dict[str, PciDevice]:
    """Every PCI device, by address."""
    base = path(root, "/sys/bus/pci/devices")
    return {a: read_device(root, a) for a in listdir(base)}


def interesting(devices: dict[str, PciDevice]) -> tuple[PciDevice, ...]:
    """GPUs, NICs and NVSwitches, and the bridges on their paths to the root (so the
    switch tree can be shown and levels computed from a saved topology)."""
    keep: set[str] = set()
    for d in devices.values():
        if d.kind in ("gpu", "nic", "switch"):
            keep.add(d.address)
            keep.update(p for p in d.parents if p in devices)
    return tuple(devices[a] for a in sorted(keep))


def pcie_level(a: PciDevice | None, b: PciDevice | None) -> str | None:
    """The ``nvidia-smi topo -m`` class of the PCIe path between two devices:
    PIX (at most one switch between them), PXB (several switches, below one host bridge),
    PHB (through the host bridge), NODE (different host bridges, one NUMA node), SYS
    (across NUMA nodes); ``None`` when the path is not known."""
    if a is None or b is None or a.root is None or b.root is None:
        return None
    if a.address == b.address:
        return "PIX"
    up_a = (a.address, *a.parents)
    up_b = (b.address, *b.parents)
    common = next((x for x in up_a if x in up_b), None)
    if a.root == b.root:
        if common is None or common == up_a[-1] or common == up_b[-1]:
            # The paths meet only at (or in) the root port / host bridge.
            return "PHB"
        # Bridges from each device up to and including the common one: a PCIe switch is an
        # upstream port plus a downstream port, so <= 2 on each side is a single switch.
        depth = max(up_a.index(common), up_b.index(common))
        return "PIX" if depth <= 2 else "PXB"
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return "NODE"
    return "SYS"
