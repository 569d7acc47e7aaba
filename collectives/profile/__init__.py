"""Profiles: the tuned rules (message-size range → algorithm + params) the runtime follows.

Use ``load_profile(path, world_size)`` to read a profile file (everything is validated; the
first problem raises ``ProfileError`` naming the file and the key path),
``Profile.select(nbytes)`` to find the rule for a message size (O(log rules)), and
``write_profile(profile_or_dict, path)`` to write one atomically. ``builtin_profile`` is the
heuristic used when no profile is given. The format is docs/design.md "Profile format"; the JSON
Schema in ``profiles/schema/`` describes the same shape for editors and CI.

The package holds the profile file and everything about its format: this module (loading,
checking, rule selection, writing), ``constants`` (name, version, caps; light, read by
``import collectives``), ``records`` (the file's declared records, imported on the first
load), ``shapes`` (one section per job shape in one file), ``schema`` (the JSON Schema
generated from the records and the registries) and ``document`` (the one builder of the
mapping every profile is written from: ``ringtune tune``'s, online tuning's, ``to_dict``).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NoReturn

from ..errors import ProfileError
from ..plumbing.atomic import write_text_atomic
from .constants import FORMAT as FORMAT
from .constants import MAX_MEASURED as MAX_MEASURED
from .constants import MAX_PROFILE_BYTES as MAX_PROFILE_BYTES
from .constants import MAX_RULE_BYTES as MAX_RULE_BYTES
from .constants import MAX_RULES as MAX_RULES
from .constants import PROFILE_DTYPES as PROFILE_DTYPES
from .constants import PROFILE_OPS as PROFILE_OPS
from .constants import VERSION as VERSION
from .document import ordered, plain, profile_document

if TYPE_CHECKING:
    from .records import EngineRecord, LibraryRecord, ProfileRecord, TopologyRecord

#: The key lists of each record, derived from ``collectives.profile.records`` (imported only when
#: asked: the declarations import ``probes``, which ``import collectives`` must not).
_KEY_LISTS = ("REQUIRED_KEYS", "OPTIONAL_KEYS", "TOPOLOGY_KEYS", "RULE_REQUIRED_KEYS",
              "RULE_OPTIONAL_KEYS", "NATIVE_KEYS", "NATIVE_OPTIONAL_KEYS", "LIBRARY_KEYS",
              "LIBRARY_OPTIONAL_KEYS", "MEASURED_KEYS")


def __getattr__(name: str) -> Any:
    if name in _KEY_LISTS:
        from .records import KEY_LISTS

        return KEY_LISTS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: What ``tuning`` and ``extra`` may hold: the plain YAML/JSON types (a set would make the
#: profile's hash depend on the interpreter's hash seed).
_PLAIN_SCALARS = (str, int, float, bool, type(None))
_PLAIN_DEPTH = 32


@dataclass(frozen=True)
class Rule:
    """One size range of a profile; ``max_bytes`` ``None`` means no upper end."""

    min_bytes: int
    max_bytes: int | None
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    transport: str | None = None
    measured: Mapping[str, Any] | None = None
    #: The file's ``native`` entries of this rule as written (the best of the library's
    #: own algorithms per bucket, what ``ringtune export`` reads): kept so that a loaded
    #: profile written back (``to_dict``) still holds them. The runtime never reads them.
    native: tuple[Mapping[str, Any], ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "algorithm": self.algorithm,
            "params": plain(dict(self.params)),
        }
        if self.transport:
            out["transport"] = self.transport
        if self.measured:
            out["measured"] = plain(dict(self.measured))
        if self.native:
            out["native"] = [plain(dict(e)) for e in self.native]
        return out


@dataclass(frozen=True)
class Profile:
    """A validated profile (see docs/design.md "Profile format"): the rules the runtime
    follows, and ``record``, the ``ProfileRecord`` its file was checked as, which is what
    the runtime reads of the rest (``topology``, ``engine``, ``library``, ``tuning``,
    ``fusion_bucket_bytes``). ``document`` is the file's data as read: what ``to_dict``
    writes back and ``sha256`` hashes, never read for a setting."""

    rules: tuple[Rule, ...]
    backend: str = "numpy"
    transport: str = "mpi"
    dtype: str = "float32"
    op: str = "sum"
    fingerprint: str | None = None
    world_size: int | None = None
    path: str | None = None
    document: Mapping[str, Any] = field(default_factory=dict)
    builtin: bool = False
    #: Which section of a several-shape profile this is (``collectives.profile.shapes``), or "".
    section: str = ""
    #: SHA-256 of the file's bytes when it was read from one (``load_profile``), else
    #: ``None``. Equal bytes hold equal content, so ranks that read the same file agree on
    #: this digest and compute the content hash (``sha256``)
    #: only when their files differ byte for byte (``Communicator`` construction).
    source_digest: str | None = field(default=None, compare=False)
    #: The validated ``ProfileRecord`` (``collectives.profile.records``) of ``document``;
    #: ``None`` for built-in defaults and hand-made profiles.
    record: ProfileRecord | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", [r.min_bytes for r in self.rules])

    def select(self, nbytes: int) -> tuple[int, Rule]:
        """The rule (index, rule) whose range holds ``nbytes``: O(log rules)."""
        i = bisect.bisect_right(self._starts, nbytes) - 1  # type: ignore[attr-defined]
        return max(i, 0), self.rules[max(i, 0)]

    @property
    def sha256(self) -> str:
        """Hash of the profile's content, what ranks compare at construction: SHA-256 of
        its data (``document``: every key, the rules as read) as compact JSON with the
        keys sorted, so equal for equal content whatever the file's key order, layout,
        comments or quoting, and different when any value, key or type differs."""
        data = json.dumps(self.document or {"builtin": [r.__dict__ for r in self.rules]},
                          sort_keys=True, default=str, separators=(",", ":"),
                          check_circular=False)
        return hashlib.sha256(data.encode()).hexdigest()

    @property
    def topology(self) -> TopologyRecord | None:
        """The ``topology`` record the profile was tuned on (``None``: built-in defaults)."""
        return self.record.topology if self.record is not None else None

    @property
    def engine(self) -> EngineRecord | None:
        """The ``engine`` record (``None``: built-in defaults, or a profile written before
        engines were recorded, which was tuned over MPI)."""
        return self.record.engine if self.record is not None else None

    @property
    def engine_name(self) -> str:
        """The engine the profile was tuned over: ``mpi`` where it records none."""
        return self.engine.name if self.engine is not None else "mpi"

    @property
    def library(self) -> LibraryRecord | None:
        """The MPI library (and NCCL) the profile was tuned with, where it records one."""
        return self.record.library if self.record is not None else None

    @property
    def tuning(self) -> Mapping[str, Any]:
        """The ``tuning`` header (free-form: how the rules were found), empty if none."""
        tuning = self.record.tuning if self.record is not None else None
        return tuning or {}

    @property
    def fusion_bucket_bytes(self) -> int | None:
        """The tuned bucket size of ``allreduce_many`` (``fusion.bucket_bytes``), if any."""
        fusion = self.record.fusion if self.record is not None else None
        return fusion.bucket_bytes if fusion is not None else None

    def to_dict(self) -> dict[str, Any]:
        """The profile as the plain mapping that is written to YAML: its ``document``
        (new for built-in defaults) with this profile's settings and rules, built by the
        one profile document builder (``collectives.profile.document``)."""
        base = self.document or None
        topology = dict(base["topology"]) if base else {"world_size": self.world_size or 1}
        if self.fingerprint:
            topology["fingerprint"] = self.fingerprint
        return profile_document(base, topology=topology, backend=self.backend,
                                transport=self.transport, dtype=self.dtype, op=self.op,
                                rules=[r.to_dict() for r in self.rules])


#: The built-in defaults' shared-memory range on ranks of one host, per engine: under MPI
#: the library's own C allreduce wins below 64 KiB (latency-bound messages, where the
#: Python of each step counts) and two rings over the library's single-copy point-to-point
#: from 32 MiB (benchmarks/bench_shm.py: 4.5-5.4 GB/s against shm's 3.6-3.9 at 16-64 MiB);
#: gloo's TCP loopback is slower than shm at every size.
SHM_DEFAULT_RANGE: dict[str, tuple[int, int | None]] = {"mpi": (64 << 10, 32 << 20),
                                                        "torch": (0, None)}
#: The built-in large-message choice: two concurrent whole-segment rings.
_TWO_RINGS: dict[str, Any] = {"rings": 2, "chunk_bytes": 0, "order": "topology"}


def builtin_profile(world_size: int, hosts: int = 0, engine: str = "",
                    even: bool = False) -> Profile:
    """The heuristic used without a profile.

    Ranks all on one host (``hosts == 1``, known once the communicator's ranks agreed):
    ringtune's shared-memory allreduce (``shm``) over ``SHM_DEFAULT_RANGE[engine]``, the
    library's own below it and two rings above. Under torch on several hosts that hold the
    same number (``even``) of several ranks each: ``shm`` at every size, which runs there as
    the two-tier grid (shared memory inside hosts, gloo between) — gloo's loopback inside a
    host is what it replaces. Otherwise (several hosts under MPI, whose library composes
    its own shared memory with the network, or the layout not known):
    the library's own allreduce below 32 MiB, where its C collectives are at least as fast
    as ours (latency-bound small messages; MPI's reduce-scatter/all-gather up to 16 MiB),
    and two concurrent whole-segment rings from 32 MiB, where MPICH falls off (3.3x at
    64 MiB; the quiet tuning runs in BENCHMARKS.md chose the same split). A tuned profile
    replaces this with the machine's own rules."""
    if hosts == 1 and world_size > 1:
        lo, hi = SHM_DEFAULT_RANGE.get(engine, SHM_DEFAULT_RANGE["mpi"])
        rules: tuple[Rule, ...] = (Rule(0, lo - 1, "native", {}),) if lo else ()
        rules += (Rule(lo, None if hi is None else hi - 1, "shm", {}),)
        if hi is not None:
            rules += (Rule(hi, None, "multiring", dict(_TWO_RINGS)),)
        return Profile(rules=rules, world_size=world_size, builtin=True)
    if hosts > 1 and even and engine == "torch":
        return Profile(rules=(Rule(0, None, "shm", {}),), world_size=world_size,
                       builtin=True)
    rules = (
        Rule(0, (32 << 20) - 1, "native", {}),
        Rule(32 << 20, None, "multiring", dict(_TWO_RINGS)),
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
    # One bounded reader for every file (safefiles.safeload): size, alias/node and depth caps,
    # duplicate keys, plain types and finite numbers are checked while parsing.
    from safefiles.safeload import InputError, check_kind, parse_text, read_bounded

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

    Errors read ``NAME: KEY.PATH: what is wrong, got VALUE``. First every key is checked as
    ``ProfileRecord`` declares it, with each record's own checks across its fields
    (``safefiles.records``; the topology's shape among them), then what needs the
    registries: the world size asked for, registered names, contiguous rules and each
    algorithm's own checks of its params. ``copy=False``: ``data`` is fresh plain data from
    ``safefiles.safeload`` that nothing else holds; it becomes the profile's ``document``
    as it is (copying an aliased tree expands it).
    """
    from .shapes import pick

    data, section = pick(data, world_size if world_size is not None else section_for, name,
                         profile_from_dict)
    if data is None:
        _fail(name, "", "the file is empty; expected a ringtune profile (format: "
                        "ringtune-profile)")
    if not isinstance(data, Mapping):
        _fail(name, "", f"expected a mapping of profile keys at the top level, got "
                        f"{type(data).__name__}")
    if copy:
        for key in ("tuning", "extra"):
            if key in data:
                _check_plain(name, data[key], key)
    from safefiles.records import RecordError, load

    from .records import ProfileRecord

    try:
        rec = load(ProfileRecord, data)
    except RecordError as exc:
        raise ProfileError(f"{name}: {exc}") from None
    topo = rec.topology
    ws = topo.world_size
    if world_size is None and "shapes" in data:
        from .shapes import check

        check(data, name, profile_from_dict)
    if world_size is not None and ws != world_size:
        _fail(name, "topology.world_size",
              f"profile was tuned for {ws} ranks, this world has {world_size}; tune this "
              f"world size with `ringtune tune -np {world_size}` or run with {ws} ranks")
    from ..registry import backend_names, transport_names

    backend = _named(name, "backend", rec.backend, backend_names())
    transport = _named(name, "transport", rec.transport, transport_names())
    _check_transport(name, transport, backend, "transport")
    if rec.engine is not None:
        from ..engines import engine_names

        _named(name, "engine.name", rec.engine.name, engine_names())
    from ..natives import tuned_with

    # A profile tuned with another MPI library names that library's algorithms (impl).
    with tuned_with(rec.library.name if rec.library is not None else None):
        rules = _rules(name, rec.rules, data["rules"], ws, backend)
    return Profile(rules=rules, backend=backend, transport=transport, dtype=rec.dtype,
                   op=rec.op, fingerprint=topo.fingerprint, world_size=ws, path=name,
                   document=plain(dict(data)) if copy else data, builtin=False,
                   section=section, record=rec)


def _fail(name: str, key: str, message: str) -> NoReturn:
    """``ProfileError``: ``file: key.path: message``."""
    raise ProfileError(f"{name}: {key}: {message}" if key else f"{name}: {message}")


def _named(name: str, key: str, value: str, names: Sequence[str]) -> str:
    """``value`` if a registry knows it (the registries are asked now: plug-ins add names)."""
    if value not in names:
        _fail(name, key, f"expected one of {', '.join(names)}, got {value!r}")
    return value


def _rules(name: str, records: tuple[Any, ...], raw: Sequence[Mapping[str, Any]],
           world_size: int, backend: str) -> tuple[Rule, ...]:
    """The rules, each checked as the runtime will use it (its keys and ranges passed the
    records' own checks already): a registered algorithm whose own checks pass its params
    for this world size, and a transport that moves this profile's buffers."""
    from ..algorithms import algorithm_names, get_algorithm
    from ..registry import transport_names

    names = algorithm_names()
    out: list[Rule] = []
    for i, (rec, rule) in enumerate(zip(records, raw)):
        where = f"rules[{i}]"
        lo, hi = rec.min_bytes, rec.max_bytes
        algo = rec.algorithm
        if algo not in names:
            _fail(name, f"{where}.algorithm", f"unknown algorithm {algo!r}: use one of "
                  f"{', '.join(names)}")
        params = dict(rec.params)
        rtrans = rec.transport
        if "transport" in params:
            # A rule may name its transport inside params too (docs/design.md); one place only.
            if rtrans is not None and rtrans != params["transport"]:
                _fail(name, f"{where}.params.transport", f"{params['transport']!r} "
                      f"contradicts {where}.transport {rtrans!r}; give the transport once")
            rtrans = params.pop("transport")
            tkey = f"{where}.params.transport"
        else:
            tkey = f"{where}.transport"
        if rtrans is not None:
            if not isinstance(rtrans, str):
                _fail(name, tkey, f"expected one of {', '.join(transport_names())}, got "
                      f"{type(rtrans).__name__}")
            _named(name, tkey, rtrans, transport_names())
            _check_transport(name, rtrans, backend, tkey)
        try:
            get_algorithm(algo).check_params(params, world_size)
        except ValueError as exc:
            msg = str(exc)
            head = msg.split(":", 1)[0]
            if head in params or head.split("[", 1)[0] in params:
                _fail(name, f"{where}.params.{head}", msg.split(":", 1)[1].strip())
            _fail(name, f"{where}.params", msg)
        for j, entry in enumerate(rec.native or ()):
            if entry.composition is not None:
                from ..natives import all_compositions

                _named(name, f"{where}.native[{j}].composition", entry.composition,
                       all_compositions())
        measured = rule.get("measured")
        native = rule.get("native")
        # Keep the params as written (defaults are filled at plan time), but validated.
        out.append(Rule(lo, hi, algo, params, rtrans,
                        dict(measured) if measured is not None else None,
                        tuple(dict(e) for e in native) if native is not None else None))
    return tuple(out)


def _check_transport(name: str, transport: str, backend: str, key: str) -> None:
    """Refuse a transport that cannot move this profile's buffers (``backend: numpy`` with a
    GPU transport): the registry says which buffers each transport moves."""
    from ..registry import transport_refusal

    refusal = transport_refusal(transport, backend)
    if refusal is not None:
        _fail(name, key, f"{refusal} (this profile's backend is {backend}); change {key} or "
                         "backend")


def _check_plain(name: str, value: Any, key: str) -> None:
    """Refuse anything in ``value`` that is not plain YAML/JSON data (text keys, finite
    numbers, no sets, bytes or objects); iterative, so a deep value cannot recurse."""
    todo: list[tuple[Any, str, int]] = [(value, key, 0)]
    while todo:
        item, where, depth = todo.pop()
        if isinstance(item, Mapping):
            children: list[tuple[Any, str]] = []
            for k, x in item.items():
                if not isinstance(k, str):
                    _fail(name, where, f"keys must be text, got {k!r}")
                children.append((x, f"{where}.{k}"))
        elif isinstance(item, (list, tuple)):
            children = [(x, f"{where}[{i}]") for i, x in enumerate(item)]
        else:
            if hasattr(item, "item") and not isinstance(item, _PLAIN_SCALARS):
                item = item.item()  # a NumPy scalar from the tuner
            if not isinstance(item, _PLAIN_SCALARS):
                _fail(name, where, f"{type(item).__name__} is not plain data (text, numbers, "
                                   "true/false, null, lists, mappings)")
            if isinstance(item, float) and not math.isfinite(item):
                _fail(name, where, f"expected a finite number, got {item!r}")
            if isinstance(item, int) and not -(1 << 63) <= item < (1 << 64):
                _fail(name, where, f"integer {item} does not fit 64 bits (the file could not "
                                   "be read back)")
            continue
        if depth >= _PLAIN_DEPTH:
            _fail(name, where, f"nested more than {_PLAIN_DEPTH} levels deep")
        todo.extend((x, w, depth + 1) for x, w in children)


# -- writing -------------------------------------------------------------------------------


def dump_profile(profile_or_dict: Profile | Mapping[str, Any]) -> str:
    """The profile as YAML text (validated first: a bad profile is never written)."""
    import yaml

    data = (profile_or_dict.to_dict() if isinstance(profile_or_dict, Profile)
            else ordered(plain(dict(profile_or_dict))))
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
    except OSError as exc:  # OutputError (safefiles.outfile) included: its reason alone
        why = getattr(exc, "reason", "") or exc.strerror or exc
        raise ProfileError(f"{name}: cannot write profile: {why} (folder "
                           f"{folder}); choose a writable --out") from None


def check_writable(path: str | os.PathLike[str]) -> None:
    """Fail early (``ProfileError``) when ``path`` could not be written later: used by
    ``ringtune tune`` before spending minutes on a search. The one writer's own look
    (``safefiles.outfile.check_output``): a device or FIFO is written through, a symlink's
    target replaced; a directory, dangling link or unwritable place is refused."""
    from safefiles.outfile import OutputError, check_output

    name = os.fspath(path)
    try:
        check_output(name, "")
    except OutputError as exc:
        raise ProfileError(f"{name}: cannot write profile: {exc.reason or exc}; choose "
                           "another --out") from None
