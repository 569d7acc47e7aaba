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

import dataclasses
import math
import os
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from safefiles.records import RecordError, declare, key_path, load, schema_document

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
PROGRESS_MODES = ("spin", "throttle")
HOSTNAME_PATTERN = r"[a-z][a-z0-9-]{0,40}"
HOSTNAME_PREFIX = re.compile(HOSTNAME_PATTERN)
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


# -- the files' records, declared once (safefiles.records checks them) ---------------------


def _figure(default: Any = dataclasses.MISSING, *, zero: bool = False, integer: bool = False,
            most: float = MAX_QUANTITY, **spec: Any) -> Any:
    """A physical quantity: positive (non-negative with ``zero``), at most ``most`` and, when
    not an integer, at least ``MIN_QUANTITY`` unless 0: beyond those a typing error that
    would turn the model's times into 0 or infinities. ``spec``: more of ``declare``'s."""
    bound = {"ge": 0} if zero else {"gt": 0}
    return declare(default, **bound, le=most, realistic=True,
                   least=None if integer else MIN_QUANTITY, **spec)


def _texts(text: str, where: str) -> tuple[str, ...]:
    return (text,)


@dataclass(frozen=True)
class LevelFile:
    """One entry of a cluster file's ``levels`` (``Level`` is what the model uses)."""

    size: int = _figure(integer=True, most=MAX_RANKS)
    bandwidth_gbs: float = _figure()
    latency_us: float = _figure(zero=True)
    name: str = ""
    links_per_rank: float = _figure(1.0)
    shared: bool = True
    source: str = ""


@dataclass(frozen=True)
class EmulateFile:
    """A cluster file's ``emulate:`` section (``ringtune emulate``, ringtune/emulate/spec.py,
    which says what each key does): checked with the rest of the file, so every reader
    refuses it alike."""

    hostname_prefix: str = declare("host", pattern=HOSTNAME_PATTERN,
                                   shape="lower-case letters, digits and '-' starting with "
                                         "a letter (at most 41)")
    oversubscribe: bool = False
    burst_kb: float = declare(0, ge=0, le=MAX_BURST_KB, why="KiB; 0: the default")
    mtu: int = declare(DEFAULT_MTU, ge=MTU_RANGE[0], le=MTU_RANGE[1],
                       why="bytes; 1500 is Ethernet's, 9000 jumbo frames")
    progress: str = declare("spin", choices=PROGRESS_MODES, why="how MPICH's ranks wait")


@dataclass(frozen=True)
class ClusterFile:
    """A cluster file's top level."""

    ranks: int = _figure(integer=True, most=MAX_RANKS, noun="ranks",
                         cap=f"the cost model takes at most {MAX_RANKS} (1,024 hosts of 8), "
                             "which keeps `ringtune simulate` within seconds")
    levels: tuple[LevelFile, ...] = declare(min_items=1, max_items=MAX_LEVELS, noun="levels",
                                            why="innermost first")
    memory_gbs: float = _figure()
    name: str | None = declare(None, null=False)
    description: str = ""
    ranks_per_host: int | None = _figure(None, integer=True, most=MAX_RANKS)
    overhead_us: float = _figure(DEFAULT_OVERHEAD_US, zero=True)
    sources: tuple[str, ...] | None = declare(None, text=_texts)
    notes: Any = None
    emulate: EmulateFile | None = None

    def host_levels(self) -> int | None:
        """How many innermost levels make one host (``ranks_per_host``, default the first
        level's size), or ``None`` when no group of whole levels is that size."""
        per_host = self.ranks_per_host if self.ranks_per_host is not None else \
            self.levels[0].size
        group = 1
        for i, lv in enumerate(self.levels):
            group *= lv.size
            if group == per_host:
                return i + 1
        return None

    def __check__(self, where: str) -> None:
        """The levels make the world and a host is whole levels (``safefiles.records`` runs it
        on loading)."""
        sizes = [lv.size for lv in self.levels]
        product = math.prod(sizes)
        if product != self.ranks:
            raise RecordError(key_path(where, "levels"),
                              f"sizes {' x '.join(map(str, sizes))} = {product} ranks, but "
                              f"ranks is {self.ranks}; make the product of levels[*].size "
                              "equal ranks")
        if self.host_levels() is None:
            prefixes = [math.prod(sizes[:i + 1]) for i in range(len(sizes))]
            per_host = self.ranks_per_host if self.ranks_per_host is not None else sizes[0]
            raise RecordError(key_path(where, "ranks_per_host"),
                              f"{per_host} is not the size of a group of innermost levels "
                              f"({', '.join(map(str, prefixes))}); a host must be whole "
                              "levels")


@dataclass(frozen=True)
class WorkloadFile:
    """A workload file (``Workload`` is what the model uses)."""

    gradient_bytes: int = _figure(integer=True, most=1 << 50)
    compute_seconds: float = _figure()
    name: str | None = declare(None, null=False)
    description: str = ""
    overlap: float = declare(0.0, ge=0, le=1, shape="a fraction 0..1")
    sources: tuple[str, ...] | None = declare(None, text=_texts)
    notes: Any = None
    #: Bytes of each gradient tensor, in the order backward produces them.
    tensor_bytes: tuple[int, ...] = declare(
        (), ge=1, shape="a list of positive integers (bytes of each gradient tensor)")

    def __check__(self, where: str) -> None:
        """The tensors make the gradient (``safefiles.records`` runs it on loading)."""
        tensors = self.tensor_bytes
        if tensors and sum(tensors) != self.gradient_bytes:
            raise RecordError(key_path(where, "tensor_bytes"),
                              f"the sizes sum to {sum(tensors)} B, but gradient_bytes is "
                              f"{self.gradient_bytes}; make them agree")


