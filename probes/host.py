"""CPU and NUMA facts of this host from ``/proc/cpuinfo`` and ``/sys/devices/system``.

Use ``read_cpu(root)`` and ``read_numa(root)``; ``root`` is ``"/"`` for the live machine or
a folder holding a recorded tree (tests). Missing files give ``None``/empty results.
"""

from __future__ import annotations

import re

from .hardware import NumaNode
from .sysfs import listdir, parse_cpulist, path, read_int, read_text


def read_cpu(root: str = "/") -> tuple[str | None, int | None, int | None, int | None]:
    """(CPU model, sockets, physical cores, online logical CPUs).

    ``/proc/cpuinfo`` gives all four on x86 (``physical id``/``core id`` per processor);
    elsewhere (ARM lacks them) the per-CPU ``topology`` folders in sysfs are read."""
    model = None
    procs: list[dict[str, str]] = []
    for block in (read_text(path(root, "/proc/cpuinfo")) or "").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip().lower(), value.strip())
        if "processor" in fields:
            procs.append(fields)
        if model is None:
            # x86 says "model name"; POWER "cpu"; some ARM kernels only "Hardware".
            for key in ("model name", "cpu", "hardware"):
                if fields.get(key):
                    model = " ".join(fields[key].split())
                    break
    cpu_dir = path(root, "/sys/devices/system/cpu")
    online = parse_cpulist(read_text(f"{cpu_dir}/online"))
    if not online:
        online = tuple(sorted(int(p["processor"]) for p in procs
                              if p["processor"].isdigit()))
    packages: set[int] = set()
    cores: set[tuple[int, int]] = set()
    if procs and all("physical id" in p and "core id" in p for p in procs):
        for p in procs:
            try:
                pkg, core = int(p["physical id"]), int(p["core id"])
            except ValueError:
                continue
            packages.add(pkg)
            cores.add((pkg, core))
    else:
        for cpu in online:
            topo = f"{cpu_dir}/cpu{cpu}/topology"
            package = read_int(f"{topo}/physical_package_id")
            core_id = read_int(f"{topo}/core_id")
            if package is not None and package >= 0:
                packages.add(package)
                if core_id is not None:
                    cores.add((package, core_id))
    return (model, len(packages) or None, len(cores) or None, len(online) or None)


def read_numa(root: str = "/") -> tuple[NumaNode, ...]:
    """NUMA nodes with their CPU lists, distances and memory; empty when the kernel shows
    none (then the NUMA shape is unknown)."""
    base = path(root, "/sys/devices/system/node")
    ids = sorted(int(m.group(1)) for e in listdir(base) if (m := re.fullmatch(r"node(\d+)", e)))
    nodes = []
    for i in ids:
        d = f"{base}/node{i}"
        dist_text = read_text(f"{d}/distance") or ""
        try:
            distances = tuple(int(x) for x in dist_text.split())
        except ValueError:
            distances = ()
        mem = None
        for line in (read_text(f"{d}/meminfo") or "").splitlines():
            if "MemTotal:" in line:
                try:
                    mem = int(line.split("MemTotal:")[1].split()[0]) // 1024
                except (ValueError, IndexError):
                    mem = None
        nodes.append(NumaNode(id=i, cpus=parse_cpulist(read_text(f"{d}/cpulist")),
                              distances=distances, memory_mb=mem))
    return tuple(nodes)


def hostname() -> str:
    import socket

    return socket.gethostname()
