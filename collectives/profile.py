"""Profiles: the tuned rules (message-size range → algorithm + params) the runtime follows.

Use ``load_profile(path, world_size)`` to read a profile file (everything is validated; the
first problem raises ``ProfileError`` naming the file and the key path),
``Profile.select(nbytes)`` to find the rule for a message size (O(log rules)), and
``write_profile(profile_or_dict, path)`` to write one atomically. ``builtin_profile`` is the
heuristic used when no profile is given. The format is docs/design.md "Profile format"; the JSON
Schema in ``profiles/schema/`` describes the same shape for editors and CI.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .atomic import write_text_atomic
from .errors import ProfileError
from .shapes import MAX_WORLD_SIZE

FORMAT = "ringtune-profile"
VERSION = 1

PROFILE_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
PROFILE_OPS = ("sum", "prod", "min", "max", "avg")

#: Top-level keys: required ones, then optional ones. Anything else is an error (new keys
#: need a version bump, or go under ``extra``).
REQUIRED_KEYS = ("format", "version", "topology", "backend", "transport", "rules")
OPTIONAL_KEYS = ("created", "tool", "dtype", "op", "tuning", "extra", "library", "shapes",
                 "fusion", "engine")
TOPOLOGY_KEYS = ("fingerprint", "world_size", "hosts", "ranks_per_host", "summary")
RULE_REQUIRED_KEYS = ("min_bytes", "max_bytes", "algorithm")
RULE_OPTIONAL_KEYS = ("params", "transport", "measured", "native")
#: Keys of one entry of a rule's ``native`` list: the best of the library's own algorithms
#: measured in one bucket of the rule (what ``ringtune export`` writes for the rule).
NATIVE_KEYS = ("bytes", "impl", "busbw_gbps", "time_us")
#: ``composition``: MPICH's allreduce composition of that measurement (``native
#: composition=``), where it was not the library's own choice.
NATIVE_OPTIONAL_KEYS = ("composition",)
#: ``library``: the communication library the profile was tuned with (and NCCL's version,
#: for GPU profiles).
LIBRARY_KEYS = ("name", "version")
LIBRARY_OPTIONAL_KEYS = ("nccl",)
#: ``engine``: the distributed engine the profile was tuned over (``collectives.engines``)
#: and its backend (the MPI library, or the process group's: ``gloo``,
#: ``cpu:gloo,cuda:nccl``) and version; a profile without it was tuned over MPI. Its
#: ``name`` is one of the engine registry's (``collectives.engines.engine_names``).
ENGINE_KEYS = ("name",)
ENGINE_OPTIONAL_KEYS = ("backend", "version")
MEASURED_KEYS = ("bytes", "busbw_gbps", "time_us", "native_busbw_gbps", "native_time_us",
                 "algbw_gbps", "speedup")
FINGERPRINT_RE = re.compile(r"sha256:[0-9a-f]{64}")
#: Range bounds: a world of 4 M ranks and messages of 4 EiB are beyond any machine; larger
#: values are typing errors that would overflow later (in plans, in NumPy sizes).
MAX_RULE_BYTES = 1 << 62
#: Size caps of a profile, checked before anything in it is converted: a tuned profile has
#: a handful of rules (one per size range where the winner changes), so these leave room
#: for hand-made tables and keep loading and refusing well under a second.
MAX_PROFILE_BYTES = 1 << 20
MAX_RULES = 1024
#: Largest figure under ``measured`` (GB/s, µs, ratios): finite and readable back.
MAX_MEASURED = 1e18
#: What ``tuning`` and ``extra`` may hold: the plain YAML/JSON types (a set would make the
#: profile's hash depend on the interpreter's hash seed).
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_PLAIN_DEPTH = 32

#: Key order of written files (people read them).
_KEY_ORDER = ("format", "version", "created", "tool", "library", "engine", "topology",
              "backend", "transport", "dtype", "op", "rules", "fusion", "tuning", "extra")


@dataclass(frozen=True)
class Rule:
    """One size range of a profile; ``max_bytes`` ``None`` means no upper end."""

    min_bytes: int
    max_bytes: int | None
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    transport: str | None = None
    measured: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "algorithm": self.algorithm,
            "params": _plain(dict(self.params)),
        }
        if self.transport:
            out["transport"] = self.transport
        if self.measured:
            out["measured"] = _plain(dict(self.measured))
        return out


@dataclass(frozen=True)
class Profile:
    """A validated profile (see docs/design.md "Profile format")."""

    rules: tuple[Rule, ...]
    backend: str = "numpy"
    transport: str = "mpi"
    dtype: str = "float32"
    op: str = "sum"
    fingerprint: str | None = None
    world_size: int | None = None
    path: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)
    builtin: bool = False
    #: Which section of a several-shape profile this is (``collectives.shapes``), or "".
    section: str = ""
    #: SHA-256 of the file's bytes when it was read from one (``load_profile``), else
    #: ``None``. Equal bytes hold equal content, so ranks that read the same file agree on
    #: this digest and compute the content hash (``sha256``)
    #: only when their files differ byte for byte (``Communicator`` construction).
    source_digest: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", [r.min_bytes for r in self.rules])

    def select(self, nbytes: int) -> tuple[int, Rule]:
        """The rule (index, rule) whose range holds ``nbytes``: O(log rules)."""
        i = bisect.bisect_right(self._starts, nbytes) - 1  # type: ignore[attr-defined]
        return max(i, 0), self.rules[max(i, 0)]

    @property
    def sha256(self) -> str:
        """Hash of the profile's content, what ranks compare at construction: SHA-256 of
        its data (``raw``: every key, the rules as read) as compact JSON with the keys
        sorted, so equal for equal content whatever the file's key order, layout,
        comments or quoting, and different when any value, key or type differs."""
        data = json.dumps(self.raw or {"builtin": [r.__dict__ for r in self.rules]},
                          sort_keys=True, default=str, separators=(",", ":"),
                          check_circular=False)
        return hashlib.sha256(data.encode()).hexdigest()

    @property
    def topology(self) -> Mapping[str, Any]:
        """The profile's ``topology`` record (empty for built-in defaults)."""
        topo = self.raw.get("topology") if self.raw else None
        return topo if isinstance(topo, Mapping) else {}

    @property
    def engine(self) -> Mapping[str, Any]:
        """The ``engine`` record: ``{"name": "mpi"|"torch", "backend": …}`` (``{"name":
        "mpi"}`` for a profile written before engines were recorded)."""
        rec = self.raw.get("engine") if self.raw else None
        return rec if isinstance(rec, Mapping) else {"name": "mpi"}

    @property
    def tuning(self) -> Mapping[str, Any]:
        tun = self.raw.get("tuning") if self.raw else None
        return tun if isinstance(tun, Mapping) else {}

    @property
    def fusion_bucket_bytes(self) -> int | None:
        """The tuned bucket size of ``allreduce_many`` (``fusion.bucket_bytes``), if any."""
        fus = self.raw.get("fusion") if self.raw else None
        return fus.get("bucket_bytes") if isinstance(fus, Mapping) else None

    def to_dict(self) -> dict[str, Any]:
        """The profile as the plain mapping that is written to YAML."""
        out: dict[str, Any] = dict(self.raw) if self.raw else {
            "format": FORMAT, "version": VERSION,
            "topology": {"world_size": self.world_size or 1},
        }
        if self.fingerprint and isinstance(out.get("topology"), Mapping):
            out["topology"] = dict(out["topology"], fingerprint=self.fingerprint)
        out.update(backend=self.backend, transport=self.transport, dtype=self.dtype,
                   op=self.op, rules=[r.to_dict() for r in self.rules])
        return _ordered(out)


