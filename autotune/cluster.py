"""Cluster and workload descriptions for the cost model and ``ringtune simulate``.

Use ``load_cluster(path)`` / ``load_workload(path)`` to read the YAML files under
``profiles/clusters/``; every problem is a ``ValueError`` naming the file and the key path
(``gpu-8x.yaml: levels[1].bandwidth_gbs: expected a positive number, got 0``), which the
CLI turns into exit code 2. ``Cluster`` is also what calibration on this machine produces.

A cluster is a tiered topology, levels innermost first. Level *l* groups ``size`` units of
level *l−1* (level 0 groups ranks, e.g. the GPUs of a host); ranks are numbered so that
each group is contiguous. Each level describes the links a rank uses to reach a peer whose
nearest common group is at that level:

- ``bandwidth_gbs``: one link, one direction, GB/s (10⁹ bytes/s);
- ``latency_us``: one message across the level, hardware figure;
- ``links_per_rank``: links of this level per rank; a fraction when ranks share a link
  (one 50 Gbit NIC for 8 GPUs is 0.125);
- ``shared``: ``true`` when concurrent flows of one rank share its links as one pipe
  (a NIC, NVSwitch); ``false`` when each flow runs on one link of its own (NVLink bricks
  between GPU pairs), so one ring cannot use more than one link.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

_LEVEL_KEYS = {"name", "size", "bandwidth_gbs", "latency_us", "links_per_rank", "shared",
               "source"}
_CLUSTER_KEYS = {"name", "description", "ranks", "ranks_per_host", "levels", "memory_gbs",
                 "overhead_us", "sources", "notes",
                 "emulate"}  # read by `ringtune emulate` (ringtune/emulate/spec.py)
_WORKLOAD_KEYS = {"name", "description", "gradient_bytes", "compute_seconds", "overlap",
                  "sources", "notes", "tensor_bytes"}

#: Bounds of the files' figures. Ranks: the model works on NumPy arrays with one entry per
#: rank and ranks every grid of the world size, so ``ringtune simulate`` costs grow with
#: both (CPU time on this 2-core VM: 1,024 ranks 1.7 s, 4,096 2.8 s, 65,536 17 s): 8,192
#: ranks (1,024 hosts of 8 GPUs) keeps a simulation within seconds. Bandwidths, latencies
#: and rates beyond 10⁻⁶…10⁹ are typing errors that would turn predicted times into 0 or
#: infinity.
MAX_RANKS = 1 << 13
MAX_LEVELS = 16
MAX_QUANTITY = 1e9
MIN_QUANTITY = 1e-6
MAX_FILE_BYTES = 1 << 20

#: The ``emulate:`` section (``ringtune emulate``, ringtune/emulate/spec.py, which says what
#: each key does): checked with the rest of the file, so every reader refuses it alike.
EMULATE_KEYS = ("hostname_prefix", "oversubscribe", "burst_kb", "mtu", "progress")
PROGRESS_MODES = ("spin", "throttle")
HOSTNAME_PREFIX = re.compile(r"[a-z][a-z0-9-]{0,40}")
#: Ethernet's MTU and the range ``mtu`` may take (IPv4's minimum datagram a host must
#: accept, and the largest a veth carries); the largest token-bucket burst (1 GiB).
DEFAULT_MTU = 1500
MTU_RANGE = (576, 65535)
MAX_BURST_KB = 1 << 20

#: Software cost of posting one message (or one reduction call) when a file gives none:
#: what a GPU collective library spends per chunk, not a hardware figure.
DEFAULT_OVERHEAD_US = 5.0


@dataclass(frozen=True)
class Level:
    """One tier of a cluster; see the module docstring for the meaning of the fields."""

    name: str
    size: int
    bandwidth_gbs: float
    latency_us: float
    links_per_rank: float = 1.0
    shared: bool = True
    source: str = ""
    #: Measured (message bytes, GB/s) points when bandwidth depends on the message size
    #: (protocol switches of an MPI library); ``bandwidth_gbs`` is then the largest size's.
    curve: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Cluster:
    """A tiered cluster: ``levels`` innermost first, ``memory_gbs`` the memory bandwidth of
    one rank's device (a reduction reads two arrays and writes one: rate ``memory_gbs/3``),
    ``overhead_us`` the software cost per message."""

    name: str
    levels: tuple[Level, ...]
    memory_gbs: float
    overhead_us: float = DEFAULT_OVERHEAD_US
    description: str = ""
    sources: tuple[str, ...] = ()
    #: How many of the innermost levels are inside one host (a host may have tiers).
    host_levels: int = 1
    #: Measured (array bytes, GB/s) points of ``memory_gbs`` by size (caches), if any.
    memory_curve: tuple[tuple[int, float], ...] = ()
    #: How the model treats ``native``: ``"best"`` (the better of recursive doubling and
    #: halving/doubling at each size, what a tuned library such as NCCL approaches; every
    #: cluster file) or an MPI library's ``cost_model`` (``collectives.natives``: that
    #: library's own selection, with its reduction rate, per-message cost and temporary
    #: buffers; a calibration on this machine).
    native_model: str = "best"
    #: Software cost per message of the library's own collective (C, no Python); ``None``:
    #: ``overhead_us``.
    native_overhead_us: float | None = None
    #: Measured (array bytes, GB/s) points of the library's own reduction (``memory_gbs``
    #: convention: 3 × bytes per second); empty: ``memory_curve``.
    native_memory_curve: tuple[tuple[int, float], ...] = ()
    #: First touch of freshly mapped memory, GB/s of pages (0: not modelled). A library
    #: may allocate a temporary buffer per call; at or above ``mmap_threshold`` bytes the C
    #: library maps fresh pages for it every time, and every page faults on first touch.
    page_fault_gbs: float = 0.0
    #: glibc's largest dynamic mmap threshold (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit).
    mmap_threshold: int = 32 << 20
    path: str | None = field(default=None, compare=False)
    #: The file's ``emulate:`` section, checked, every key present (defaults filled).
    emulate: Mapping[str, Any] = field(default_factory=lambda: check_emulate(None, ""),
                                       compare=False)

    @property
    def ranks(self) -> int:
        return math.prod(lv.size for lv in self.levels)

    @property
    def ranks_per_host(self) -> int:
        return math.prod(lv.size for lv in self.levels[:self.host_levels])

    @property
    def hosts(self) -> int:
        return self.ranks // self.ranks_per_host

    def host_of(self) -> tuple[int, ...]:
        """Host index of every rank (level-0 groups)."""
        k = self.ranks_per_host
        return tuple(r // k for r in range(self.ranks))

    def with_hosts(self, hosts: int) -> Cluster:
        """The same kind of cluster with ``hosts`` hosts: outer levels filled innermost
        first (a partial outer level shrinks; what does not divide goes into the last)."""
        if hosts < 1:
            raise ValueError(f"hosts must be at least 1, got {hosts}")
        levels = list(self.levels[:self.host_levels])
        rest = hosts
        outer = list(self.levels[self.host_levels:])
        for i, lv in enumerate(outer):
            last = i == len(outer) - 1
            size = rest if last else math.gcd(rest, lv.size)
            if size > 1 or last:
                levels.append(replace(lv, size=max(1, size)))
            rest //= max(1, size)
        if not outer and hosts > 1:
            raise ValueError(f"cluster {self.name!r} has one level: it cannot have {hosts} hosts")
        return replace(self, levels=tuple(levels), name=f"{self.name}@{hosts}")

    def flat_hosts(self) -> Cluster:
        """One rank per host (what an inter-host-only allreduce sees, as in Goyal et al.'s
        "intra-server sum, inter-server allreduce"): the host's links all go to that rank."""
        k = self.ranks_per_host
        outer = tuple(replace(lv, links_per_rank=lv.links_per_rank * k)
                      for lv in self.levels[self.host_levels:])
        unit = Level("rank", 1, self.levels[0].bandwidth_gbs, self.levels[0].latency_us)
        return replace(self, levels=(unit,) + outer, host_levels=1,
                       name=f"{self.name} (1 rank/host)")


