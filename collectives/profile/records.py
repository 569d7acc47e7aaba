"""The profile file's records, declared once (docs/profile-format.md "How files are checked").

``safefiles.records`` checks a file against these (``collectives.profile.profile_from_dict``)
and ``collectives.profile.schema`` writes the JSON Schema from them; a check across a
record's fields is its ``__check__``; only what needs the registries (names, each
algorithm's checks of its params) is checked in ``profile_from_dict`` after. Not imported
by ``import collectives`` (the declarations import ``probes``): the loader imports it when
it first reads a profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probes.topology import fingerprint_field
from safefiles.records import RecordError, declare, key_path, optional_keys, required_keys

from .constants import (
    FORMAT,
    MAX_MEASURED,
    MAX_RULE_BYTES,
    MAX_RULES,
    MAX_SHAPES,
    MAX_WORLD_SIZE,
    PROFILE_DTYPES,
    PROFILE_OPS,
    SOURCES,
    VERSION,
)

_UNKNOWN = "new keys need a new profile version or go under 'extra'"
#: How ``shapes`` is declared (``ProfileRecord``, and ``Sections`` for ``shapes.check``).
_SHAPES: dict[str, Any] = {"max_items": MAX_SHAPES, "noun": "sections",
                           "why": "one per job shape"}


@dataclass(frozen=True)
class Section:
    """One entry of ``shapes``. Its ``topology`` and ``rules`` are checked as a whole
    profile (the top level's other keys with them: ``collectives.profile.shapes.merged``)."""

    topology: Any
    rules: Any
    source: str = declare("tuned", choices=SOURCES)
    from_world_size: int | None = declare(
        None, null=False, ge=1, le=MAX_WORLD_SIZE,
        why="the tuned world size this section was predicted from")


@dataclass(frozen=True)
class Sections:
    """``shapes`` alone (``collectives.profile.shapes.check``)."""

    shapes: tuple[Section, ...] = declare(**_SHAPES)


@dataclass(frozen=True)
class ToolRecord:
    __unknown_hint__ = _UNKNOWN
    name: str
    version: str | None = declare(None, null=False)


@dataclass(frozen=True)
class TopologyRecord:
    """``topology``: the shape the profile was tuned on."""

    __unknown_hint__ = _UNKNOWN
    fingerprint: str | None = fingerprint_field()
    world_size: int = declare(ge=1, le=MAX_WORLD_SIZE, required=True, default=1)
    hosts: int | None = declare(None, null=False, ge=1, le=MAX_WORLD_SIZE)
    ranks_per_host: int | None = declare(None, null=False, ge=1, le=MAX_WORLD_SIZE)
    summary: str | None = declare(None, null=False)

    def __check__(self, where: str) -> None:
        """``hosts`` and ``ranks_per_host`` at most the world size, and their product it."""
        ws = self.world_size
        for key in ("hosts", "ranks_per_host"):
            count = getattr(self, key)
            if count is not None and count > ws:
                raise RecordError(key_path(where, key),
                                  f"{count} is more than the world size {ws}")
        if self.hosts is not None and self.ranks_per_host is not None and \
                self.hosts * self.ranks_per_host != ws:
            raise RecordError(key_path(where, "ranks_per_host"),
                              f"{self.hosts} hosts x {self.ranks_per_host} ranks per host is "
                              f"not the world size {ws}; give the job's real shape (or leave "
                              "hosts and ranks_per_host out)")


@dataclass(frozen=True)
class MeasuredRecord:
    """A rule's ``measured`` figures (what ``ringtune show`` prints)."""

    __unknown_hint__ = _UNKNOWN
    bytes: int | None = declare(None, ge=0, le=MAX_RULE_BYTES)
    busbw_gbps: float | None = declare(None, ge=0, le=MAX_MEASURED)
    time_us: float | None = declare(None, ge=0, le=MAX_MEASURED)
    native_busbw_gbps: float | None = declare(None, ge=0, le=MAX_MEASURED)
    native_time_us: float | None = declare(None, ge=0, le=MAX_MEASURED)
    algbw_gbps: float | None = declare(None, ge=0, le=MAX_MEASURED)
    speedup: float | None = declare(None, ge=0, le=MAX_MEASURED)
    #: The A/B's spread (max - min over the median of the chosen's or the runner-up's
    #: rounds) exceeded the difference the choice rests on (``autotune.choose.ab_stability``):
    #: written only when true; ``ringtune show`` marks the rule with ``!``.
    unstable: bool | None = declare(None, null=False)
    ab_spread: float | None = declare(None, null=False, ge=0, le=MAX_MEASURED)


@dataclass(frozen=True)
class NativeRecord:
    """One entry of a rule's ``native`` list: the best of the library's own algorithms
    measured in one bucket of the rule (what ``ringtune export`` writes for the rule)."""

    __unknown_hint__ = _UNKNOWN
    bytes: int
    impl: str = declare(min_len=1, shape="an algorithm name")
    busbw_gbps: float = declare()
    time_us: float = declare()
    #: The library's allreduce composition of that measurement (``native composition=``),
    #: where it was not the library's own choice: a name some registered library's module
    #: offers (``collectives.natives.all_compositions``; checked by the loader).
    composition: str | None = declare(None, null=False, names="composition")


@dataclass(frozen=True)
class RuleRecord:
    """One rule as a file holds it (``Rule`` is what the runtime follows)."""

    __unknown_hint__ = _UNKNOWN
    min_bytes: int = declare(ge=0, le=MAX_RULE_BYTES)
    max_bytes: int | None = declare(ge=0, le=MAX_RULE_BYTES)
    algorithm: str = declare(names="algorithm")
    params: Mapping[str, Any] = declare(default_factory=dict)
    transport: str | None = declare(None, null=False, names="transport")
    measured: MeasuredRecord | None = None
    native: tuple[NativeRecord, ...] | None = None

    def __check__(self, where: str) -> None:
        """A rule covers ``min_bytes..max_bytes``: not an empty range."""
        if self.max_bytes is not None and self.max_bytes < self.min_bytes:
            raise RecordError(key_path(where, "max_bytes"),
                              f"{self.max_bytes} is below min_bytes {self.min_bytes}; a rule "
                              "covers min_bytes..max_bytes")


@dataclass(frozen=True)
class LibraryRecord:
    """``library``: the communication library the profile was tuned with (and NCCL's
    version, for GPU profiles)."""

    __unknown_hint__ = _UNKNOWN
    #: The MPI library as it names itself; any name loads (a library without a module of
    #: its own runs ``native impl=auto`` only); the schema says which have one.
    name: str = declare(names="library")
    version: str = declare()
    nccl: str | None = declare(None, null=False)


@dataclass(frozen=True)
class EngineRecord:
    """``engine``: the distributed engine the profile was tuned over and its backend (the
    MPI library, or the process group's: ``gloo``, ``cpu:gloo,cuda:nccl``) and version; a
    profile without it was tuned over MPI."""

    __unknown_hint__ = _UNKNOWN
    __schema_doc__ = ("the distributed engine the profile was tuned over (absent: mpi) and "
                      "its backend and version")
    #: One of the engine registry's names (``collectives.engines.engine_names``; checked
    #: by the loader: a plug-in may add one).
    name: str = declare(names="engine")
    backend: str | None = declare(None, null=False)
    version: str | None = declare(None, null=False)


@dataclass(frozen=True)
class FusionRecord:
    """``fusion``: allreduce_many's tuned bucket size (collectives/training/fusion.py)."""

    __unknown_hint__ = _UNKNOWN
    __schema_doc__ = "allreduce_many's fused bucket size, searched by ringtune tune --workload"
    bucket_bytes: int = declare(ge=1)
    measured: Mapping[str, Any] | None = declare(None, null=False)


@dataclass(frozen=True)
class ProfileRecord:
    """A profile file's top level. Keys not declared here are refused: new keys need a
    version bump, or go under ``extra``."""

    __unknown_hint__ = _UNKNOWN
    format: str = declare(choices=(FORMAT,), why="not a ringtune profile")
    version: int = declare(choices=(VERSION,), why=f"this ringtune reads profile version "
                           f"{VERSION} only; re-tune or upgrade ringtune")
    topology: TopologyRecord = declare()
    backend: str = declare(names="backend")
    transport: str = declare(names="transport")
    rules: tuple[RuleRecord, ...] = declare(
        min_items=1, max_items=MAX_RULES, noun="rules",
        why="a profile has one rule per size range where the best algorithm changes "
            "(merge ranges that run the same algorithm); one with min_bytes: 0, max_bytes: "
            "null covers every size")
    created: str | None = declare(None, null=False)
    tool: ToolRecord | None = declare(None, null=False)
    dtype: str = declare("float32", choices=PROFILE_DTYPES)
    op: str = declare("sum", choices=PROFILE_OPS)
    tuning: Mapping[str, Any] | None = declare(None, null=False)
    extra: Mapping[str, Any] | None = None
    library: LibraryRecord | None = declare(None, null=False)
    shapes: tuple[Section, ...] | None = declare(None, null=False, **_SHAPES)
    fusion: FusionRecord | None = declare(None, null=False)
    engine: EngineRecord | None = declare(None, null=False)

    def __check__(self, where: str) -> None:
        """The rules cover every size once: sorted and contiguous from 0, only the last one
        open-ended (``max_bytes: null``)."""
        prev_max: int | None = -1
        for i, rule in enumerate(self.rules):
            at, lo = key_path(where, f"rules[{i}]"), rule.min_bytes
            if i == 0 and lo != 0:
                raise RecordError(f"{at}.min_bytes", f"the first rule must start at 0, got "
                                  f"{lo}: sizes 0..{lo - 1} would have no rule")
            if i > 0:
                if prev_max is None:
                    raise RecordError(key_path(where, f"rules[{i - 1}].max_bytes"),
                                      "null (no upper end) is only allowed in the last rule: "
                                      "the rules after it could never be selected")
                if lo <= prev_max:
                    raise RecordError(f"{at}.min_bytes", f"{lo} overlaps rules[{i - 1}] "
                                      f"(which ends at {prev_max}); rules must be sorted and "
                                      "non-overlapping")
                if lo != prev_max + 1:
                    raise RecordError(f"{at}.min_bytes", f"{lo} leaves a gap after "
                                      f"rules[{i - 1}] (which ends at {prev_max}): sizes "
                                      f"{prev_max + 1}..{lo - 1} would have no rule; start "
                                      f"at {prev_max + 1}")
            prev_max = rule.max_bytes
        if prev_max is not None:
            raise RecordError(key_path(where, f"rules[{len(self.rules) - 1}].max_bytes"),
                              f"the last rule must have max_bytes: null (no upper end), got "
                              f"{prev_max}: larger messages would have no rule")


#: The keys of each record, in declaration order (what ``ringtune validate`` names).
REQUIRED_KEYS = required_keys(ProfileRecord)
OPTIONAL_KEYS = optional_keys(ProfileRecord)
TOPOLOGY_KEYS = required_keys(TopologyRecord) + optional_keys(TopologyRecord)
RULE_REQUIRED_KEYS = required_keys(RuleRecord)
RULE_OPTIONAL_KEYS = optional_keys(RuleRecord)
NATIVE_KEYS = required_keys(NativeRecord)
NATIVE_OPTIONAL_KEYS = optional_keys(NativeRecord)
LIBRARY_KEYS = required_keys(LibraryRecord)
LIBRARY_OPTIONAL_KEYS = optional_keys(LibraryRecord)
MEASURED_KEYS = optional_keys(MeasuredRecord)
SECTION_KEYS = required_keys(Section) + optional_keys(Section)
#: The lists above by name (``collectives.profile`` hands them out).
KEY_LISTS = {"REQUIRED_KEYS": REQUIRED_KEYS, "OPTIONAL_KEYS": OPTIONAL_KEYS,
             "TOPOLOGY_KEYS": TOPOLOGY_KEYS, "RULE_REQUIRED_KEYS": RULE_REQUIRED_KEYS,
             "RULE_OPTIONAL_KEYS": RULE_OPTIONAL_KEYS, "NATIVE_KEYS": NATIVE_KEYS,
             "NATIVE_OPTIONAL_KEYS": NATIVE_OPTIONAL_KEYS, "LIBRARY_KEYS": LIBRARY_KEYS,
             "LIBRARY_OPTIONAL_KEYS": LIBRARY_OPTIONAL_KEYS, "MEASURED_KEYS": MEASURED_KEYS}