# -- JSON Schema -----------------------------------------------------------------------

#: The schemas' file names under ``profiles/schema/`` (``make schema`` writes them).
CLUSTER_SCHEMA_FILE = "cluster.schema.json"
WORKLOAD_SCHEMA_FILE = "workload.schema.json"
_BEYOND = ("a non-integer figure is 0 or at least 1e-6 (smaller is a typing error in the "
           "key's units), and YAML's 1.0 is a float where an integer is meant")


def cluster_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a cluster file, from ``ClusterFile``'s
    declarations: for editors and other tools; ``load_cluster`` is the authority and also
    checks what the description lists."""
    return schema_document(
        ClusterFile, file=CLUSTER_SCHEMA_FILE, title="ringtune cluster",
        description=(
            "A tiered cluster for `ringtune simulate --cluster` and `ringtune emulate "
            "--cluster` (profiles/clusters/, docs/cli.md), levels innermost first. "
            "Generated from the declared records in autotune/cluster.py by `python -m "
            "autotune.schemas` (make schema): do not edit by hand. load_cluster checks "
            "everything here and, in addition, what a schema cannot express: the product of "
            "levels[*].size is ranks; ranks_per_host (default levels[0].size) is the size of "
            f"a group of innermost levels; {_BEYOND}. `ringtune emulate` also needs one or "
            "two network levels and an uplink of at least 1 Mbit/s. A file is at most "
            f"{MAX_FILE_BYTES >> 20} MiB."))


def workload_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a workload file, from ``WorkloadFile``'s
    declarations; ``load_workload`` is the authority."""
    return schema_document(
        WorkloadFile, file=WORKLOAD_SCHEMA_FILE, title="ringtune workload",
        description=(
            "A training step for `ringtune simulate --workload` and `ringtune tune "
            "--workload` (profiles/clusters/workloads/). Generated from the declared records "
            "in autotune/cluster.py by `python -m autotune.schemas` (make schema): do not "
            "edit by hand. load_workload checks everything here and, in addition: "
            f"tensor_bytes sum to gradient_bytes; {_BEYOND}. A file is at most "
            f"{MAX_FILE_BYTES >> 20} MiB."))


# -- validation ------------------------------------------------------------------------


def _read_yaml(path: str, kind: str) -> Any:
    """The file's plain data through the one bounded reader (``safefiles.safeload``: size,
    alias and depth caps, duplicate keys, plain types, finite numbers); a profile or a
    topology file given by mistake is named as such."""
    from safefiles.safeload import check_kind, load_file

    data = load_file(path, kind, max_bytes=MAX_FILE_BYTES, as_json=False)
    check_kind(data, kind, path)
    return data


def _load(cls: type[_F], data: Any, where: str) -> _F:
    """``cls`` from plain data; ``ValueError`` ``where: key.path: message``."""
    try:
        return load(cls, data)
    except RecordError as exc:
        raise ValueError(f"{where}: {exc}") from None


_F = typing.TypeVar("_F")


def check_emulate(value: Any, where: str) -> dict[str, Any]:
    """The ``emulate:`` section with its defaults filled; ``ValueError`` naming the key
    (``where``: ``FILE: emulate``) for anything ``ringtune emulate`` could not use."""
    try:
        rec = load(EmulateFile, {} if value is None else value, where)
    except RecordError as exc:
        raise ValueError(str(exc)) from None
    return dataclasses.asdict(rec)


def cluster_from_dict(data: Any, where: str = "cluster") -> Cluster:
    """A validated ``Cluster`` from parsed YAML; ``where`` (the file name) prefixes errors."""
    rec = _load(ClusterFile, data, where)
    levels = [Level(name=lv.name or f"level{i}", size=lv.size, bandwidth_gbs=lv.bandwidth_gbs,
                    latency_us=lv.latency_us, links_per_rank=lv.links_per_rank,
                    shared=lv.shared, source=lv.source) for i, lv in enumerate(rec.levels)]
    host_levels = rec.host_levels()
    assert host_levels is not None  # ClusterFile.__check__ refused the file otherwise
    return Cluster(
        host_levels=host_levels,
        name=rec.name if rec.name is not None else where,
        levels=tuple(levels),
        memory_gbs=rec.memory_gbs,
        overhead_us=rec.overhead_us,
        description=rec.description,
        sources=rec.sources or (),
        emulate=dataclasses.asdict(rec.emulate or EmulateFile()),
    )


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    """Read and validate a cluster file; ``ValueError`` naming file and key otherwise."""
    name = os.fspath(path)
    return replace(cluster_from_dict(_read_yaml(name, "cluster"), name), path=name)


def workload_from_dict(data: Any, where: str = "workload") -> Workload:
    rec = _load(WorkloadFile, data, where)
    return Workload(
        tensor_bytes=rec.tensor_bytes,
        name=rec.name if rec.name is not None else where,
        gradient_bytes=rec.gradient_bytes,
        compute_seconds=rec.compute_seconds,
        overlap=rec.overlap,
        description=rec.description,
        sources=rec.sources or (),
    )


def load_workload(path: str | os.PathLike[str]) -> Workload:
    name = os.fspath(path)
    return workload_from_dict(_read_yaml(name, "workload"), name)
