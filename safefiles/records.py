"""Declared records: one declaration of a file's keys gives its checks and its JSON Schema.

Every record ringtune reads from a file — a profile and its rules (``collectives.profile``),
a topology (``probes.topology``), a cluster and a workload (``autotune.cluster``) — is a
frozen dataclass whose fields are the file's keys. Field types say what a value is
(``int``, ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]`` for lists,
``Mapping[str, Any]`` for free mappings, ``Any``, or another record), and ``declare(...)``
adds what a type alone cannot: bounds, choices, a pattern, list caps, and the words of a
refusal. Then:

- ``load(cls, data)`` checks plain data (what ``safefiles.safeload`` parsed) against the
  declaration and builds the record; the first problem raises ``RecordError`` with one line
  ``key.path: what is wrong, got VALUE`` (the caller puts the file name in front);
- ``json_schema(cls, names)`` is the JSON Schema (draft 2020-12) of the same declaration;
- ``schema_document(cls, ...)`` is that fragment as a whole schema file (``$schema``,
  ``$id``, title, description);
- ``required_keys(cls)``, ``optional_keys(cls)``: the keys, in declaration order.

Two class attributes extend a declaration where a field alone cannot say it:

- ``__header__``: another record whose keys a file may hold beside this record's own, checked
  like them but not passed to the constructor: what a file says of itself (``format``,
  ``version``) and of values the record derives (a topology's ``fingerprint``); the writer
  fills the same record, so what is written is what is read;
- ``__check__(self, where)``: the record's checks across its fields (indexes into other
  lists, products, sums), run by ``load`` right after the record is built (``where``: its
  key path), raising ``RecordError``; a JSON Schema cannot say them, so each schema's
  description names them.

The names a registry knows (``declare(names=...)``: the schema lists them, the loader asks
the registry) and each algorithm's checks of a rule's params stay functions of their
module (``collectives.profile``), run after this pass; the rules' ranges are the profile
record's own ``__check__``.

One rule holds for every number of every record: finite, and without declared bounds
``0 ≤ n ≤ 2⁶³−1`` (counts, sizes, indexes, rates and times are never negative; a larger
integer would not survive a round trip through NumPy or C). Chosen over a validation
library (msgspec, pydantic) by measurement: benchmarks/bench_records.py and
docs/profile-format.md "How files are checked".
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Largest integer of any record without bounds of its own (signed 64 bits).
MAX_INT = (1 << 63) - 1
_META = "ringtune.record"


class RecordError(ValueError):
    """One line, ``key.path: message``: what is wrong with a record's data."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


