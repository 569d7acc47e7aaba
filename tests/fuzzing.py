"""How much of a fuzz set a run covers: a seeded sample by default, all of it on request.

Use ``sample(items, name)`` around the loop over a fuzz set's variants. By default it keeps
``SAMPLE_PERCENT`` per cent of them, chosen by a random generator seeded from
``$RINGTUNE_FUZZ_SEED`` (default ``DEFAULT_SEED``) and ``name``: the same variants every run,
so the unit suite stays fast and deterministic, and another seed covers others.
``RINGTUNE_FUZZ=full`` keeps every variant (``make fuzz``). A failure message should name
``describe()`` so that whoever reads it can rerun exactly that selection.
"""

from __future__ import annotations

import os
import random
import zlib
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

FUZZ_ENV = "RINGTUNE_FUZZ"
SEED_ENV = "RINGTUNE_FUZZ_SEED"
MODES = ("sample", "full")
DEFAULT_SEED = 0
#: Per cent of the variants the default sample keeps: each kind of file still meets every
#: kind of bad value, at about a fifth of the full set's time.
SAMPLE_PERCENT = 20


def mode() -> str:
    """``sample`` (default) or ``full``, from ``$RINGTUNE_FUZZ``."""
    value = os.environ.get(FUZZ_ENV, "").strip().lower() or "sample"
    if value not in MODES:
        raise ValueError(f"{FUZZ_ENV}={value!r}: use one of {', '.join(MODES)}")
    return value


def seed() -> int:
    """``$RINGTUNE_FUZZ_SEED`` (an integer; default ``DEFAULT_SEED``)."""
    raw = os.environ.get(SEED_ENV, "").strip()
    if not raw:
        return DEFAULT_SEED
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SEED_ENV}={raw!r}: expected an integer, e.g. 7") from None


def describe() -> str:
    """The selection in words, with what reproduces it."""
    if mode() == "full":
        return f"{FUZZ_ENV}=full (every variant)"
    return (f"a {SAMPLE_PERCENT}% sample, {SEED_ENV}={seed()} "
            f"(rerun with that seed, or {FUZZ_ENV}=full for every variant)")


def sample(items: Iterable[T], name: str) -> Iterator[T]:
    """``items`` (every one with ``RINGTUNE_FUZZ=full``; else the seeded sample). ``name``
    (e.g. the kind of file) gives each set its own stream, so adding variants to one set
    does not change which variants of another are drawn."""
    chosen = seed()  # checked in either mode: a bad value is named, never ignored
    if mode() == "full":
        yield from items
        return
    rng = random.Random(chosen * 1_000_003 + zlib.crc32(name.encode()))
    for item in items:
        if rng.randrange(100) < SAMPLE_PERCENT:
            yield item