def builtin_profile(world_size: int) -> Profile:
    """The heuristic used without a profile: the library's own allreduce below 32 MiB, where
    its C collectives are at least as fast as ours (latency-bound small messages; MPI's
    reduce-scatter/all-gather up to 16 MiB), and two concurrent whole-segment rings from
    32 MiB, where MPICH falls off (3.3x at 64 MiB; the quiet tuning runs in BENCHMARKS.md
    chose the same split). A tuned profile replaces this with the machine's own rules."""
    rules = (
        Rule(0, (32 << 20) - 1, "native", {}),
        Rule(32 << 20, None, "multiring", {"rings": 2, "chunk_bytes": 0, "order": "topology"}),
    )
    return Profile(rules=rules, world_size=world_size, builtin=True)


# -- loading -------------------------------------------------------------------------------


def load_profile(path: str | os.PathLike[str], world_size: int | None = None,
                 section_for: int | None = None) -> Profile:
    """Read and validate a profile file; ``ProfileError`` naming file and key otherwise.

    ``world_size``: the size of the world that will use it; a profile tuned for another
    world size is rejected (its rules and ring orders were measured for that size).
    ``section_for``: pick the section for that world size when the profile has one
    (``shapes``), without rejecting another size (the runtime's warn-and-fall-back).
    """
    # One bounded reader for every file (probes.safeload): size, alias/node and depth caps,
    # duplicate keys, plain types and finite numbers are checked while parsing.
    from probes.safeload import InputError, check_kind, parse_text, read_bounded

    name = os.fspath(path)
    try:
        text = read_bounded(name, "profile", max_bytes=MAX_PROFILE_BYTES,
                            missing="no such profile file; check the path, or create one "
                                    "with `ringtune tune --out FILE`")
        data = parse_text(text, name)
        check_kind(data, "profile", name)
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    prof = profile_from_dict(data, name, world_size=world_size, section_for=section_for,
                             copy=False)
    # A section of a several-shape file: the section is part of what ranks agree on.
    return replace(prof, source_digest=f"{digest}:{prof.section}")