@dataclass(frozen=True)
class Spec:
    """What a field declares beyond its type (see ``declare``)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    realistic: bool = False
    least: float | None = None
    choices: tuple[Any, ...] = ()
    pattern: str | None = None
    shape: str = ""
    min_len: int | None = None
    max_len: int | None = None
    cap: str = ""
    min_items: int | None = None
    max_items: int | None = None
    noun: str = "entries"
    why: str = ""
    names: str = ""
    null: bool = True
    required: bool = False
    text: Callable[[str, str], Any] | None = None
    doc: str = ""


_NO_SPEC = Spec()


def declare(default: Any = dataclasses.MISSING, *,
            default_factory: Any = dataclasses.MISSING, **spec: Any) -> Any:
    """A record field with its declaration (keyword arguments of ``Spec``):

    - ``ge``/``gt``/``le``: bounds of a number (of each number, in a list of them);
      ``realistic``: ``le`` (and ``least``, the smallest non-zero magnitude) are the limits
      of a realistic figure, refused as such rather than as out of range;
    - ``choices``: the values allowed (one choice: the constant the key must hold);
    - ``pattern`` (matched whole), ``min_len``, ``max_len``: of a string; ``shape``: what
      the value is, for messages (``"a fraction 0..1"``), instead of words from the checks;
    - ``cap``: why a number may not exceed ``le``, said (after ``VALUE noun;``) when it
      does, in place of the generic words: a cap of cost rather than of sense;
    - ``min_items``/``max_items`` of a list, checked before any item is converted, with
      ``noun`` (``"rules"``) for messages;
    - ``why``: said after a refusal of this key (what to do);
    - ``names``: the registry whose names the value must be (checked by the module; the
      schema lists them);
    - ``null``: whether an ``X | None`` key may hold null (``False``: it may only be left
      out); ``required``: a file must give the key although the record has a default;
    - ``text``: ``(text, key) -> value``, a list's text form (a CPU list ``"0-3,8"``);
    - ``doc``: the key's description in the schema.
    """
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={_META: Spec(**spec)})


# -- messages ------------------------------------------------------------------------------


def show(value: Any) -> str:
    """A value for a message: collections by their type (they may be huge), text cut."""
    if isinstance(value, (Mapping, list, tuple)):
        return type(value).__name__
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1 << 63 else f"{x:g}"


def _describe(kind: type, spec: Spec) -> str:
    """What a value of this field is, after ``expected``."""
    if spec.choices:
        if len(spec.choices) == 1:
            return repr(spec.choices[0])
        return "one of " + ", ".join(str(c) for c in spec.choices)
    if spec.shape:
        return spec.shape
    if kind is bool:
        return "true or false"
    if kind is str:
        return "a string"
    noun = "an integer" if kind is int else "a number"
    short = "integer" if kind is int else "number"
    lo, hi = _bounds(kind, spec)
    if spec.gt == 0:
        return f"a positive {short}"
    if spec.realistic:
        return f"a non-negative {short}"
    if hi is None:
        return f"{noun} ≥ {_number(lo)}"
    return f"{noun} {_number(lo)}..{_number(hi)}"


def _bounds(kind: type, spec: Spec) -> tuple[float, float | None]:
    """(lower, upper) of a number field: the declared ones, else the rule for all records
    (``0 .. MAX_INT`` for integers, ``≥ 0`` for other numbers)."""
    declared = spec.ge is not None or spec.gt is not None or spec.le is not None
    lo = spec.ge if spec.ge is not None else spec.gt if spec.gt is not None else 0
    hi = spec.le if declared else (MAX_INT if kind is int else None)
    if kind is int and hi is None:
        hi = MAX_INT
    return lo, hi


# -- converters ----------------------------------------------------------------------------

Convert = Callable[[Any, str], Any]


def _fail(where: str, message: str) -> typing.NoReturn:
    raise RecordError(where, message)


def _with_why(message: str, spec: Spec) -> str:
    return f"{message}; {spec.why}" if spec.why else message


def _scalar(kind: type, spec: Spec) -> Convert:
    desc = _describe(kind, spec)
    choices = spec.choices

    def expected(value: Any, where: str) -> typing.NoReturn:
        _fail(where, _with_why(f"expected {desc}, got {show(value)}", spec))

    if kind is str:
        rx = re.compile(spec.pattern) if spec.pattern else None

        def text(value: Any, where: str) -> Any:
            if type(value) is not str and not isinstance(value, str):
                expected(value, where)
            if choices and value not in choices:
                expected(value, where)
            if rx is not None and not rx.fullmatch(value):
                expected(value, where)
            if spec.min_len is not None and len(value) < spec.min_len or \
                    spec.max_len is not None and len(value) > spec.max_len:
                expected(value, where)
            return value
        return text
    if kind is bool:
        def flag(value: Any, where: str) -> Any:
            if type(value) is not bool:
                expected(value, where)
            return value
        return flag
    lo, hi = _bounds(kind, spec)
    strict_lo = spec.gt is not None
    if kind is int:
        def integer(value: Any, where: str) -> Any:
            if type(value) is not int:
                if isinstance(value, bool) or not isinstance(value, int):
                    expected(value, where)
                value = int(value)  # a NumPy or other int subclass
            if value < lo or strict_lo and value == lo:
                expected(value, where)
            if hi is not None and value > hi:
                too_large(value, where)
            if choices and value not in choices:
                expected(value, where)
            return value
        number_check = integer
    else:
        def number(value: Any, where: str) -> Any:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                expected(value, where)
            try:
                f = float(value)
            except OverflowError:
                f = math.inf
            if not math.isfinite(f):
                _fail(where, _with_why(f"expected a finite number, got {show(value)}", spec))
            if f < lo or strict_lo and f == lo:
                expected(value, where)
            if hi is not None and f > hi:
                too_large(value, where)
            if spec.least is not None and 0 < f < spec.least:
                _fail(where, f"{show(value)} is below {spec.least:g}; give a realistic "
                             "figure (in the units of the key's name)")
            return f
        number_check = number

    def too_large(value: Any, where: str) -> typing.NoReturn:
        if spec.cap:
            _fail(where, f"{show(value)} {spec.noun}; {spec.cap}")
        if spec.realistic:
            _fail(where, f"{show(value)} is more than {hi:g}, the most this key may be; give "
                         "a realistic figure (in the units of the key's name)")
        expected(value, where)

    return number_check


def _mapping(value: Any, where: str) -> Any:
    if not isinstance(value, Mapping):
        _fail(where, f"expected a mapping, got {show(value)}")
    for k in value:
        if not isinstance(k, str):
            _fail(where, f"keys must be text, got {k!r}")
    return value


def _compile(tp: Any, spec: Spec) -> Convert:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _compile(next(a for a in args if a is not type(None)), spec)
        if type(None) not in args or not spec.null:
            return inner

        def nullable(value: Any, where: str) -> Any:
            return None if value is None else inner(value, where)
        return nullable
    if origin is tuple:
        item = _compile(args[0], dataclasses.replace(spec, min_items=None, max_items=None,
                                                     text=None, shape=""))
        text_form = spec.text
        whole = spec.shape

        def items(value: Any, where: str) -> Any:
            if text_form is not None and isinstance(value, str):
                value = text_form(value, where)
            if not isinstance(value, (list, tuple)):
                _fail(where, _with_why(f"expected {whole or 'a list'}, got {show(value)}", spec))
            n = len(value)
            if spec.max_items is not None and n > spec.max_items:
                _fail(where, _with_why(f"{n} {spec.noun}; at most {spec.max_items}", spec))
            if spec.min_items is not None and n < spec.min_items:
                most = f" of at most {spec.max_items} {spec.noun}" if spec.max_items else ""
                want = ("a non-empty list" if spec.min_items == 1 else
                        f"a list of at least {spec.min_items}") + most
                _fail(where, _with_why(f"expected {want}, got {n} {spec.noun}", spec))
            if not whole:
                return tuple([item(v, f"{where}[{i}]") for i, v in enumerate(value)])
            # ``shape`` describes the whole list: a bad item is refused in its words.
            out = []
            for i, v in enumerate(value):
                try:
                    out.append(item(v, f"{where}[{i}]"))
                except RecordError:
                    _fail(where, _with_why(f"expected {whole}, got {show(v)} at [{i}]", spec))
            return tuple(out)
        return items
    if origin in (Mapping, dict) or tp in (Mapping, dict):
        return _mapping
    if tp is Any:
        return lambda value, where: value
    if dataclasses.is_dataclass(tp):
        return lambda value, where: _convert_record(tp, value, where)
    if tp in (int, float, str, bool):
        return _scalar(tp, spec)
    raise TypeError(f"record field type {tp!r} is not one safefiles.records knows")


@dataclass(frozen=True)
class _Field:
    name: str
    convert: Convert
    required: bool
    spec: Spec
    hint: Any
    #: Passed to the constructor (``False``: a ``__header__`` key, checked only).
    keep: bool = True


Hook = Callable[[Any, str], None]


def _fields(cls: type, keep: bool) -> list[_Field]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or not f.init:
            continue
        spec = f.metadata.get(_META, _NO_SPEC)
        required = spec.required or (f.default is dataclasses.MISSING and
                                     f.default_factory is dataclasses.MISSING)
        out.append(_Field(f.name, _compile(hints[f.name], spec), required, spec,
                          hints[f.name], keep))
    return out


@functools.cache
def _plan(cls: type) -> tuple[tuple[_Field, ...], frozenset[str], str, str, Hook | None]:
    """(fields, their names, the allowed-keys list, the missing message, the ``__check__``
    hook) of a record, compiled once per class; a ``__header__``'s fields come first."""
    header = getattr(cls, "__header__", None)
    out = (_fields(header, keep=False) if header is not None else []) + _fields(cls, True)
    names = frozenset(f.name for f in out)
    if len(names) != len(out):
        raise TypeError(f"{cls.__name__}: a key of its __header__ is also one of its fields")
    allowed = ", ".join(f.name for f in out)
    required = ", ".join(f.name for f in out if f.required)
    hook = getattr(cls, "__check__", None)
    return tuple(out), names, allowed, f"missing (required: {required})", hook


