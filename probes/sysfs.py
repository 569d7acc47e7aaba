"""Tolerant readers of sysfs/procfs files under a root path.

Every probe reads through these helpers so that (a) a recorded tree under a test folder is
read exactly like the live ``/`` and (b) a missing, unreadable or odd file gives ``None``
instead of an exception: a VM that hides a file, a NIC whose ``speed`` read fails with
EINVAL, a ``numa_node`` of -1 are facts to record as unknown, not reasons to crash.
"""

from __future__ import annotations

import os
import re

#: A PCI address as sysfs writes it: domain:bus:device.function, lower-case hex.
PCI_ADDR_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def path(root: str, rel: str) -> str:
    """``rel`` (an absolute-looking path such as ``/sys/class/net``) under ``root``."""
    return os.path.join(root, rel.lstrip("/"))


def read_text(file: str) -> str | None:
    """The stripped content of ``file``; ``None`` when missing, unreadable or not text."""
    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except (OSError, ValueError):
        return None


def read_int(file: str, base: int = 10) -> int | None:
    """An integer file; ``None`` when missing, unreadable or malformed."""
    text = read_text(file)
    if text is None:
        return None
    try:
        return int(text.split()[0], base) if text else None
    except (ValueError, IndexError):
        return None


def read_nonneg(file: str) -> int | None:
    """An integer file where a negative value means unknown (``numa_node``, ``speed``)."""
    value = read_int(file)
    return value if value is not None and value >= 0 else None


def listdir(folder: str) -> list[str]:
    """Sorted entries of ``folder``; empty when missing or unreadable."""
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def realpath(file: str) -> str | None:
    """The resolved path of a sysfs link (class entries link into ``/sys/devices``)."""
    try:
        return os.path.realpath(file)
    except (OSError, ValueError):
        return None


def parse_cpulist(text: str | None) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; malformed parts are skipped."""
    if not text:
        return ()
    cpus: set[int] = set()
    for part in text.replace("\n", ",").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus.update(range(int(lo), int(hi) + 1))
            else:
                cpus.add(int(part))
        except ValueError:
            continue
    return tuple(sorted(cpus))


def format_cpulist(cpus: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"`` (the form sysfs and ``nvidia-smi`` print)."""
    out: list[str] = []
    items = sorted(set(cpus))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(out)


def pci_chain(device_path: str) -> tuple[tuple[str, ...], str | None]:
    """From a resolved ``/sys/devices/pci0000:3a/0000:3a:00.0/.../0000:3b:00.0[/…]`` path:
    the PCI addresses from the device up to its root port (device first), and the root
    complex (``"pci0000:3a"``) or ``None`` when the path is not under a PCI root."""
    parts = device_path.split(os.sep)
    root = None
    chain: list[str] = []
    for part in parts:
        if part.startswith("pci") and ":" in part and root is None:
            root = part
            chain = []
        elif root is not None and PCI_ADDR_RE.match(part):
            chain.append(part)
    return tuple(reversed(chain)), root


def normalize_bus_id(bus_id: object) -> str | None:
    """NVML's ``b"00000000:3B:00.0"`` (bytes, 8-digit domain, upper case) or any spelling
    -> the sysfs form ``"0000:3b:00.0"``; ``None`` when it is not a PCI address."""
    if bus_id is None:
        return None
    if isinstance(bus_id, (bytes, bytearray)):
        bus_id = bytes(bus_id).split(b"\0", 1)[0].decode("ascii", "replace")
    text = str(bus_id).strip().lower()
    m = re.match(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", text)
    if not m:
        return None
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"