@dataclass(frozen=True)
class Workload:
    """A training step: one allreduce of ``gradient_bytes`` per step of ``compute_seconds``,
    with a fraction ``overlap`` of the allreduce hidden behind compute (bounded by the
    compute time)."""

    name: str
    gradient_bytes: int
    compute_seconds: float
    overlap: float = 0.0
    description: str = ""
    sources: tuple[str, ...] = ()
    #: The gradient tensors' sizes in bytes, in the order backward produces them (optional;
    #: ``ringtune tune --workload`` searches allreduce_many's bucket size on them).
    tensor_bytes: tuple[int, ...] = ()

    def step_seconds(self, allreduce_seconds: float) -> float:
        hidden = min(self.overlap * allreduce_seconds, self.compute_seconds)
        return self.compute_seconds + allreduce_seconds - hidden

    def efficiency(self, allreduce_seconds: float) -> float:
        """Weak-scaling efficiency: step time of one GPU (compute only) over this step."""
        return self.compute_seconds / self.step_seconds(allreduce_seconds)


# -- validation ------------------------------------------------------------------------


def _read_yaml(path: str, kind: str) -> Any:
    """The file's plain data through the one bounded reader (``probes.safeload``: size,
    alias and depth caps, duplicate keys, plain types, finite numbers); a profile or a
    topology file given by mistake is named as such."""
    from probes.safeload import check_kind, load_file

    data = load_file(path, kind, max_bytes=MAX_FILE_BYTES, as_json=False)
    check_kind(data, kind, path)
    return data