def key_path(where: str, key: str) -> str:
    """``key`` under ``where`` (``hosts[0]`` + ``numa`` -> ``hosts[0].numa``), for a
    ``__check__`` hook's ``RecordError``."""
    return f"{where}.{key}" if where else key


def _convert_record(cls: Any, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        _fail(where or "top level", f"expected a mapping of keys, got {show(data)}")
    fields, names, allowed, missing, hook = _plan(cls)
    prefix = f"{where}." if where else ""
    for k in data:
        if k not in names:
            if not isinstance(k, str):
                _fail(where or "top level", f"keys must be text, got {k!r}")
            hint = getattr(cls, "__unknown_hint__", "")
            _fail(prefix + k, f"unknown key (allowed here: {allowed})"
                              f"{'; ' + hint if hint else ''}")
    kwargs = {}
    for f in fields:
        if f.name in data:
            value = f.convert(data[f.name], prefix + f.name)
            if f.keep:
                kwargs[f.name] = value
        elif f.required:
            _fail(prefix + f.name, missing)
    record = cls(**kwargs)
    if hook is not None:
        hook(record, where)
    return record


_R = typing.TypeVar("_R")


def load(cls: type[_R], data: Any, where: str = "") -> _R:
    """The record ``cls`` built from plain data, every declared check passed;
    ``RecordError`` (``key.path: message``, under ``where``) at the first problem."""
    return typing.cast(_R, _convert_record(cls, data, where))


def check_value(cls: type, key: str, value: Any, where: str) -> Any:
    """One key of record ``cls`` checked alone (its declared checks), converted."""
    for f in _plan(cls)[0]:
        if f.name == key:
            return f.convert(value, where)
    raise KeyError(key)


def required_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in _plan(cls)[0] if f.required)


