"""Online tuning's options: ``OnlineOptions`` and how each is read (the keyword, else its
``RINGTUNE_TUNE_*`` variable, else the default), with the mode (``RINGTUNE_TUNE``) and the
output (``RINGTUNE_TUNE_OUT``). Use ``resolve_options`` / ``resolve_mode`` /
``resolve_out``; a bad value is a ``ValueError`` naming the key or variable and the range.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

#: The contract's variables.
TUNE_ENV = "RINGTUNE_TUNE"
OUT_ENV = "RINGTUNE_TUNE_OUT"
#: ``RINGTUNE_TUNE`` values: ``online``, or off (``off``, ``none``, ``0`` or unset).
MODES = ("online", "off")
_OFF = ("", "off", "none", "0", "no", "false")


@dataclass(frozen=True)
class OnlineOptions:
    """How online tuning explores (see the module docstring); defaults are the figures
    documented there and in docs/design.md."""

    #: Most exploring calls per size class before it settles on the best so far.
    calls: int = 32
    #: Calls per candidate; its score is the median of their slowest-rank times.
    samples: int = 3
    #: An exploring call runs only when the cost of exploring so far beyond the best
    #: candidates' times (all size classes together) plus the call's predicted extra
    #: (``SizeClass.predicted_extra``) fits in this share of the job's time since the
    #: communicator was built; otherwise the best so far runs and exploring waits.
    share: float = 0.1
    #: Candidates per size class (the incumbent, guesses, then random draws).
    candidates: int = 8
    #: A challenger replaces the incumbent only when faster by this fraction.
    margin: float = 0.03
    #: A candidate whose first call takes more than this many times the best's first call
    #: is dropped, and only candidates within it of the best are called again (for their
    #: ``samples``); an uncalled candidate is charged what a first call within it would
    #: cost beyond the best (``SizeClass.predicted_extra``). 1.25: a candidate 25% slower
    #: than the best on one call is clearly worse beyond a quiet machine's call-to-call
    #: noise, and each further call of it would cost a quarter of the bucket's best time.
    prune: float = 1.25
    #: Seed of the random draws (rank 0 draws; the same job draws the same candidates).
    seed: int = 0
    #: First calls of each size class that run the incumbent untimed: a bucket's first
    #: calls carry the job's own warm-up (DDP's rebuilt buckets touched for the first time,
    #: the allocator growing), which would make whatever runs then look slow.
    warmup: int = 1
    #: Before a class settles, its two fastest candidates (the runner-up within ``prune``
    #: of the best) are called, alternately, until each has this many calls; 0 or at most
    #: ``samples``: no final round. Picking the fastest of several medians of 3 calls, on a
    #: machine whose calls vary by +-20% inside a training step, picks a lucky loser often
    #: enough to matter (a 1-ring ring over the grid across emulated hosts, 1.23x slower
    #: steps); the final round costs little, the two being within ``prune`` of the best.
    confirm: int = 6

    def record(self) -> dict[str, Any]:
        return asdict(self)


def _bounds() -> dict[str, tuple[str, type, float, float]]:
    """option -> (environment variable, kind, lowest, highest), in field order. The range
    is the variable's row of ``probes.environment`` (``RINGTUNE_TUNE_<OPTION>``), which
    every CLI verb checks the environment against: the keyword, the variable and that
    check accept the same values. Imported here, not at the top: ``import collectives``
    loads no probes."""
    from probes.environment import TABLE

    out: dict[str, tuple[str, type, float, float]] = {}
    for f in fields(OnlineOptions):
        row = TABLE[f"RINGTUNE_TUNE_{f.name.upper()}"]
        assert row.lo is not None and row.hi is not None, row.name
        out[f.name] = (row.name, int if row.kind == "int" else float, row.lo, row.hi)
    return out


def _number(text: Any, kind: type, lo: float, hi: float, what: str) -> Any:
    try:
        if isinstance(text, bool):
            raise ValueError
        value = kind(text) if not isinstance(text, str) else kind(text.strip())
        if kind is int and isinstance(text, float) and text != int(text):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{what}={text!r}: expected {'an integer' if kind is int else 'a number'}"
                         f" in {lo:g}..{hi:g}") from None
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"{what}={text!r}: expected a value in {lo:g}..{hi:g}")
    return value


def resolve_mode(tune: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether online tuning is on: the keyword when given, else ``RINGTUNE_TUNE``.
    ``ValueError`` naming the keyword or the variable for an unknown value."""
    env = os.environ if environ is None else environ
    if tune is not None:
        text, what = str(tune), "tune"
    else:
        text, what = env.get(TUNE_ENV, ""), TUNE_ENV
    value = text.strip().lower()
    if value == "online":
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{what}={text!r}: unknown tuning mode; use 'online' (tune inside the "
                     f"job) or 'off' (follow the profile)")


def resolve_options(options: Mapping[str, Any] | OnlineOptions | None = None,
                    environ: Mapping[str, str] | None = None) -> OnlineOptions:
    """The options: each keyword of ``options`` when given, else its variable, else the
    default. ``ValueError`` naming the key or variable and the allowed range."""
    if isinstance(options, OnlineOptions):
        return options
    env = os.environ if environ is None else environ
    given = dict(options or {})
    names = {f.name for f in fields(OnlineOptions)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(f"tune_options: unknown option {unknown[0]!r}; use some of "
                         f"{', '.join(sorted(names))}")
    values: dict[str, Any] = {}
    for name, (var, kind, lo, hi) in _bounds().items():
        if name in given:
            values[name] = _number(given[name], kind, lo, hi, f"tune_options[{name!r}]")
        elif env.get(var, "").strip():
            values[name] = _number(env[var], kind, lo, hi, var)
    return OnlineOptions(**values)


def resolve_out(tune_out: str | os.PathLike[str] | None,
                environ: Mapping[str, str] | None = None) -> str | None:
    """Where the tuned profile goes: the keyword, else ``RINGTUNE_TUNE_OUT``, else nowhere."""
    env = os.environ if environ is None else environ
    if tune_out is not None:
        return os.fspath(tune_out)
    return env.get(OUT_ENV, "").strip() or None

