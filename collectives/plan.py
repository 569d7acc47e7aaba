"""``Plan`` and ``Config``: what to run for one message size, as plain records.

``Communicator.plan_for(nbytes)`` returns a ``Plan`` (the runtime's choice and why);
``explain`` renders it for people. The prepared, executable form (algorithm instance with
scratch buffers) stays inside the communicator's plan cache.

``Config(algorithm, params, transport)`` is one candidate configuration, frozen and
hashable: the tuner's search space yields them, its trials, A/B choices and reports carry
them (``autotune``). ``params`` are the algorithm's own parameters only, as a read-only
``Params`` mapping; the transport (GPU buffers) is a field of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The key a transport had inside a configuration's params before ``Config`` had a field
#: for it (older Optuna records, older profiles' ``rules[].params``).
LEGACY_TRANSPORT_KEY = "transport"


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return tuple((k, _freeze(v)) for k, v in value.items())
    return value


def _thaw(value: Any, like: Any) -> Any:
    if isinstance(like, (list, tuple)):
        return [_thaw(v, lk) for v, lk in zip(value, like)]
    if isinstance(like, Mapping):
        return {k: _thaw(v, like[k]) for k, v in value}
    return value


class Params(Mapping[str, Any]):
    """A configuration's parameters, read-only and hashable: equal parameters (whatever
    their order, lists or tuples) are equal and hash alike. Reading a value gives a fresh
    copy (lists stay lists), so nothing outside can change a ``Config``. Keys keep their
    order for people (``params_text``)."""

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        plain = dict(data or {})
        self._frozen = {k: _freeze(v) for k, v in plain.items()}
        self._key = json.dumps(_plain(plain), sort_keys=True, default=str)
        # The template of each value's shape, itself frozen from outside changes.
        self._like = json.loads(json.dumps(_plain(plain), default=str))

    def __getitem__(self, key: str) -> Any:
        return _thaw(self._frozen[key], self._like[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._frozen)

    def __len__(self) -> int:
        return len(self._frozen)

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Params):
            return self._key == other._key
        if isinstance(other, Mapping):
            return self._key == json.dumps(_plain(dict(other)), sort_keys=True, default=str)
        return NotImplemented

    def __repr__(self) -> str:
        return f"Params({dict(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Params, (dict(self),))


def _plain(value: Any) -> Any:
    """Lists for tuples, dicts for mappings: the JSON form of a parameter value."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _value_text(v: Any) -> str:
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        return "x".join(map(str, v))
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return ",".join(v)
    return str(v)


def params_text(params: Mapping[str, Any]) -> str:
    """A configuration's parameters for people: ``rings=2 chunk_bytes=65536 dims=2x4
    inner=rhd,multiring`` (an empty string without parameters). The one formatter of
    configurations: logs, reports, progress lines and exported comments use it."""
    return " ".join(f"{k}={_value_text(v)}" for k, v in params.items())


def config_text(algorithm: str, params: Mapping[str, Any]) -> str:
    """``multiring rings=2 chunk_bytes=1048576``: the algorithm and ``params_text``."""
    text = params_text(params)
    return f"{algorithm} {text}" if text else algorithm


@dataclass(frozen=True)
class Config:
    """One candidate configuration: an algorithm, its own parameters, and the transport it
    runs on (``None``: the communicator's default; on GPU buffers the tuner names one).

    Frozen and hashable; equal configurations have equal ``key`` (the canonical text the
    tuner's storage records). Build one from a record that may carry the transport inside
    its params (older storages) with ``Config.from_record``."""

    algorithm: str
    params: Mapping[str, Any] = field(default_factory=Params)
    transport: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.params, Params):
            object.__setattr__(self, "params", Params(self.params))
        if LEGACY_TRANSPORT_KEY in self.params:
            raise ValueError(f"{self.algorithm}: params carry no {LEGACY_TRANSPORT_KEY!r}; "
                             "give it as Config(..., transport=...) (or use "
                             "Config.from_record)")

    @classmethod
    def from_record(cls, algorithm: str, params: Mapping[str, Any] | None = None,
                    transport: str | None = None) -> Config:
        """A configuration from stored parts, where the transport may still sit in
        ``params`` under ``"transport"`` (how records were written before ``Config``)."""
        own = dict(params or {})
        inside = own.pop(LEGACY_TRANSPORT_KEY, None)
        if transport is None and inside is not None:
            transport = str(inside)
        return cls(str(algorithm), own, transport)

    def record(self) -> dict[str, Any]:
        """Plain JSON form: ``{"algorithm", "params"[, "transport"]}`` (``from_record``
        reads it back)."""
        out: dict[str, Any] = {"algorithm": self.algorithm, "params": dict(self.params)}
        if self.transport is not None:
            out["transport"] = self.transport
        return out

    @property
    def key(self) -> str:
        """Canonical text: equal configurations, equal keys. The same text the tuner has
        always recorded (the transport among the params), so older studies resume."""
        params = dict(self.params)
        if self.transport is not None:
            params[LEGACY_TRANSPORT_KEY] = self.transport
        return json.dumps([self.algorithm, _plain(params)], sort_keys=True, default=str)

    def with_transport(self, transport: str | None) -> Config:
        """The same algorithm and params on ``transport``."""
        return Config(self.algorithm, self.params, transport)

    def text(self) -> str:
        """``multiring transport=nccl rings=2 chunk_bytes=1048576`` for people."""
        params = dict(self.params)
        if self.transport is not None:
            params = {"transport": self.transport, **params}
        return config_text(self.algorithm, params)

    def __str__(self) -> str:
        return self.text()


@dataclass(frozen=True)
class Plan:
    """The choice for a message size: algorithm, its parameters, the transport, and why."""

    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    transport: str = "mpi"
    #: Where the choice came from: ``profile``, ``default`` (built-in heuristic) or
    #: ``explicit`` (arguments of the call).
    source: str = "default"
    #: Index of the profile rule that matched (``None`` for explicit choices).
    rule: int | None = None
    min_bytes: int = 0
    max_bytes: int | None = None
    #: The rule's ``measured`` record from tuning (busbw etc.), if any.
    measured: Mapping[str, Any] | None = None

    def describe_params(self) -> str:
        """``rings=2 chunk_bytes=1048576`` style text (``params_text``), or an empty
        string."""
        return params_text(self.params)


def plan_key(flat: Any, op: str, backend: Any, algorithm: str | None,
              transport: str | None, params: Mapping[str, Any]) -> tuple[Any, ...]:
    """The plan-cache key of a call: (size, dtype, op, backend, choice). Parameters are
    keyed by their repr, since values such as explicit ring orders are lists."""
    return (flat.size, flat.dtype, op, backend.name, algorithm, transport,
            repr(sorted(params.items())) if params else None)
