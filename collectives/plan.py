"""``Plan``: what the runtime decided to run for one message size, as a plain record.

``Communicator.plan_for(nbytes)`` returns one; ``explain`` renders it for people. The
prepared, executable form (algorithm instance with scratch buffers) stays inside the
communicator's plan cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
