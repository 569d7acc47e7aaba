"""Profiles: the tuned rules (message-size range → algorithm + params) the runtime follows.

``builtin_profile(world_size)`` is the heuristic used when no profile is given.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ProfileError


@dataclass(frozen=True)
class Rule:
    """One size range of a profile; ``max_bytes`` ``None`` means no upper end."""

    min_bytes: int
    max_bytes: int | None
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    transport: str | None = None
    measured: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Profile:
    """A validated profile (see DESIGN.md "Profile format")."""

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", [r.min_bytes for r in self.rules])

    def select(self, nbytes: int) -> tuple[int, Rule]:
        """The rule (index, rule) whose range holds ``nbytes``: O(log rules)."""
        i = bisect.bisect_right(self._starts, nbytes) - 1  # type: ignore[attr-defined]
        return max(i, 0), self.rules[max(i, 0)]

    @property
    def sha256(self) -> str:
        """Hash of the profile's content (what ranks compare at construction)."""
        data = json.dumps(self.raw or {"builtin": [r.__dict__ for r in self.rules]},
                          sort_keys=True, default=str)
        return hashlib.sha256(data.encode()).hexdigest()


def builtin_profile(world_size: int) -> Profile:
    """The heuristic used without a profile: the library's allreduce for small messages
    (latency-bound, where its tree algorithms win), chunk-pipelined rings above."""
    rules = (
        Rule(0, (256 << 10) - 1, "native", {}),
        Rule(256 << 10, None, "multiring",
             {"rings": 2, "chunk_bytes": 1 << 20, "order": "topology"}),
    )
    return Profile(rules=rules, world_size=world_size, builtin=True)


def load_profile(path: str, world_size: int | None = None) -> Profile:
    """Read and validate a profile file; ``ProfileError`` naming file and key otherwise."""
    raise ProfileError(f"{path}: profile loading is not available yet")