def profile_from_dict(data: Any, name: str = "<profile>",
                      world_size: int | None = None,
                      section_for: int | None = None, copy: bool = True) -> Profile:
    """Validate a profile mapping (as parsed from YAML) and build the ``Profile``.

    Errors read ``NAME: KEY.PATH: what is wrong, got VALUE``. ``copy=False``: ``data`` is
    fresh plain data from ``probes.safeload`` that nothing else holds; it becomes the
    profile's ``raw`` as it is (copying a 10⁵-rule profile cost seconds, and copying an
    aliased tree expands it).
    """
    from .shapes import pick

    data, section = pick(data, world_size if world_size is not None else section_for, name,
                         profile_from_dict)
    v = _Validator(name)
    if data is None:
        v.fail("", "the file is empty; expected a ringtune profile (format: ringtune-profile)")
    if not isinstance(data, Mapping):
        v.fail("", f"expected a mapping of profile keys at the top level, got "
                   f"{type(data).__name__}")
    if copy:
        for key in ("tuning", "extra"):
            if key in data:
                _check_plain(v, data[key], key)
    v.keys(data, "", REQUIRED_KEYS, OPTIONAL_KEYS)
    if data["format"] != FORMAT:
        v.fail("format", f"expected {FORMAT!r}, got {data['format']!r}: not a ringtune "
                         "profile")
    version = data["version"]
    if type(version) is not int or version != VERSION:
        v.fail("version", f"expected {VERSION}, got {version!r}: this ringtune reads profile "
                          f"version {VERSION} only; re-tune or upgrade ringtune")
    if "created" in data:
        v.string(data["created"], "created")
    if "tool" in data:
        tool = v.mapping(data["tool"], "tool")
        v.keys(tool, "tool", ("name",), ("version",))
        v.string(tool["name"], "tool.name")
        if "version" in tool:
            v.string(tool["version"], "tool.version")
    topo = v.mapping(data["topology"], "topology")
    v.keys(topo, "topology", ("world_size",), tuple(k for k in TOPOLOGY_KEYS
                                                    if k != "world_size"))
    ws = v.integer(topo["world_size"], "topology.world_size", 1, MAX_WORLD_SIZE)
    fingerprint = None
    if "fingerprint" in topo and topo["fingerprint"] is not None:
        fp = topo["fingerprint"]
        if not isinstance(fp, str) or not FINGERPRINT_RE.fullmatch(fp):
            v.fail("topology.fingerprint", f"expected 'sha256:' and 64 lower-case hex digits, "
                                           f"got {fp!r}")
        fingerprint = fp
    for key in ("hosts", "ranks_per_host"):
        if key in topo:
            v.integer(topo[key], f"topology.{key}", 1, ws)
    if "hosts" in topo and "ranks_per_host" in topo and \
            topo["hosts"] * topo["ranks_per_host"] != ws:
        v.fail("topology.ranks_per_host", f"{topo['hosts']} hosts x {topo['ranks_per_host']} "
               f"ranks per host is not the world size {ws}; give the job's real shape (or "
               "leave hosts and ranks_per_host out)")
    if "summary" in topo:
        v.string(topo["summary"], "topology.summary")
    if world_size is None and "shapes" in data:
        from .shapes import check

        check(data, name, profile_from_dict)
    if world_size is not None and ws != world_size:
        v.fail("topology.world_size",
               f"profile was tuned for {ws} ranks, this world has {world_size}; tune this "
               f"world size with `ringtune tune -np {world_size}` or run with {ws} ranks")
    from .registry import backend_names, transport_names

    backend = v.choice(data["backend"], "backend", backend_names())
    transport = v.choice(data["transport"], "transport", transport_names())
    _check_transport(v, transport, backend, "transport")
    dtype = v.choice(data.get("dtype", "float32"), "dtype", PROFILE_DTYPES)
    op = v.choice(data.get("op", "sum"), "op", PROFILE_OPS)
    lib = data.get("library")
    from .natives import tuned_with

    # A profile tuned with another MPI library names that library's algorithms (impl).
    with tuned_with(lib.get("name") if isinstance(lib, dict) else None):
        rules = _rules(v, data["rules"], ws, backend)
    if "library" in data:
        _library(v, data["library"])
    if "engine" in data:
        _engine(v, data["engine"])
    if "tuning" in data:
        v.mapping(data["tuning"], "tuning")
    if "fusion" in data:
        # allreduce_many's tuned bucket size (collectives/fusion.py); optional.
        fusion = v.mapping(data["fusion"], "fusion")
        v.keys(fusion, "fusion", ("bucket_bytes",), ("measured",))
        v.integer(fusion["bucket_bytes"], "fusion.bucket_bytes", 1, None)
        if "measured" in fusion:
            v.mapping(fusion["measured"], "fusion.measured")
    if "extra" in data and data["extra"] is not None:
        v.mapping(data["extra"], "extra")
    return Profile(rules=rules, backend=backend, transport=transport, dtype=dtype, op=op,
                   fingerprint=fingerprint, world_size=ws, path=name,
                   raw=_plain(dict(data)) if copy else data, builtin=False,
                   section=section)


