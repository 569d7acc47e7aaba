"""GPU facts from NVML (``nvidia-ml-py``, imported lazily as ``pynvml``) behind a narrow seam.

Use ``read_gpus(root, pci)``: it asks a *responder* for the handful of NVML answers it needs
and turns them into ``Gpu``/``GpuPair`` records. ``NvmlResponder`` calls the real library;
``RecordedResponder`` replays answers saved as JSON (the test fixtures), so the parsing —
bus id normalisation, NUMA fallback, NVLink peer counting, level labels — is the same code
in both cases. No library, no driver, no GPU: an empty list and a reason, never a crash.

Pitfalls handled here (REFERENCE.md): NVML bus ids are bytes with an 8-digit domain
(``b"00000000:3B:00.0"``), sysfs uses ``0000:3b:00.0``; ``NVML_P2P_CAPS_INDEX_READ`` is a
tuple in nvidia-ml-py 13.x, so plain integers are passed; ``nvmlDeviceGetNumaNodeId`` only
applies where GPU memory is a NUMA node, so sysfs ``numa_node`` is asked first.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

from .hardware import NVML_LEVELS, P2P_STATUS, Gpu, GpuPair, NvLink, PciDevice
from .sysfs import normalize_bus_id, parse_cpulist, path, read_nonneg, read_text

#: ``nvmlGpuP2PCapsIndex_t`` values (READ, WRITE, NVLINK), as plain ints on purpose.
P2P_READ, P2P_WRITE, P2P_NVLINK = 0, 1, 2
#: ``nvmlIntNvLinkDeviceType_t``.
NVLINK_REMOTE = {0: "gpu", 1: "cpu", 2: "switch"}
NVLINK_MAX_LINKS = 18

T = TypeVar("T")


class Responder(Protocol):
    """The NVML answers ``read_gpus`` needs; each returns ``None`` when NVML cannot say."""

    def driver(self) -> str | None: ...
    def count(self) -> int: ...
    def name(self, i: int) -> Any: ...
    def uuid(self, i: int) -> Any: ...
    def memory_total(self, i: int) -> int | None: ...
    def bus_id(self, i: int) -> Any: ...
    def numa_node(self, i: int) -> int | None: ...
    def cpu_affinity(self, i: int) -> Sequence[int] | None: ...
    def pcie(self, i: int) -> Sequence[int | None] | None: ...
    def common_ancestor(self, i: int, j: int) -> int | None: ...
    def p2p_status(self, i: int, j: int, index: int) -> int | None: ...
    def nvlinks(self, i: int) -> Sequence[Sequence[Any]] | None: ...


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).strip() or None


class NvmlResponder:
    """The live NVML library. Construct with ``NvmlResponder.open()``; ``close()`` after."""

    def __init__(self, nvml: Any) -> None:
        self.nv = nvml
        self._handles: dict[int, Any] = {}

    @classmethod
    def open(cls) -> NvmlResponder:
        """``ImportError``/``OSError``/NVML errors propagate (``read_gpus`` records why)."""
        import pynvml

        pynvml.nvmlInit()
        return cls(pynvml)

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down is best effort
            pass

    def _h(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = self.nv.nvmlDeviceGetHandleByIndex(i)
        return self._handles[i]

    def _ask(self, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported & co mean "unknown"
            return None

    def driver(self) -> str | None:
        return _text(self._ask(self.nv.nvmlSystemGetDriverVersion))

    def count(self) -> int:
        return int(self._ask(self.nv.nvmlDeviceGetCount) or 0)

    def name(self, i: int) -> Any:
        return self._ask(lambda: self.nv.nvmlDeviceGetName(self._h(i)))

    def uuid(self, i: int) -> Any:
        return self._ask(lambda: self.nv.nvmlDeviceGetUUID(self._h(i)))

    def memory_total(self, i: int) -> int | None:
        return self._ask(lambda: int(self.nv.nvmlDeviceGetMemoryInfo(self._h(i)).total))

    def bus_id(self, i: int) -> Any:
        return self._ask(lambda: self.nv.nvmlDeviceGetPciInfo(self._h(i)).busId)

    def numa_node(self, i: int) -> int | None:
        fn = getattr(self.nv, "nvmlDeviceGetNumaNodeId", None)
        return None if fn is None else self._ask(lambda: int(fn(self._h(i))))

    def cpu_affinity(self, i: int) -> Sequence[int] | None:
        words = (os.cpu_count() or 64) // 64 + 1
        return self._ask(lambda: [int(w) for w in
                                  self.nv.nvmlDeviceGetCpuAffinity(self._h(i), words)])

    def pcie(self, i: int) -> Sequence[int | None] | None:
        h = self._h(i)
        return [self._ask(lambda: int(self.nv.nvmlDeviceGetCurrPcieLinkGeneration(h))),
                self._ask(lambda: int(self.nv.nvmlDeviceGetCurrPcieLinkWidth(h))),
                self._ask(lambda: int(self.nv.nvmlDeviceGetMaxPcieLinkGeneration(h))),
                self._ask(lambda: int(self.nv.nvmlDeviceGetMaxPcieLinkWidth(h)))]

    def common_ancestor(self, i: int, j: int) -> int | None:
        return self._ask(lambda: int(self.nv.nvmlDeviceGetTopologyCommonAncestor(
            self._h(i), self._h(j))))

    def p2p_status(self, i: int, j: int, index: int) -> int | None:
        return self._ask(lambda: int(self.nv.nvmlDeviceGetP2PStatus(self._h(i), self._h(j),
                                                                     index)))

    def nvlinks(self, i: int) -> Sequence[Sequence[Any]] | None:
        """``[remote bus id, remote type]`` for every active link."""
        h = self._h(i)
        out: list[list[Any]] = []
        for link in range(NVLINK_MAX_LINKS):
            state = self._ask(partial(self.nv.nvmlDeviceGetNvLinkState, h, link))
            if state is None:
                if link == 0:
                    return []  # no NVLink on this GPU
                continue
            if not state:
                continue
            info = self._ask(partial(self.nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link))
            rtype = self._ask(partial(self.nv.nvmlDeviceGetNvLinkRemoteDeviceType, h, link))
            out.append([getattr(info, "busId", None), rtype])
        return out


class RecordedResponder:
    """Replays NVML answers recorded as JSON (``{"driver": …, "gpus": [{…}, …],
    "pairs": {"0,1": {"ancestor": 10, "p2p": [0, 0, 2]}}}``); missing keys are ``None``,
    exactly as a failing NVML call would be."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.gpus: list[dict[str, Any]] = list(data.get("gpus") or [])

    @classmethod
    def load(cls, file: str) -> RecordedResponder:
        from safefiles.safeload import load_file

        data = load_file(file, "NVML recording", as_json=True)
        if not isinstance(data, dict):
            raise ValueError(f"{file}: expected a JSON object of NVML answers")
        return cls(data)

    def _g(self, i: int, key: str) -> Any:
        return self.gpus[i].get(key) if 0 <= i < len(self.gpus) else None

    def _pair(self, i: int, j: int) -> dict[str, Any]:
        pairs = self.data.get("pairs") or {}
        return pairs.get(f"{i},{j}") or pairs.get(f"{j},{i}") or {}

    def driver(self) -> str | None:
        return self.data.get("driver")

    def count(self) -> int:
        return len(self.gpus)

    def name(self, i: int) -> Any:
        return self._g(i, "name")

    def uuid(self, i: int) -> Any:
        return self._g(i, "uuid")

    def memory_total(self, i: int) -> int | None:
        return self._g(i, "memory_total")

    def bus_id(self, i: int) -> Any:
        return self._g(i, "bus_id")

    def numa_node(self, i: int) -> int | None:
        return self._g(i, "numa_node")

    def cpu_affinity(self, i: int) -> Sequence[int] | None:
        return self._g(i, "cpu_affinity")

    def pcie(self, i: int) -> Sequence[int | None] | None:
        return self._g(i, "pcie")

    def common_ancestor(self, i: int, j: int) -> int | None:
        return self._pair(i, j).get("ancestor")

    def p2p_status(self, i: int, j: int, index: int) -> int | None:
        p2p = self._pair(i, j).get("p2p")
        return p2p[index] if isinstance(p2p, list) and index < len(p2p) else None

    def nvlinks(self, i: int) -> Sequence[Sequence[Any]] | None:
        return self._g(i, "nvlinks")


