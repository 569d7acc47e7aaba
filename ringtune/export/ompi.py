"""Open MPI ``coll/tuned`` dynamic rules (``--mca coll_tuned_use_dynamic_rules 1 --mca
coll_tuned_dynamic_rules_filename FILE``), the classic text format of open-mpi/ompi
``ompi/mca/coll/tuned/coll_tuned_dynamic_file.c``: numbers read one by one with ``%li``
(``#`` starts a comment to the end of the line; anything else that is not a number is
skipped, so every note here is a comment and numbers are plain decimals)::

    1               # collectives in the file
    2               # ALLREDUCE
    1               # communicator sizes
    <world size>
    <message sizes>
    <from bytes> <algorithm> <fan in/out> <segment size>   # one line per size range

Algorithms (``coll_tuned_allreduce_decision.c``): 0 the library's own decision,
1 basic_linear, 2 nonoverlapping, 3 recursive doubling, 4 ring, 5 segmented ring,
6 Rabenseifner (reduce-scatter by recursive halving, all-gather by recursive doubling), and
on 6.0 only 7 allgather_reduce (5.0.x fails the allreduce with MPI_ERR_ARG on it): the set
follows the Open MPI the profile was tuned with (its ``library``), else the installed one,
else 5.0's (``collectives.natives.openmpi``). Maps: a profile tuned with Open MPI names the
algorithms themselves, measured (a rule of ringtune's own algorithms exports the fastest
of Open MPI's own measured for it, the library's decision included); only where nothing of
Open MPI's was measured (a profile tuned with another library, or without ``native``)
does an analogy apply: ``rhd`` → 6 (the same algorithm), ``multiring`` → 4 (5 with its
chunk size as the segment), MPICH's recursive_doubling / ring / reduce_scatter_allgather →
3 / 4 / 6; everything else → 0, noted per rule.

Open MPI applies the rules of the nearest communicator size at or below a communicator's
(so rules for 4 ranks would also drive 64): the file ends with a rule for one rank more
than the largest tuned shape, algorithm 0 at every size, so larger communicators keep the
library's own choice. It falls back silently when the 0-byte rule is missing: the reader
refuses such a file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from collectives.natives.openmpi import known_algorithms
from collectives.profile import Profile

from . import DEFAULT, Segment, shape

ALLREDUCE = 2
COLLCOUNT = 22
#: The library's name in a profile's ``library`` (``collectives.natives.openmpi``).
LIBRARY = "Open MPI"
#: Other libraries whose ``impl`` names this format maps onto its own (``_FROM_MPICH``).
TRANSLATES = ("MPICH",)
#: The release whose algorithms are assumed when neither the profile nor the installed
#: library is an Open MPI.
DEFAULT_VERSION = "5.0"
_FROM_MPICH = {"recursive_doubling": 3, "ring": 4, "reduce_scatter_allgather": 6}


def algorithms(version: str = DEFAULT_VERSION) -> dict[int, str]:
    """Allreduce algorithm id -> name of Open MPI ``version`` (0: its own decision)."""
    return {0: "ignore", **{v: k for k, v in known_algorithms(version).items()}}


#: Open MPI 5.0's algorithms (the readers' default).
ALGORITHMS = algorithms()


def target(profile: Profile) -> tuple[str, bool]:
    """(Open MPI version, tuned with Open MPI): the profile's library where it is an Open
    MPI, else the installed library where it is one (loaded without starting MPI), else
    ``DEFAULT_VERSION``."""
    lib = profile.library
    if lib is not None and lib.name == LIBRARY:
        return lib.version, True
    return installed_version() or DEFAULT_VERSION, False


def installed_version() -> str:
    """The installed Open MPI's version ("" when mpi4py loads another library or none),
    read without initialising MPI when it is not running yet."""
    import re
    import sys

    if "mpi4py.MPI" not in sys.modules:
        try:
            import mpi4py

            mpi4py.rc.initialize = mpi4py.rc.finalize = False
        except ImportError:
            return ""
    try:
        from mpi4py import MPI

        text = MPI.Get_library_version()
    except (ImportError, RuntimeError):
        return ""
    m = re.search(r"Open MPI v(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else ""


def _choice(s: Segment, version: str, own: bool) -> tuple[int, int, str]:
    """(algorithm id, segment size, note) for one segment; ``own``: the profile's impl
    names are Open MPI's (tuned with it)."""
    if own and s.impl != DEFAULT:
        table = known_algorithms(version)
        if s.impl not in table:
            raise ValueError(f"rules[{s.rule}]: impl {s.impl!r} is not an allreduce "
                             f"algorithm of Open MPI {version} (it has "
                             f"{', '.join(table)}): re-tune with this library")
        base = "tuned" if s.note == "tuned" else s.note
        return table[s.impl], 0, f"{s.source} -> {s.impl} ({base})"
    if own and (s.note == "tuned" or s.busbw_gbps is not None):
        # The profile measured this library's own algorithms here and its default was the
        # best of them: an analogy (rhd -> Rabenseifner) was never timed and, run by Open
        # MPI at these sizes, was measured 2.5-4x slower than its default in a plain job.
        why = "" if s.note == "tuned" else f" ({s.note})"
        return 0, 0, f"{s.source} -> the library's own decision{why}"
    if s.algorithm == "rhd":
        return 6, 0, f"{s.source} -> rabenseifner (the same algorithm)"
    if s.algorithm == "multiring":
        rings = int((s.params or {}).get("rings", 1))
        chunk = int((s.params or {}).get("chunk_bytes", 0) or 0)
        more = f"; {rings} rings -> one" if rings > 1 else ""
        if chunk:
            return 5, chunk, f"{s.source} -> segmented_ring, segment {chunk} B{more}"
        return 4, 0, f"{s.source} -> ring{more}"
    if s.impl in _FROM_MPICH and not own:
        alg = _FROM_MPICH[s.impl]
        base = "tuned" if s.note == "tuned" else s.note
        return alg, 0, f"{s.source} -> {ALGORITHMS[alg]} ({base})"
    what = "the library's own decision" if s.impl == DEFAULT else (
        f"the library's own decision: MPICH's {s.impl} has no Open MPI equivalent")
    return 0, 0, f"{s.source} -> {what}" + ("" if s.note == "tuned" else f" ({s.note})")