def _rules(v: _Validator, value: Any, world_size: int, backend: str) -> tuple[Rule, ...]:
    """The rules of a profile, each checked as the runtime will use it: sorted, contiguous
    ranges, a registered algorithm whose own checks pass its params for this world size, and
    a transport that moves this profile's buffers."""
    from .algorithms import algorithm_names, get_algorithm
    from .registry import transport_names

    if not isinstance(value, list):
        v.fail("rules", f"expected a list of rules, got {_show(value)}")
    if not value:
        v.fail("rules", "expected at least one rule (min_bytes: 0, max_bytes: null covers "
                        "every size)")
    # Before any rule is looked at: the cost of what follows is bounded by the count.
    if len(value) > MAX_RULES:
        v.fail("rules", f"{len(value)} rules; at most {MAX_RULES} (a tuned profile has one "
                        "per size range where the best algorithm changes); merge ranges "
                        "that run the same algorithm")
    names = algorithm_names()
    out: list[Rule] = []
    prev_max: int | None = -1
    for i, item in enumerate(value):
        where = f"rules[{i}]"
        rule = v.mapping(item, where)
        v.keys(rule, where, RULE_REQUIRED_KEYS, RULE_OPTIONAL_KEYS)
        lo = v.integer(rule["min_bytes"], f"{where}.min_bytes", 0, MAX_RULE_BYTES)
        hi_raw = rule["max_bytes"]
        hi = None if hi_raw is None else v.integer(hi_raw, f"{where}.max_bytes", lo,
                                                   MAX_RULE_BYTES)
        if i == 0 and lo != 0:
            v.fail(f"{where}.min_bytes", f"the first rule must start at 0, got {lo}: sizes "
                                         f"0..{lo - 1} would have no rule")
        if i > 0:
            if prev_max is None:
                v.fail(f"rules[{i - 1}].max_bytes", "null (no upper end) is only allowed in "
                       "the last rule: the rules after it could never be selected")
            elif lo <= prev_max:
                v.fail(f"{where}.min_bytes", f"{lo} overlaps rules[{i - 1}] (which ends at "
                       f"{prev_max}); rules must be sorted and non-overlapping")
            elif lo != prev_max + 1:
                v.fail(f"{where}.min_bytes", f"{lo} leaves a gap after rules[{i - 1}] (which "
                       f"ends at {prev_max}): sizes {prev_max + 1}..{lo - 1} would have no "
                       f"rule; start at {prev_max + 1}")
        prev_max = hi
        algo = rule["algorithm"]
        if not isinstance(algo, str) or algo not in names:
            v.fail(f"{where}.algorithm", f"unknown algorithm {_show(algo)}: use one of "
                                         f"{', '.join(names)}")
        # ``params`` absent means none; when present it is a mapping (not null, not a list).
        params = dict(v.mapping(rule["params"], f"{where}.params")) if "params" in rule \
            else {}
        rtrans = rule.get("transport")
        if "transport" in params:
            # A rule may name its transport inside params too (docs/design.md); one place only.
            if rtrans is not None and rtrans != params["transport"]:
                v.fail(f"{where}.params.transport", f"{_show(params['transport'])} "
                       f"contradicts {where}.transport {_show(rtrans)}; give the transport "
                       "once")
            rtrans = params.pop("transport")
            tkey = f"{where}.params.transport"
        else:
            tkey = f"{where}.transport"
        if rtrans is not None or "transport" in rule:
            rtrans = v.choice(rtrans, tkey, transport_names())
            _check_transport(v, rtrans, backend, tkey)
        try:
            get_algorithm(algo).check_params(params, world_size)
        except ValueError as exc:
            msg = str(exc)
            head = msg.split(":", 1)[0]
            if head in params or head.split("[", 1)[0] in params:
                v.fail(f"{where}.params.{head}", msg.split(":", 1)[1].strip())
            v.fail(f"{where}.params", msg)
        measured = None
        if "measured" in rule and rule["measured"] is not None:
            m = v.mapping(rule["measured"], f"{where}.measured")
            for key, val in m.items():
                if key not in MEASURED_KEYS:
                    v.fail(f"{where}.measured.{key}", f"unknown key; expected some of "
                           f"{', '.join(MEASURED_KEYS)}")
                if key == "bytes" and val is not None:
                    v.integer(val, f"{where}.measured.bytes", 0, MAX_RULE_BYTES)
                elif val is not None and (isinstance(val, bool) or not isinstance(
                        val, (int, float)) or not 0 <= val <= MAX_MEASURED):
                    v.fail(f"{where}.measured.{key}", f"expected a number ≥ 0, got {val!r}")
            measured = dict(m)
        if "native" in rule and rule["native"] is not None:
            _native_entries(v, rule["native"], f"{where}.native")
        # Keep the params as written (defaults are filled at plan time), but validated.
        out.append(Rule(lo, hi, algo, params, rtrans, measured))
    if prev_max is not None:
        v.fail(f"rules[{len(value) - 1}].max_bytes", f"the last rule must have max_bytes: "
               f"null (no upper end), got {prev_max}: larger messages would have no rule")
    return tuple(out)