def _mask_to_cpus(words: Sequence[int] | None) -> tuple[int, ...]:
    """NVML's CPU affinity (64-bit words, lowest CPUs first) -> CPU numbers."""
    cpus: list[int] = []
    for w, word in enumerate(words or ()):
        for bit in range(64):
            if int(word) >> bit & 1:
                cpus.append(w * 64 + bit)
    return tuple(cpus)


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def gpus_from(nv: Responder, root: str = "/",
              pci: dict[str, PciDevice] | None = None) -> tuple[tuple[Gpu, ...],
                                                             tuple[GpuPair, ...]]:
    """Parse one responder's answers into GPU and GPU-pair records."""
    pci = pci or {}
    n = nv.count()
    gpus: list[Gpu] = []
    raw_links: list[list[tuple[str | None, str]]] = []
    for i in range(n):
        bus = normalize_bus_id(nv.bus_id(i))
        dev_dir = path(root, f"/sys/bus/pci/devices/{bus}") if bus else None
        # NUMA: sysfs first (REFERENCE.md), then NVML, then the node holding its CPUs.
        numa = pci[bus].numa_node if bus in pci else (
            read_nonneg(f"{dev_dir}/numa_node") if dev_dir else None)
        if numa is None:
            numa = _int_or_none(nv.numa_node(i))
        cpus = _mask_to_cpus(nv.cpu_affinity(i))
        if not cpus and dev_dir:
            cpus = parse_cpulist(read_text(f"{dev_dir}/local_cpulist"))
        link = list(nv.pcie(i) or [None] * 4) + [None] * 4
        links: list[tuple[str | None, str]] = []
        for entry in nv.nvlinks(i) or ():
            remote = normalize_bus_id(entry[0]) if len(entry) > 0 else None
            rtype = entry[1] if len(entry) > 1 else None
            links.append((remote, NVLINK_REMOTE.get(rtype, "unknown")
                          if isinstance(rtype, int) else "unknown"))
        raw_links.append(links)
        grouped: dict[tuple[str | None, str], int] = {}
        for key in links:
            grouped[key] = grouped.get(key, 0) + 1
        gpus.append(Gpu(
            index=i, name=_text(nv.name(i)), uuid=_text(nv.uuid(i)),
            memory_bytes=_int_or_none(nv.memory_total(i)), bus_id=bus, numa_node=numa,
            cpus=cpus, pcie_gen=_int_or_none(link[0]) or None,
            pcie_width=_int_or_none(link[1]) or None, pcie_max_gen=_int_or_none(link[2]) or None,
            pcie_max_width=_int_or_none(link[3]) or None,
            nvlinks=tuple(NvLink(remote=r, kind=k, links=c) for (r, k), c in grouped.items()),
        ))
    by_bus: dict[str | None, int] = {g.bus_id: g.index for g in gpus if g.bus_id}
    # Links to a device that is not one of our GPUs go to an NVSwitch (when NVML cannot
    # name the remote type: older drivers lack nvmlDeviceGetNvLinkRemoteDeviceType).
    switch_links = [len([r for r, k in links if k == "switch" or (k == "unknown"
                                                                  and r not in by_bus)])
                    for links in raw_links]
    pairs: list[GpuPair] = []
    for i in range(n):
        for j in range(i + 1, n):
            direct = len([r for r, k in raw_links[i] if by_bus.get(r) == j and k != "switch"])
            # Through NVSwitches every GPU reaches every other with the links it has to the
            # switches (what nvidia-smi shows as NV12 on DGX A100, NV18 on H100).
            via_switch = min(switch_links[i], switch_links[j])
            ancestor = nv.common_ancestor(i, j)
            label = NVML_LEVELS.get(ancestor) if isinstance(ancestor, int) else None
            bus_i, bus_j = gpus[i].bus_id, gpus[j].bus_id
            if label is None and bus_i in pci and bus_j in pci:
                from .pci import pcie_level

                label = pcie_level(pci[bus_i], pci[bus_j])  # type: ignore[index]
            stat = [nv.p2p_status(i, j, idx) for idx in (P2P_READ, P2P_WRITE, P2P_NVLINK)]
            pairs.append(GpuPair(a=i, b=j, level=label, nvlinks=direct + via_switch,
                                 p2p_read=P2P_STATUS.get(stat[0]) if stat[0] is not None
                                 else None,
                                 p2p_write=P2P_STATUS.get(stat[1]) if stat[1] is not None
                                 else None,
                                 p2p_nvlink=P2P_STATUS.get(stat[2]) if stat[2] is not None
                                 else None))
    return tuple(gpus), tuple(pairs)


def read_gpus(root: str = "/", pci: dict[str, PciDevice] | None = None,
              responder: Responder | None = None) -> tuple[tuple[Gpu, ...],
                                                           tuple[GpuPair, ...], str]:
    """(GPUs, GPU pairs, source): ``source`` is ``"nvml <driver>"`` or why there are none
    (``"unavailable: no module named 'pynvml'"``)."""
    if responder is not None:
        gpus, pairs = gpus_from(responder, root, pci)
        return gpus, pairs, f"nvml {responder.driver() or '?'}"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        live = NvmlResponder.open()
    except ImportError as exc:
        return (), (), f"unavailable: {exc} (pip install nvidia-ml-py)"
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded…
        return (), (), f"unavailable: {type(exc).__name__}: {exc}"
    try:
        gpus, pairs = gpus_from(live, root, pci)
        source = f"nvml {live.driver() or '?'}"
    except Exception as exc:  # noqa: BLE001 - a broken driver must not break the probe
        return (), (), f"unavailable: {type(exc).__name__}: {exc}"
    finally:
        live.close()
    if visible is not None:
        source += f"; CUDA_VISIBLE_DEVICES={visible}"
    return gpus, pairs, source