def render(shapes: Sequence[tuple[Profile, Sequence[Segment]]]) -> tuple[str, list[str]]:
    """The rules text (one communicator size per job shape, then the library's own choice
    for larger communicators) and the per-rule notes."""
    main = shapes[-1][0]
    version, own = target(main)
    largest = max(shape(p)[1] for p, _ in shapes)
    lines = ["# ringtune export: Open MPI coll/tuned dynamic rules",
             f"# profile: {main.path or '-'}",
             f"# algorithms of Open MPI {version}"
             + (" (the profile's library)" if own else ""),
             "1  # collectives in this file", f"{ALLREDUCE}  # ALLREDUCE",
             f"{len(shapes) + 1}  # communicator sizes"]
    notes: list[str] = []
    for profile, segments in shapes:
        _, world = shape(profile)
        rows: list[tuple[int, int, int, str, int]] = []
        for s in segments:
            alg, seg, note = _choice(s, version, own)
            if rows and rows[-1][1:3] == (alg, seg) and rows[-1][4] == s.rule:
                continue
            rows.append((s.min_bytes, alg, seg, note, s.rule))
        lines += [f"{world}  # communicator size",
                  f"{len(rows)}  # message sizes: from_bytes algorithm fan_in_out "
                  "segment_size"]
        for lo, alg, seg, note, rule in rows:
            lines.append(f"{lo} {alg} 0 {seg}  # rules[{rule}]: {note}")
        prefix = f"{world} ranks: " if len(shapes) > 1 else ""
        notes += [f"{prefix}rules[{r[4]}] from {r[0]} B: {r[3]}" for r in rows]
    lines += [f"{largest + 1}  # communicator size: larger than every tuned shape",
              "1  # message sizes",
              "0 0 0 0  # the library's own decision (else the rules above would apply)"]
    text = "\n".join(lines) + "\n"
    parse(text, version)
    here = installed_version() if own else ""
    if here and here != version:
        try:
            parse(text, here)
        except ValueError as exc:
            raise ValueError(f"{main.path or 'profile'} was tuned with Open MPI {version}; "
                             f"the installed Open MPI {here} would fail the allreduce "
                             f"({exc}): re-tune with it") from None
    return text, notes


_TOKEN = re.compile(r"#[^\n]*|[+-]?\d+|\S")


def parse(text: str, version: str = DEFAULT_VERSION
          ) -> dict[int, dict[int, list[tuple[int, int, int, int]]]]:
    """Read a rules file as Open MPI ``version`` does: {collective: {comm size: [(bytes,
    alg, fan, seg), …]}}; ``ValueError`` where Open MPI would stop, fail the call (an
    algorithm it does not have) or silently fall back."""
    known = algorithms(version)
    if text.startswith("rule-file-version-"):
        raise ValueError("rule-file-version-2 files are not written by ringtune")
    nums = [int(t) for t in _TOKEN.findall(text) if not t.startswith("#") and
            re.fullmatch(r"[+-]?\d+", t)]
    pos = 0

    def nxt(what: str) -> int:
        nonlocal pos
        if pos >= len(nums):
            raise ValueError(f"ends before {what}")
        pos += 1
        if nums[pos - 1] < 0:
            raise ValueError(f"{what}: negative ({nums[pos - 1]})")
        return nums[pos - 1]

    out: dict[int, dict[int, list[tuple[int, int, int, int]]]] = {}
    for _ in range(nxt("the number of collectives")):
        coll = nxt("a collective id")
        if coll >= COLLCOUNT:
            raise ValueError(f"collective id {coll} >= {COLLCOUNT}")
        sizes: dict[int, list[tuple[int, int, int, int]]] = {}
        for _ in range(nxt("the number of communicator sizes")):
            comm = nxt("a communicator size")
            rules = []
            for _ in range(nxt("the number of message sizes")):
                rules.append((nxt("a message size"), nxt("an algorithm"), nxt("fan in/out"),
                              nxt("a segment size")))
            if not rules or rules[0][0] != 0:
                raise ValueError(f"communicator size {comm}: no 0-byte rule (Open MPI "
                                 "would silently fall back for small messages)")
            if [r[0] for r in rules] != sorted({r[0] for r in rules}):
                raise ValueError(f"communicator size {comm}: message sizes not increasing")
            bad = [r[1] for r in rules if r[1] not in known]
            if coll == ALLREDUCE and bad:
                raise ValueError(f"communicator size {comm}: allreduce algorithm {bad[0]} is "
                                 f"not one of Open MPI {version}'s (0-{max(known)})")
            sizes[comm] = rules
        out[coll] = sizes
    if pos != len(nums):
        raise ValueError(f"{len(nums) - pos} numbers after the last rule")
    return out
