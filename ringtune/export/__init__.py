"""``ringtune export``: a profile's choices as the native library's own tuning file.

Use ``plan(profile)`` to turn a profile's rules into native choices per size range, then a
format module's ``render(plan, profile)`` (``mpich``, ``nccl``, ``ompi``) for the file text
and its ``parse`` to read such a file back (the readers follow each library's grammar and
are what the tests check the writers against). A rule that already is ``native`` exports as
itself; a rule of ringtune's own algorithms (which no library has) exports as the best
native candidate measured for each of its buckets (the rule's ``native`` list), and every
such substitution is reported, per rule, in the file's comments or on stderr.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectives.plan import config_text
from collectives.profile import Profile

#: The library's own selection (no line / its built-in choice in the exported file).
DEFAULT = "auto"
FORMATS = ("mpich", "nccl", "ompi")


def format_of(profile: Profile) -> str:
    """The export format of the MPI library ``profile`` was tuned with, as its module in
    ``collectives.natives`` names it (``NativeLibrary.export_format``); ``UsageError``
    where the profile records none or its library has no file of its own."""
    from collectives.natives import for_name
    from ringtune.errors import UsageError

    name = profile.library.name if profile.library is not None else ""
    fmt = for_name(name).export_format if name else ""
    if not fmt:
        why = (f"it was tuned with {name}, which has no tuning file ringtune writes" if name
               else "it records no MPI library")
        raise UsageError(f"{profile.path}: give --format ({', '.join(FORMATS)}): {why}")
    return fmt


@dataclass(frozen=True)
class Segment:
    """One size range of the export: a native algorithm (MPICH's name, or ``auto``)."""

    min_bytes: int
    max_bytes: int | None
    impl: str
    #: The profile rule it came from (index) and what it was.
    rule: int
    source: str
    #: Why this native choice: "tuned" (the rule is native) or a substitution note.
    note: str
    #: Measured busbw (GB/s) of the exported choice, when known.
    busbw_gbps: float | None = None
    #: The rule's own algorithm and params (formats that map some of ringtune's algorithms
    #: onto their own, e.g. Open MPI's Rabenseifner for ``rhd``).
    algorithm: str = "native"
    params: Any = None
    #: MPICH's allreduce composition (``native composition=``; ``auto``: its own choice),
    #: exported in MPICH's ch4 selection file (``ringtune.export.mpich.render_ch4``).
    composition: str = DEFAULT


def plan(profile: Profile) -> list[Segment]:
    """The native choice for every size range of ``profile``; ``ValueError`` when no rule
    has a native equivalent or a native measurement (nothing to export)."""
    out: list[Segment] = []
    mappable = 0
    for i, rule in enumerate(profile.rules):
        source = config_text(rule.algorithm, rule.params)
        if rule.algorithm == "native":
            mappable += 1
            impl = str(rule.params.get("impl", DEFAULT))
            busbw = (rule.measured or {}).get("busbw_gbps")
            out.append(Segment(rule.min_bytes, rule.max_bytes, impl, i, source, "tuned",
                               busbw, rule.algorithm, dict(rule.params),
                               str(rule.params.get("composition", DEFAULT))))
            continue
        entries = sorted(_native_entries(profile, i), key=lambda e: e.bytes)
        if not entries:
            out.append(Segment(rule.min_bytes, rule.max_bytes, DEFAULT, i, source,
                               f"{source} has no native equivalent and no native "
                               "measurement: the library's own selection", None,
                               rule.algorithm, dict(rule.params)))
            continue
        mappable += 1
        lo = rule.min_bytes
        for k, e in enumerate(entries):
            if k + 1 < len(entries):
                # Split at the geometric midpoint of two measured buckets (as rules are).
                cut = max(lo, int(math.sqrt(e.bytes * entries[k + 1].bytes)) - 1)
                hi: int | None = cut if rule.max_bytes is None else min(cut, rule.max_bytes)
            else:
                hi = rule.max_bytes
            what = ("the library's own selection" if e.impl == DEFAULT else f"its {e.impl}")
            note = (f"{source} has no native equivalent: exported the best native "
                    f"candidate measured at {e.bytes} B, {what} "
                    f"({e.busbw_gbps:g} GB/s vs {source}'s "
                    f"{(rule.measured or {}).get('busbw_gbps', 'n/a')} GB/s)")
            out.append(Segment(lo, hi, e.impl, i, source, note,
                               float(e.busbw_gbps), rule.algorithm, dict(rule.params),
                               e.composition or DEFAULT))
            if hi is None:
                break
            lo = hi + 1
    if not mappable:
        raise ValueError(f"{profile.path or 'profile'}: no rule has a native equivalent "
                         "and none records a native measurement (rules[*].native): "
                         "nothing to export; re-tune with this ringtune (it records the "
                         "best native candidate per bucket) or with native among "
                         "--algo")
    return out


def merged(segments: Sequence[Segment]) -> list[Segment]:
    """Adjacent segments with the same native choice as one (formats with one line per
    range); the notes of the merged ones are kept in the first's rule index order."""
    out: list[Segment] = []
    for s in segments:
        if (out and out[-1].impl == s.impl and out[-1].composition == s.composition
                and out[-1].note == "tuned" == s.note):
            last = out[-1]
            out[-1] = Segment(last.min_bytes, s.max_bytes, last.impl, last.rule, last.source,
                              last.note, last.busbw_gbps, last.algorithm, last.params,
                              last.composition)
        else:
            out.append(s)
    return out


def _native_entries(profile: Profile, i: int) -> list[Any]:
    """Rule ``i``'s ``native`` entries (``NativeRecord``s of the validated profile)."""
    rules = profile.record.rules if profile.record is not None else ()
    return list(rules[i].native or ()) if i < len(rules) else []


def shape(profile: Profile) -> tuple[int | None, int]:
    """(hosts, world size) the profile was tuned for (hosts None when unknown)."""
    hosts = profile.topology.hosts if profile.topology is not None else None
    return hosts, int(profile.world_size or 1)