def _show(value: Any) -> str:
    """A value for a message: a list or mapping by its type (it may be huge), text cut."""
    if isinstance(value, (list, dict)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(where: str, data: Mapping[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise ValueError(f"{where}{extra[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")


def _positive(where: str, value: Any, integer: bool = False, zero: bool = False,
              most: float = MAX_QUANTITY) -> Any:
    """``value`` if it is a (non-negative with ``zero``) number no larger than ``most``;
    a physical quantity beyond ``MAX_QUANTITY`` (10⁹ GB/s, 10⁹ µs) is a typing error that
    would turn the model's times into infinities."""
    ok_type = (isinstance(value, int) if integer else isinstance(value, (int, float)))
    if not ok_type or isinstance(value, bool) or not math.isfinite(value) or (
        value < 0 if zero else value <= 0
    ):
        kind = "integer" if integer else "number"
        bound = "non-negative" if zero else "positive"
        raise ValueError(f"{where}: expected a {bound} {kind}, got {_show(value)}")
    if value > most:
        raise ValueError(f"{where}: {_show(value)} is more than {most:g}, the most this key "
                         "may be; give a realistic figure (in the units of the key's name)")
    if not integer and 0 < value < MIN_QUANTITY:
        raise ValueError(f"{where}: {_show(value)} is below {MIN_QUANTITY:g}; give a "
                         "realistic figure (in the units of the key's name)")
    return value


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected text, got {_show(value)}")
    return value


def _sources(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ValueError(f"{where}: expected a list of texts, got {_show(value)}")
    return tuple(value)


def check_emulate(value: Any, where: str) -> dict[str, Any]:
    """The ``emulate:`` section with its defaults filled; ``ValueError`` naming the key
    (``where``: ``FILE: emulate``) for anything ``ringtune emulate`` could not use."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping with keys {', '.join(EMULATE_KEYS)}, "
                         f"got {_show(value)}")
    _unknown(f"{where}.", value, set(EMULATE_KEYS))
    prefix = value.get("hostname_prefix", "host")
    if not isinstance(prefix, str) or not HOSTNAME_PREFIX.fullmatch(prefix):
        raise ValueError(f"{where}.hostname_prefix: expected lower-case letters, digits and "
                         f"'-' starting with a letter (at most 41), got {_show(prefix)}")
    over = value.get("oversubscribe", False)
    if not isinstance(over, bool):
        raise ValueError(f"{where}.oversubscribe: expected true or false, got {_show(over)}")
    burst_kb = value.get("burst_kb", 0)
    if (not isinstance(burst_kb, (int, float)) or isinstance(burst_kb, bool)
            or not math.isfinite(burst_kb) or not 0 <= burst_kb <= MAX_BURST_KB):
        raise ValueError(f"{where}.burst_kb: expected a number 0..{MAX_BURST_KB} (KiB; 0: the "
                         f"default), got {_show(burst_kb)}")
    mtu = value.get("mtu", DEFAULT_MTU)
    if (not isinstance(mtu, int) or isinstance(mtu, bool)
            or not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]):
        raise ValueError(f"{where}.mtu: expected an integer {MTU_RANGE[0]}..{MTU_RANGE[1]} "
                         f"(bytes; 1500 is Ethernet's, 9000 jumbo frames), got {_show(mtu)}")
    progress = value.get("progress", "spin")
    if not isinstance(progress, str) or progress not in PROGRESS_MODES:
        raise ValueError(f"{where}.progress: expected one of {', '.join(PROGRESS_MODES)} (how "
                         f"MPICH's ranks wait), got {_show(progress)}")
    return {"hostname_prefix": prefix, "oversubscribe": over, "burst_kb": burst_kb,
            "mtu": mtu, "progress": progress}


def cluster_from_dict(data: Any, where: str = "cluster") -> Cluster:
    """A validated ``Cluster`` from parsed YAML; ``where`` (the file name) prefixes errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping with keys name, ranks, levels, "
                         f"memory_gbs; got {type(data).__name__}")
    p = f"{where}: "
    _unknown(p, data, _CLUSTER_KEYS)
    for key in ("levels", "ranks", "memory_gbs"):
        if key not in data:
            raise ValueError(f"{p}{key}: missing (required: levels, ranks, memory_gbs)")
    raw = data["levels"]
    if not isinstance(raw, list) or not raw or len(raw) > MAX_LEVELS:
        got = f"{len(raw)} levels" if isinstance(raw, list) and raw else _show(raw)
        raise ValueError(f"{p}levels: expected a non-empty list of at most {MAX_LEVELS} levels "
                         f"(innermost first), got {got}")
    levels = []
    for i, lv in enumerate(raw):
        q = f"{p}levels[{i}]"
        if not isinstance(lv, dict):
            raise ValueError(f"{q}: expected a mapping, got {_show(lv)}")
        _unknown(q + ".", lv, _LEVEL_KEYS)
        for key in ("size", "bandwidth_gbs", "latency_us"):
            if key not in lv:
                raise ValueError(f"{q}.{key}: missing (each level needs size, bandwidth_gbs, "
                                 f"latency_us)")
        shared = lv.get("shared", True)
        if not isinstance(shared, bool):
            raise ValueError(f"{q}.shared: expected true or false, got {_show(shared)}")
        levels.append(Level(
            name=_text(f"{q}.name", lv.get("name", f"level{i}")),
            size=_positive(f"{q}.size", lv["size"], integer=True, most=MAX_RANKS),
            bandwidth_gbs=float(_positive(f"{q}.bandwidth_gbs", lv["bandwidth_gbs"])),
            latency_us=float(_positive(f"{q}.latency_us", lv["latency_us"], zero=True)),
            links_per_rank=float(_positive(f"{q}.links_per_rank", lv.get("links_per_rank", 1))),
            shared=shared,
            source=_text(f"{q}.source", lv.get("source", "")),
        ))
    if isinstance(data["ranks"], int) and not isinstance(data["ranks"], bool) and \
            data["ranks"] > MAX_RANKS:
        raise ValueError(f"{p}ranks: {data['ranks']} ranks; the cost model takes at most "
                         f"{MAX_RANKS} (1,024 hosts of 8), which keeps `ringtune simulate` "
                         "within seconds")
    ranks = _positive(f"{p}ranks", data["ranks"], integer=True, most=MAX_RANKS)
    product = math.prod(lv.size for lv in levels)
    if product != ranks:
        sizes = " x ".join(str(lv.size) for lv in levels)
        raise ValueError(f"{p}levels: sizes {sizes} = {product} ranks, but ranks is {ranks}; "
                         f"make the product of levels[*].size equal ranks")
    per_host = _positive(f"{p}ranks_per_host", data.get("ranks_per_host", levels[0].size),
                         integer=True, most=MAX_RANKS)
    prefixes = [math.prod(lv.size for lv in levels[:i + 1]) for i in range(len(levels))]
    if per_host not in prefixes:
        raise ValueError(f"{p}ranks_per_host: {per_host} is not the size of a group of "
                         f"innermost levels ({', '.join(map(str, prefixes))}); a host must "
                         f"be whole levels")
    return Cluster(
        host_levels=prefixes.index(per_host) + 1,
        name=_text(f"{p}name", data.get("name", where)),
        levels=tuple(levels),
        memory_gbs=float(_positive(f"{p}memory_gbs", data["memory_gbs"])),
        overhead_us=float(_positive(f"{p}overhead_us",
                                    data.get("overhead_us", DEFAULT_OVERHEAD_US), zero=True)),
        description=_text(f"{p}description", data.get("description", "")),
        sources=_sources(f"{p}sources", data.get("sources")),
        emulate=check_emulate(data.get("emulate"), f"{p}emulate"),
    )


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """Read and validate a cluster file; ``ValueError`` naming file and key otherwise."""
    name = os.fspath(path)
    return replace(cluster_from_dict(_read_yaml(name, "cluster"), name), path=name)


def workload_from_dict(data: Any, where: str = "workload") -> Workload:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping with keys gradient_bytes, "
                         f"compute_seconds, overlap; got {type(data).__name__}")
    p = f"{where}: "
    _unknown(p, data, _WORKLOAD_KEYS)
    for key in ("gradient_bytes", "compute_seconds"):
        if key not in data:
            raise ValueError(f"{p}{key}: missing (required: gradient_bytes, compute_seconds)")
    overlap = data.get("overlap", 0.0)
    if (not isinstance(overlap, (int, float)) or isinstance(overlap, bool)
            or not 0 <= overlap <= 1):
        raise ValueError(f"{p}overlap: expected a fraction 0..1, got {_show(overlap)}")
    tensors = data.get("tensor_bytes", [])
    if not isinstance(tensors, list) or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in tensors):
        raise ValueError(f"{p}tensor_bytes: expected a list of positive integers (bytes of "
                         f"each gradient tensor), got {tensors!r}")
    if tensors and sum(tensors) != data["gradient_bytes"]:
        raise ValueError(f"{p}tensor_bytes: the sizes sum to {sum(tensors)} B, but "
                         f"gradient_bytes is {data['gradient_bytes']}; make them agree")
    return Workload(
        tensor_bytes=tuple(tensors),
        name=_text(f"{p}name", data.get("name", where)),
        gradient_bytes=_positive(f"{p}gradient_bytes", data["gradient_bytes"], integer=True,
                                 most=1 << 50),
        compute_seconds=float(_positive(f"{p}compute_seconds", data["compute_seconds"])),
        overlap=float(overlap),
        description=_text(f"{p}description", data.get("description", "")),
        sources=_sources(f"{p}sources", data.get("sources")),
    )


def load_workload(path: str | os.PathLike[str]) -> Workload:
    name = os.fspath(path)
    return workload_from_dict(_read_yaml(name, "workload"), name)
