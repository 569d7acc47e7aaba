"""The ``Topology`` record: what the machine is, as frozen dataclasses.

Use it to read what ``probes.detect`` found (``topology.hosts[0].gpus``,
``topology.ranks[r].gpu``), to save and load it (``to_yaml``/``from_yaml``, also
``to_dict``/``from_dict`` and JSON), to compare worlds (``fingerprint()``, structural facts
only, see docs/design.md "Topology and fingerprint"), to describe it in one line
(``summary()``), and to ask for ring orders that follow it (``ring_order()``, ``ring_orders(k)``).

A ``Topology`` is the world: its hosts, where each rank runs (``RankPlace``) and the links
measured between ranks (``Links``). One host's hardware (``Host`` and its NUMA nodes, PCI
devices, GPUs, NVLinks and network ports) is ``probes.hardware``; its names are importable
from here too.

Unknown facts are ``None`` (or empty tuples), never guessed: a VM's ``numa_node`` of -1
becomes ``None``, a NIC whose speed reads -1 has ``speed_mbps`` ``None``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from safefiles.records import RecordError, declare, key_path, load, schema_document

from .hardware import (
    CAP_WHY,
    MAX_CPUS,
    MAX_GPUS_PER_HOST,
    MAX_NICS,
    MAX_NUMA_NODES,
    MAX_PCI_DEVICES,
    NIC_KINDS,
    NVML_LEVELS,
    P2P_STATUS,
    PCIE_LEVELS,
    Gpu,
    GpuPair,
    Host,
    Nic,
    NumaNode,
    NvLink,
    PciDevice,
)
from .sysfs import format_cpulist

__all__ = [
    "FINGERPRINT_PATTERN", "FINGERPRINT_VERSION", "FORMAT", "MAX_CPUS", "MAX_FILE_BYTES",
    "MAX_FILE_VALUES", "MAX_GPUS_PER_HOST", "MAX_HOSTS", "MAX_NICS", "MAX_NUMA_NODES",
    "MAX_PCI_DEVICES", "MAX_RANKS", "NIC_KINDS", "NVML_LEVELS", "P2P_STATUS", "PCIE_LEVELS",
    "SCHEMA_FILE", "VERSION", "Gpu", "GpuPair", "Host", "Links", "Nic", "NumaNode", "NvLink",
    "PciDevice", "RankPlace", "Topology", "TopologyError", "TopologyHeader",
    "fingerprint_field", "topology_schema",
]

FORMAT = "ringtune-topology"
VERSION = 1
FINGERPRINT_VERSION = 1
#: A fingerprint as ``Topology.fingerprint`` writes it (a profile's ``topology.fingerprint``
#: is one too: ``fingerprint_field``).
FINGERPRINT_PATTERN = r"sha256:[0-9a-f]{64}"


class TopologyError(ValueError):
    """A topology file or record is malformed; the message names the file and the key."""


#: Size caps of a topology record, each list's checked before any of its entries is read
#: (so a refusal costs no more than counting): a world of 8,192 ranks on up to 1,024 hosts
#: (each host's own caps: ``probes.hardware``). A file is at most ``MAX_FILE_BYTES`` and
#: ``MAX_FILE_VALUES`` values (counted while parsing: a 100,000-rank file is refused
#: partway).
MAX_RANKS = 1 << 13
MAX_HOSTS = 1 << 10
MAX_FILE_BYTES = 4 << 20
MAX_FILE_VALUES = 1 << 17


def fingerprint_field(why: str = "") -> Any:
    """A declared key holding a fingerprint (``"sha256:"`` and 64 lower-case hex digits),
    or null: the topology file's and the profile's ``topology.fingerprint``."""
    return declare(None, pattern=FINGERPRINT_PATTERN, max_len=len("sha256:") + 64,
                   shape="'sha256:' and 64 lower-case hex digits", why=why)


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: host index, local rank, GPU (position in the host's ``gpus``)
    and NUMA node; ``None`` when unknown or not bound."""

    rank: int
    host: int = 0
    local_rank: int = 0
    gpu: int | None = None
    numa_node: int | None = None


