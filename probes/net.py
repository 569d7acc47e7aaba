"""Network ports: Ethernet interfaces from ``/sys/class/net`` and InfiniBand/RoCE ports from
``/sys/class/infiniband``, with speed, state, MTU and PCI locality.

Use ``read_nics(root, pci)``. Virtual interfaces (loopback, bridges, veth, ifb: anything
under ``/sys/devices/virtual``) are skipped: they are not links between hosts. A port that
is both an RDMA port and a netdev (IPoIB ``ib0``, RoCE ``eth2``) is listed once, as the
RDMA port with its ``netdev``. A speed of -1 (a VM's virtio NIC, a link that is down) is
recorded as unknown.
"""

from __future__ import annotations

import re

from .hardware import Nic, PciDevice
from .sysfs import listdir, path, pci_chain, read_int, read_nonneg, read_text, realpath


def parse_rate(text: str | None) -> int | None:
    """``"200 Gb/sec (4X HDR)"`` -> 200000 Mb/s; junk -> ``None``."""
    if not text:
        return None
    m = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/s", text.replace("Gb/sec", "Gb/s"))
    if not m:
        return None
    value = int(float(m.group(1)) * 1000)
    return value or None


def _state(text: str | None) -> str | None:
    """``"4: ACTIVE"`` -> ``"active"``; ``"up"`` stays ``"up"``."""
    if not text:
        return None
    return text.split(":", 1)[-1].strip().lower() or None


def _pci_of(real: str | None) -> str | None:
    if not real:
        return None
    chain, root = pci_chain(real)
    return chain[0] if chain and root else None


def read_nics(root: str = "/", pci: dict[str, PciDevice] | None = None) -> tuple[Nic, ...]:
    """Physical network ports of this host (see the module docstring)."""
    pci = pci or {}
    netdevs: dict[str, tuple[str | None, str]] = {}  # name -> (pci address, sysfs dir)
    net_base = path(root, "/sys/class/net")
    for name in listdir(net_base):
        real = realpath(f"{net_base}/{name}")
        if real is None or "/devices/virtual/" in real.replace("\\", "/"):
            continue
        netdevs[name] = (_pci_of(real), f"{net_base}/{name}")

    nics: list[Nic] = []
    claimed: set[str] = set()
    ib_base = path(root, "/sys/class/infiniband")
    for dev in listdir(ib_base):
        address = _pci_of(realpath(f"{ib_base}/{dev}"))
        numa = pci[address].numa_node if address in pci else \
            read_nonneg(f"{ib_base}/{dev}/device/numa_node")
        # Netdevs on the same PCI function: IPoIB (ib0) or the RoCE Ethernet port.
        same = [n for n, (a, _) in netdevs.items() if address and a == address]
        for port in listdir(f"{ib_base}/{dev}/ports"):
            p = f"{ib_base}/{dev}/ports/{port}"
            layer = read_text(f"{p}/link_layer")
            ndev = read_text(f"{p}/gid_attrs/ndevs/0") or (same[0] if len(same) == 1 else
                                                          None)
            if ndev:
                claimed.add(ndev)
            kind = "roce" if (layer or "").lower() == "ethernet" else "infiniband"
            mtu = read_int(f"{netdevs[ndev][1]}/mtu") if ndev in netdevs else None
            nics.append(Nic(name=f"{dev}:{port}" if port != "1" else dev, kind=kind,
                            speed_mbps=parse_rate(read_text(f"{p}/rate")),
                            state=_state(read_text(f"{p}/state")), mtu=mtu, pci=address,
                            numa_node=numa, netdev=ndev,
                            port=int(port) if port.isdigit() else None, link_layer=layer))

    for name, (address, d) in netdevs.items():
        if name in claimed:
            continue
        ntype = read_int(f"{d}/type")
        if ntype == 772:  # ARPHRD_LOOPBACK
            continue
        kind = "infiniband" if ntype == 32 else "ethernet" if ntype == 1 else "other"
        numa = pci[address].numa_node if address in pci else read_nonneg(
            f"{d}/device/numa_node")
        nics.append(Nic(name=name, kind=kind, speed_mbps=read_nonneg(f"{d}/speed") or None,
                        state=_state(read_text(f"{d}/operstate")), mtu=read_int(f"{d}/mtu"),
                        pci=address, numa_node=numa, netdev=name))
    return tuple(nics)