def _check_transport(v: _Validator, transport: str, backend: str, key: str) -> None:
    """Refuse a transport that cannot move this profile's buffers (``backend: numpy`` with a
    GPU transport): the registry says which buffers each transport moves."""
    from .registry import transport_refusal

    refusal = transport_refusal(transport, backend)
    if refusal is not None:
        v.fail(key, f"{refusal} (this profile's backend is {backend}); change {key} or "
                    "backend")


def _library(v: _Validator, value: Any) -> None:
    lib = v.mapping(value, "library")
    v.keys(lib, "library", LIBRARY_KEYS, LIBRARY_OPTIONAL_KEYS)
    v.string(lib["name"], "library.name")
    v.string(lib["version"], "library.version")
    if "nccl" in lib:
        v.string(lib["nccl"], "library.nccl")


def _engine(v: _Validator, value: Any) -> None:
    rec = v.mapping(value, "engine")
    v.keys(rec, "engine", ENGINE_KEYS, ENGINE_OPTIONAL_KEYS)
    from .engines import engine_names

    v.choice(rec["name"], "engine.name", engine_names())
    for key in ENGINE_OPTIONAL_KEYS:
        if key in rec:
            v.string(rec[key], f"engine.{key}")


def _native_entries(v: _Validator, value: Any, where: str) -> None:
    if not isinstance(value, list):
        v.fail(where, f"expected a list of measured native algorithms, got {_show(value)}")
    for j, item in enumerate(value):
        key = f"{where}[{j}]"
        entry = v.mapping(item, key)
        v.keys(entry, key, NATIVE_KEYS, NATIVE_OPTIONAL_KEYS)
        v.integer(entry["bytes"], f"{key}.bytes", 0, None)
        if not isinstance(entry["impl"], str) or not entry["impl"]:
            v.fail(f"{key}.impl", f"expected an algorithm name, got {_show(entry['impl'])}")
        if "composition" in entry:
            from .algorithms.native import COMPOSITIONS

            if entry["composition"] not in COMPOSITIONS:
                v.fail(f"{key}.composition", f"expected one of {', '.join(COMPOSITIONS)} "
                       f"(MPICH's allreduce composition), got {_show(entry['composition'])}")
        for num in ("busbw_gbps", "time_us"):
            val = entry[num]
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(
                    val) or val < 0:
                v.fail(f"{key}.{num}", f"expected a number ≥ 0, got {val!r}")