@dataclass(frozen=True)
class Links:
    """Measured point-to-point links between ranks (``None`` on the diagonal)."""

    bandwidth_gbps: tuple[tuple[float | None, ...], ...] = declare(
        (), max_items=MAX_RANKS, noun="rows", why=CAP_WHY)
    latency_us: tuple[tuple[float | None, ...], ...] = declare(
        (), max_items=MAX_RANKS, noun="rows", why=CAP_WHY)
    message_bytes: int = 0
    small_bytes: int = 0
    repetitions: int = 0
    #: Per-flow bandwidth (GB/s) of the pairs timed all at once between two groups of
    #: ranks (two hosts, two racks: ``probes.links.measure``): how much concurrent flows
    #: of one group share its links. ``None`` where not measured; empty: never measured.
    concurrent_gbps: tuple[tuple[float | None, ...], ...] = declare(
        (), max_items=MAX_RANKS, noun="rows", why=CAP_WHY)


@dataclass(frozen=True)
class TopologyHeader:
    """What a topology file says of itself and of what its facts give: the ``format`` and
    ``version`` it is written in, the ``fingerprint`` and ``summary`` ``ringtune probe``
    wrote. Checked on reading, never trusted: both are recomputed from the facts, so a
    hand-written file may leave all four out (``Topology.__header__``)."""

    format: str = declare(FORMAT, choices=(FORMAT,), why="not a ringtune topology file")
    version: int = declare(VERSION, choices=(VERSION,),
                           why=f"this ringtune reads topology version {VERSION}")
    fingerprint: str | None = fingerprint_field("or leave it out: it is recomputed")
    summary: str | None = declare(None, why="or leave it out: it is recomputed")