def optional_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in _plan(cls)[0] if not f.required)


def spec_of(cls: type, key: str) -> Spec:
    return next(f.spec for f in _plan(cls)[0] if f.name == key)


# -- JSON Schema ---------------------------------------------------------------------------


def json_schema(cls: type, names: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) fragment of record ``cls``: an object with its keys,
    required ones, no others. ``names``: registry name -> the fragment a ``names=`` key
    takes (an ``enum`` of the registry's names, or a ``$ref``)."""
    names = names or {}
    fields = _plan(cls)[0]
    out: dict[str, Any] = {"type": "object"}
    doc = getattr(cls, "__schema_doc__", "")
    if doc:
        out = {"description": doc, **out}
    out["required"] = [f.name for f in fields if f.required]
    out["additionalProperties"] = False
    out["properties"] = {f.name: _field_schema(f.hint, f.spec, names) for f in fields}
    return out


#: Where the schema files say they live (``$id``), by file name.
SCHEMA_BASE = "https://github.com/ringtune/ringtune/profiles/schema/"


def schema_document(cls: type, *, file: str, title: str, description: str,
                    names: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A whole JSON Schema file of record ``cls`` (what ``make schema`` writes under
    ``profiles/schema/``, as ``file``): ``json_schema`` with the dialect, ``$id``, title
    and description (say there what the record's ``__check__`` hooks check beyond it)."""
    body = json_schema(cls, names)
    body.pop("description", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": SCHEMA_BASE + file, "title": title, "description": description, **body}


def schema_text(schema: Mapping[str, Any]) -> str:
    """A schema as its checked-in file holds it: indented JSON, UTF-8 as is."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def _field_schema(tp: Any, spec: Spec, names: Mapping[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = _field_schema(next(a for a in args if a is not type(None)), spec, names)
        if type(None) not in args or not spec.null:
            return inner
        return _or_null(inner)
    body: dict[str, Any]
    if origin is tuple:
        item = _field_schema(args[0], dataclasses.replace(spec, min_items=None,
                                                          max_items=None, text=None,
                                                          doc=""), names)
        body = {"type": "array", "items": item}
        if spec.min_items is not None:
            body["minItems"] = spec.min_items
        if spec.max_items is not None:
            body["maxItems"] = spec.max_items
        if spec.text is not None:
            body = {"anyOf": [{"type": "string"}, body]}
    elif origin in (Mapping, dict) or tp in (Mapping, dict):
        body = {"type": "object"}
    elif tp is Any:
        body = {}
    elif dataclasses.is_dataclass(tp):
        body = json_schema(typing.cast(type, tp), names)
    elif spec.names:
        body = dict(names[spec.names])
    elif spec.choices and len(spec.choices) == 1:
        body = {"const": spec.choices[0]}
        if tp is int:
            body["type"] = "integer"
    elif spec.choices:
        body = {"enum": list(spec.choices)}
    elif tp is bool:
        body = {"type": "boolean"}
    elif tp is str:
        body = {"type": "string"}
        if spec.pattern:
            body["pattern"] = f"^{spec.pattern}$"
        if spec.min_len is not None:
            body["minLength"] = spec.min_len
        if spec.max_len is not None:
            body["maxLength"] = spec.max_len
    elif tp in (int, float):
        body = {"type": "integer" if tp is int else "number"}
        lo, hi = _bounds(tp, spec)
        if spec.gt is not None:
            body["exclusiveMinimum"] = spec.gt
        else:
            body["minimum"] = lo
        if hi is not None:
            body["maximum"] = hi
    else:
        raise TypeError(f"record field type {tp!r} is not one safefiles.records knows")
    if spec.doc:
        body = {"description": spec.doc, **body}
    return body


def _or_null(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` that also admits null."""
    out = dict(body)
    if "enum" in out:
        out["enum"] = [*out["enum"], None]
    t = out.get("type")
    if isinstance(t, str):
        out["type"] = [t, "null"]
    elif "$ref" in out or "anyOf" in out or "const" in out:
        return {"anyOf": [body, {"type": "null"}]}
    return out