class _Validator:
    """Raises ``ProfileError`` as ``file: key.path: message``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def fail(self, key: str, message: str) -> Any:
        raise ProfileError(f"{self.name}: {key}: {message}" if key
                           else f"{self.name}: {message}")

    def keys(self, data: Mapping[str, Any], where: str, required: Sequence[str],
             optional: Sequence[str]) -> None:
        prefix = f"{where}." if where else ""
        for key in data:
            if key not in required and key not in optional:
                allowed = ", ".join([*required, *optional])
                self.fail(f"{prefix}{key}", f"unknown key (allowed here: {allowed}); new keys "
                          "need a new profile version or go under 'extra'")
        for key in required:
            if key not in data:
                self.fail(f"{prefix}{key}", "missing (required)")

    def mapping(self, value: Any, key: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(key, f"expected a mapping, got {_show(value)}")
        for k in value:
            if not isinstance(k, str):
                self.fail(key, f"keys must be strings, got {k!r}")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a string, got {_show(value)}")
        return value

    def integer(self, value: Any, key: str, lo: int, hi: int | None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (
                hi is not None and value > hi):
            rng = f"{lo}..{hi}" if hi is not None else f"≥ {lo}"
            self.fail(key, f"expected an integer {rng}, got {_show(value)}")
        return value

    def choice(self, value: Any, key: str, choices: Sequence[str]) -> str:
        if value not in choices or not isinstance(value, str):
            self.fail(key, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value


def _show(value: Any) -> str:
    if isinstance(value, (Mapping, list)):
        return type(value).__name__
    return repr(value)


def _check_plain(v: _Validator, value: Any, key: str) -> None:
    """Refuse anything in ``value`` that is not plain YAML/JSON data (text keys, finite
    numbers, no sets, bytes or objects); iterative, so a deep value cannot recurse."""
    todo: list[tuple[Any, str, int]] = [(value, key, 0)]
    while todo:
        item, where, depth = todo.pop()
        if isinstance(item, Mapping):
            children: list[tuple[Any, str]] = []
            for k, x in item.items():
                if not isinstance(k, str):
                    v.fail(where, f"keys must be text, got {k!r}")
                children.append((x, f"{where}.{k}"))
        elif isinstance(item, (list, tuple)):
            children = [(x, f"{where}[{i}]") for i, x in enumerate(item)]
        else:
            if hasattr(item, "item") and not isinstance(item, _PLAIN_SCALARS):
                item = item.item()  # a NumPy scalar from the tuner
            if not isinstance(item, _PLAIN_SCALARS):
                v.fail(where, f"{type(item).__name__} is not plain data (text, numbers, "
                              "true/false, null, lists, mappings)")
            if isinstance(item, float) and not math.isfinite(item):
                v.fail(where, f"expected a finite number, got {item!r}")
            if isinstance(item, int) and not -(1 << 63) <= item < (1 << 64):
                v.fail(where, f"integer {item} does not fit 64 bits (the file could not be "
                              "read back)")
            continue
        if depth >= _PLAIN_DEPTH:
            v.fail(where, f"nested more than {_PLAIN_DEPTH} levels deep")
        todo.extend((x, w, depth + 1) for x, w in children)


def _plain(obj: Any) -> Any:
    """Plain YAML/JSON types (tuples → lists, numpy scalars → Python numbers)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(x) for x in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def _ordered(data: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: data[k] for k in _KEY_ORDER if k in data}
    out.update((k, v) for k, v in data.items() if k not in out)
    return out


