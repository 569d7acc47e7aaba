"""The one parser of numbers typed by a person: command-line flags, ``--param k=v``,
environment variables, sizes such as ``64M``.

Use ``parse_number(text, what, kind=int, lo=1, hi=1000)`` for a count or a number of
seconds, and ``parse_size(text, what)`` for a byte size with a K/M/G/T suffix. Both return
a finite value within the bounds or raise ``NumberError`` (a ``ValueError``) whose message
is one line ``WHAT='TEXT': what is expected``: ``inf``, ``nan``, ``1e400`` (which ``float``
reads as infinity) and ``infK`` are refused here, never turned into an ``OverflowError``
deep inside a command. Files are read by ``safefiles.safeload``, which refuses non-finite
numbers the same way; their bounds are the records' ``declare(...)``.

It lives in ``safefiles`` (the bottom layer) because every layer reads such numbers: the
environment table (``probes.environment``), the runtime's sizes (``collectives.bench``),
the CLI's flags (``ringtune.cli``).
"""

from __future__ import annotations

import math

#: Suffixes of a byte size; powers of 1024, as nccl-tests reads them.
SIZE_SUFFIXES = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: Largest byte size anything accepts (1 PiB): far above any buffer one allreduce moves,
#: far below where a float loses whole bytes (2**53), so a size is exact and finite.
MAX_SIZE = 1 << 50


class NumberError(ValueError):
    """A number that is not one, not finite, or out of range; one line naming where it came
    from (``what``) and the value."""


def _show(lo: float | None, hi: float | None, kind: type) -> str:
    """``in 1..1000``, ``>= 0``, ``<= 5``: the range a message names."""
    def g(x: float) -> str:
        return str(int(x)) if kind is int and float(x).is_integer() else f"{x:g}"

    if lo is not None and hi is not None:
        return f"in {g(lo)}..{g(hi)}"
    if lo is not None:
        return f">= {g(lo)}"
    if hi is not None:
        return f"<= {g(hi)}"
    return "finite"


def parse_number(text: str | int | float, what: str, *, kind: type = float,
                 lo: float | None = None, hi: float | None = None) -> int | float:
    """``text`` as ``kind`` (``int`` or ``float``), finite and within ``lo``..``hi``
    (inclusive, ``None``: unbounded on that side). ``NumberError`` otherwise, naming
    ``what`` (``--budget``, ``RINGTUNE_TUNE_SHARE``) and the text. An ``int`` accepts only
    whole numbers (``"3"``, and ``"3.0"`` or ``1e3`` written as a float are refused: a
    count is written as one)."""
    noun = "an integer" if kind is int else "a number"
    expected = f"{what}={text!r}: expected {noun} {_show(lo, hi, kind)}"
    if isinstance(text, bool):
        raise NumberError(expected)
    value: int | float
    if isinstance(text, (int, float)):
        value = text
    else:
        s = str(text).strip()
        # Python's int() would read "1_000" and a 4,000-digit number; neither is meant.
        if not s or len(s) > 64 or "_" in s:
            raise NumberError(expected)
        try:
            value = int(s) if kind is int else float(s)
        except ValueError:
            raise NumberError(expected) from None
    if kind is int and isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise NumberError(expected)
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise NumberError(f"{what}={text!r}: not a finite number; expected {noun} "
                          f"{_show(lo, hi, kind)}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise NumberError(f"{what}={text!r}: out of range; expected {noun} "
                          f"{_show(lo, hi, kind)}")
    return value


def parse_size(text: str | int, what: str = "size", *, hi: int = MAX_SIZE) -> int:
    """``"4K"``, ``"64M"``, ``"1.5G"``, ``"1048576"`` (also ``64MiB``, ``64MB``) → bytes,
    0..``hi``. ``NumberError`` naming ``what`` and the text for anything else (a negative,
    ``inf``, ``nan``, ``1e400``, ``infK``, a size above ``hi``)."""
    if isinstance(text, bool):
        raise NumberError(f"{what}={text!r}: expected a size in bytes, e.g. 64M")
    if isinstance(text, int):
        return int(parse_number(text, what, kind=int, lo=0, hi=hi))
    s = str(text).strip().upper().removesuffix("IB").removesuffix("B") or "0"
    num, suf = (s[:-1], s[-1]) if s[-1] in SIZE_SUFFIXES else (s, "")
    try:
        value = float(num) if len(num) <= 64 and "_" not in num else math.nan
    except ValueError:
        raise NumberError(f"{what}={text!r}: not a size; use bytes or a K/M/G/T suffix, "
                          "e.g. 64M") from None
    if not math.isfinite(value):
        raise NumberError(f"{what}={text!r}: not a finite size; use bytes or a K/M/G/T "
                          "suffix, e.g. 64M")
    if value < 0:
        raise NumberError(f"{what}={text!r}: a size must not be negative")
    total = value * SIZE_SUFFIXES[suf]
    if total > hi:
        raise NumberError(f"{what}={text!r}: too large; at most {hi} bytes "
                          f"({hi >> 40}T)" if hi >= 1 << 40 else
                          f"{what}={text!r}: too large; at most {hi} bytes")
    return int(total)