@dataclass(frozen=True)
class Topology:
    """Hosts, rank layout and (optionally) measured links of one MPI world."""

    __header__ = TopologyHeader

    hosts: tuple[Host, ...] = declare((), required=True, min_items=1, max_items=MAX_HOSTS,
                                      noun="hosts", why="one entry per host")
    ranks: tuple[RankPlace, ...] = declare((), max_items=MAX_RANKS, noun="ranks", why=CAP_WHY)
    links: Links | None = None
    source: str = "detected"
    #: Scores and ring orders computed from the (immutable) facts; not part of equality.
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                   compare=False, hash=False)

    def __check__(self, where: str) -> None:
        """The rank layout and the link matrices agree with the hosts (``safefiles.records``
        runs it on loading, after each host's own ``Host.__check__``): ranks listed in
        order, host, GPU and NUMA indexes that exist, local ranks distinct and below their
        host's rank count, one matrix row and column per rank."""
        counts = self.ranks_per_host()
        seen: set[tuple[int, int]] = set()
        for i, place in enumerate(self.ranks):
            at = key_path(where, f"ranks[{i}]")
            if place.rank != i:
                raise RecordError(f"{at}.rank", f"expected {i} (ranks listed in order), got "
                                                f"{place.rank}")
            if not 0 <= place.host < len(self.hosts):
                raise RecordError(f"{at}.host", f"{place.host} is not a host index "
                                                f"0..{len(self.hosts) - 1}")
            host = self.hosts[place.host]
            if place.gpu is not None and not 0 <= place.gpu < len(host.gpus):
                raise RecordError(f"{at}.gpu", f"{place.gpu} is not a GPU of host {place.host} "
                                               f"(it lists {len(host.gpus)})")
            host.check_numa(place.numa_node, f"{at}.numa_node")
        for i, place in enumerate(self.ranks):
            if place.local_rank >= counts[place.host]:
                raise RecordError(key_path(where, f"ranks[{i}].local_rank"),
                                  f"{place.local_rank}, but host {place.host} has "
                                  f"{counts[place.host]} ranks (local ranks "
                                  f"0..{counts[place.host] - 1})")
            if (place.host, place.local_rank) in seen:
                raise RecordError(key_path(where, f"ranks[{i}].local_rank"),
                                  f"{place.local_rank} is already another rank's on host "
                                  f"{place.host}; local ranks differ")
            seen.add((place.host, place.local_rank))
        if self.links is not None:
            n = len(self.ranks)
            for key in ("bandwidth_gbps", "latency_us"):
                m = getattr(self.links, key)
                if len(m) != n or any(len(row) != n for row in m):
                    raise RecordError(key_path(where, f"links.{key}"),
                                      f"expected a {n}x{n} matrix (one row and column per "
                                      "rank)")

    # -- shape ------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def ranks_per_host(self) -> tuple[int, ...]:
        """Ranks on each host, in host order."""
        counts = [0] * len(self.hosts)
        for p in self.ranks:
            if 0 <= p.host < len(counts):
                counts[p.host] += 1
        return tuple(counts)

    def rank_hosts(self) -> tuple[int, ...]:
        return tuple(p.host for p in self.ranks)

    def rank_gpu(self, rank: int) -> Gpu | None:
        p = self.ranks[rank]
        if p.gpu is None or not (0 <= p.host < len(self.hosts)):
            return None
        gpus = self.hosts[p.host].gpus
        return gpus[p.gpu] if 0 <= p.gpu < len(gpus) else None

    # -- serialisation ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, numbers, strings): what ``to_yaml``/JSON write."""
        data = _to_data(self)
        assert isinstance(data, dict)
        header = TopologyHeader(fingerprint=self.fingerprint(), summary=self.summary())
        return {**dataclasses.asdict(header), **data}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1) + "\n"

    def to_yaml(self) -> str:
        import yaml

        return str(yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None,
                                  width=99))

    @classmethod
    def from_dict(cls, data: Any, source: str = "<topology>") -> Topology:
        """Build and check a ``Topology`` from plain data; ``TopologyError`` names
        ``source`` and the key path of the first problem."""
        from safefiles.safeload import InputError, check_kind

        try:
            check_kind(data, "topology", source)
        except InputError as exc:
            raise TopologyError(str(exc)) from None
        try:
            return load(Topology, data)
        except RecordError as exc:
            raise TopologyError(f"{source}: {exc}") from None

    @classmethod
    def from_yaml(cls, text: str, source: str = "<topology>") -> Topology:
        """Parse (bounded, plain YAML only: ``safefiles.safeload``) and check."""
        from safefiles.safeload import parse_text

        return cls._parsed(parse_text, text, source)

    @classmethod
    def from_json(cls, text: str, source: str = "<topology>") -> Topology:
        """Parse (bounded JSON: ``safefiles.safeload``) and check."""
        from safefiles.safeload import parse_json

        return cls._parsed(parse_json, text, source)

    @classmethod
    def _parsed(cls, parse: Callable[[str, str], Any], text: str,
                source: str) -> Topology:
        """``text`` read by ``parse`` (a bounded reader of ``safefiles.safeload``), then
        checked; either's refusal is a ``TopologyError`` naming ``source``."""
        from safefiles.safeload import InputError

        try:
            data = parse(text, source)
        except InputError as exc:
            raise TopologyError(str(exc)) from None
        return cls.from_dict(data, source)

    # -- fingerprint and summary ------------------------------------------------------

    def structure(self) -> dict[str, Any]:
        """The structural facts the fingerprint hashes: world size, hosts, ranks per host,
        and per host kind its CPU model, NUMA shape, GPU models, GPU link classes, NIC
        kinds/speeds and which GPU each local rank uses. No names, bus ids, UUIDs, memory
        in use or measured numbers. Hosts are sorted so the host order does not matter."""
        per_host: list[list[RankPlace]] = [[] for _ in self.hosts]
        for p in self.ranks:
            if 0 <= p.host < len(per_host):
                per_host[p.host].append(p)
        kinds = []
        for h, places in zip(self.hosts, per_host):
            places.sort(key=lambda p: p.local_rank)
            kinds.append(json.dumps({
                "cpu_model": h.cpu_model,
                "sockets": h.sockets,
                "cores": h.cores,
                "cpus": h.cpus,
                "numa": [len(n.cpus) for n in h.numa],
                "numa_distances": [list(n.distances) for n in h.numa],
                "gpus": [g.name for g in h.gpus],
                "gpu_links": h.gpu_matrix(),
                "nics": sorted([n.kind, n.speed_mbps or 0] for n in h.nics),
                "ranks": len(places),
                "rank_gpus": [-1 if p.gpu is None else p.gpu for p in places],
            }, sort_keys=True))
        return {
            "fingerprint_version": FINGERPRINT_VERSION,
            "world_size": self.world_size,
            "hosts": len(self.hosts),
            "ranks_per_host": sorted(self.ranks_per_host()),
            "host_kinds": sorted(kinds),
        }

    def fingerprint(self) -> str:
        """``"sha256:<hex>"`` of ``structure()`` (canonical JSON)."""
        blob = json.dumps(self.structure(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def summary(self) -> str:
        """One line for people, e.g. ``"1 host x 4 ranks, cpu, shm"``."""
        counts = self.ranks_per_host()
        nh = len(self.hosts)
        rph = str(counts[0]) if counts and len(set(counts)) == 1 else "/".join(map(str, counts))
        parts = [f"{nh} host{'' if nh == 1 else 's'} x {rph or 0} rank{'' if rph == '1' else 's'}"]
        gpus = [g for g in (self.rank_gpu(r) for r in range(self.world_size)) if g]
        if gpus:
            names = sorted({g.name or "GPU" for g in gpus})
            parts.append("+".join(names))
            nvlinked = False
            for p in self.ranks:
                for q in self.ranks:
                    if (p.host == q.host and p.gpu is not None and q.gpu is not None
                            and p.gpu != q.gpu):
                        pair = self.hosts[p.host].gpu_pair(p.gpu, q.gpu)
                        nvlinked = nvlinked or bool(pair and pair.nvlinks)
            intra = "nvlink" if nvlinked else "pcie"
        else:
            parts.append("cpu")
            intra = "shm"
        shared = any(c > 1 for c in counts)  # some ranks talk inside a host
        links = ([intra] if shared else []) + ([_best_nic_label(self.hosts)] if nh > 1 else [])
        if links:
            parts.append("+".join(links))
        return ", ".join(parts)

    # -- ring orders ------------------------------------------------------------------

    def rank_scores(self) -> list[list[float]]:
        """How good the link between every two ranks is (higher is better), cached.

        Ranks on different hosts score 0. On one host: NVLinks between their GPUs, then
        the PCIe level, then the same NUMA node. Measured bandwidth, when present, comes
        first, in 25 % steps so that noise between equal links does not reorder them.
        """
        cached = self._cache.get("scores")
        if cached is not None:
            return typing.cast(list[list[float]], cached)
        n = self.world_size
        bw = self.links.bandwidth_gbps if self.links else ()
        out = [[0.0] * n for _ in range(n)]
        for a in range(n):
            for b in range(n):
                if a != b:
                    s = self._structural_score(a, b)
                    if len(bw) == n and len(bw[a]) == n:
                        vals = [v for v in (bw[a][b], bw[b][a]) if v]
                        if vals and min(vals) > 0:
                            s += 1e6 * (1 + max(0, round(math.log(min(vals) * 1e3, 1.25))))
                    out[a][b] = s
        self._cache["scores"] = out
        return out

    def _structural_score(self, a: int, b: int) -> float:
        pa, pb = self.ranks[a], self.ranks[b]
        if pa.host != pb.host or not (0 <= pa.host < len(self.hosts)):
            return 0.0
        host = self.hosts[pa.host]
        s = 1.0
        if pa.numa_node is not None and pa.numa_node == pb.numa_node:
            s += 1.0
        if pa.gpu is not None and pb.gpu is not None:
            if pa.gpu == pb.gpu:
                return s + 50.0  # two ranks on one GPU: a device-local copy
            pair = host.gpu_pair(pa.gpu, pb.gpu)
            if pair is not None:
                if pair.level in PCIE_LEVELS:
                    s += 10.0 * (len(PCIE_LEVELS) - PCIE_LEVELS.index(pair.level))
                s += 1000.0 * pair.nvlinks
        return s

    def ring_orders(self, rings: int, ranks: Sequence[int] | None = None) -> list[list[int]]:
        """``rings`` cycles over the ranks (see ``probes.rings``). With ``ranks`` (world
        ranks of a sub-communicator, in its rank order) the cycles are over positions
        ``0..len(ranks)-1`` of that sub-communicator."""
        from .rings import best_rings

        sel = list(range(self.world_size)) if ranks is None else list(ranks)
        key = f"rings:{rings}:{sel}"
        cached = self._cache.get(key)
        if cached is None:
            full = self.rank_scores()
            score = [[full[a][b] for b in sel] for a in sel]
            hosts = [self.ranks[r].host for r in sel]
            cached = best_rings(score, hosts, rings)
            self._cache[key] = cached
        return [list(c) for c in cached]

    def ring_order(self) -> list[int]:
        """Ring 0: ranks of one host adjacent, hosts in order, inside a host the cycle whose
        slowest link is best (NVLink count, then PCIe level, then NUMA; measured bandwidth
        first when links were measured)."""
        return self.ring_orders(1)[0]


#: The topology schema's file name under ``profiles/schema/`` (``make schema`` writes it).
SCHEMA_FILE = f"topology-v{VERSION}.schema.json"


def topology_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a topology file, from the same declarations the
    loader checks (``Topology`` and its header): for editors and other tools; the loader
    (``probes.load_topology``) is the authority and also checks what the description
    lists."""
    return schema_document(
        Topology, file=SCHEMA_FILE, title=f"ringtune topology, version {VERSION}",
        description=(
            "What `ringtune probe --out` writes and RINGTUNE_TOPOLOGY / --topology read "
            "(docs/probes.md): hosts, rank layout and measured links of one MPI world. "
            "Generated from the declared records in probes/topology.py and "
            "probes/hardware.py by `python -m "
            "autotune.schemas` (make schema): do not edit by hand. fingerprint and summary "
            "are recomputed from the facts. probes.load_topology checks everything here "
            "and, in addition, what a schema cannot express: CPU lists written as text are "
            f"numbers and ranges (0-3,8) below {MAX_CPUS:,}; on each host NUMA ids distinct, one "
            "distance per NUMA node, GPU indexes distinct, gpu_pairs naming two different "
            "listed GPUs, every numa_node one of the host's nodes; ranks listed in order "
            "with existing host and GPU indexes, local ranks distinct and below their host's "
            "rank count; links matrices of one row and column per rank; and YAML's 1.0 is a "
            f"float where an integer is meant. A file is at most {MAX_FILE_BYTES >> 20} MiB "
            f"and {MAX_FILE_VALUES:,} values."))


def _best_nic_label(hosts: Sequence[Host]) -> str:
    best: Nic | None = None
    rank = {"infiniband": 3, "roce": 2, "ethernet": 1}
    for h in hosts:
        for n in h.nics:
            key = (rank.get(n.kind, 0), n.speed_mbps or 0)
            if best is None or key > (rank.get(best.kind, 0), best.speed_mbps or 0):
                best = n
    if best is None:
        return "net"
    short = {"infiniband": "ib", "roce": "roce", "ethernet": "eth"}.get(best.kind, "net")
    if best.speed_mbps:
        return f"{short} {best.speed_mbps // 1000}G" if best.speed_mbps >= 1000 else \
            f"{short} {best.speed_mbps}M"
    return short


# -- plain data <-> records -----------------------------------------------------------

_CPU_FIELDS = {"cpus"}


def _to_data(obj: Any, name: str = "") -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            if f.name.startswith("_"):
                continue
            out[f.name] = _to_data(getattr(obj, f.name), f.name)
        return out
    if isinstance(obj, tuple):
        if name in _CPU_FIELDS and all(isinstance(x, int) for x in obj):
            return format_cpulist(obj)
        return [_to_data(x) for x in obj]
    return obj