# -- writing -------------------------------------------------------------------------------


def dump_profile(profile_or_dict: Profile | Mapping[str, Any]) -> str:
    """The profile as YAML text (validated first: a bad profile is never written)."""
    import yaml

    data = (profile_or_dict.to_dict() if isinstance(profile_or_dict, Profile)
            else _ordered(_plain(dict(profile_or_dict))))
    profile_from_dict(data, "<profile being written>")
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=99,
                          allow_unicode=True)


def write_profile(profile_or_dict: Profile | Mapping[str, Any],
                  path: str | os.PathLike[str]) -> str:
    """Validate and write a profile atomically (temporary file in the same folder, fsync,
    rename): an interrupted write never leaves a half profile. Returns the path.

    ``ProfileError`` naming the path when the folder cannot be written.
    """
    name = os.fspath(path)
    text = dump_profile(profile_or_dict)
    folder = os.path.dirname(os.path.abspath(name))
    check_writable(name)
    try:
        return write_text_atomic(name, text)
    except OSError as exc:
        raise ProfileError(f"{name}: cannot write profile: {exc.strerror or exc} (folder "
                           f"{folder}); choose a writable --out") from None


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail early (``ProfileError``) when ``path`` could not be written later: used by
    ``ringtune tune`` before spending minutes on a search."""
    name = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(name))
    if os.path.isdir(name):
        raise ProfileError(f"{name}: is a directory; give a profile file name such as "
                           f"{os.path.join(name, 'local.yaml')}")
    if not os.path.isdir(folder):
        raise ProfileError(f"{name}: cannot write profile: folder {folder} does not exist; "
                           "create it or choose another --out")
    if not os.access(folder, os.W_OK | os.X_OK) or (
            os.path.exists(name) and not os.access(name, os.W_OK)):
        raise ProfileError(f"{name}: cannot write profile: permission denied (folder "
                           f"{folder}); choose a writable --out")
