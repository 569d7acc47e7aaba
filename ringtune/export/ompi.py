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
3 recursive doubling, 4 ring, 5 segmented ring, 6 Rabenseifner (reduce-scatter by recursive
halving, all-gather by recursive doubling). Maps: ``rhd`` → 6 (the same algorithm),
``multiring`` → 4 (5 with its chunk size as the segment), MPICH's recursive_doubling /
ring / reduce_scatter_allgather → 3 / 4 / 6; everything else → 0, noted per rule. Open MPI
falls back silently when the 0-byte rule is missing: the reader refuses such a file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from collectives.profile import Profile

from . import DEFAULT, Segment, shape

ALLREDUCE = 2
COLLCOUNT = 22
ALGORITHMS = {0: "ignore", 1: "basic_linear", 2: "nonoverlapping", 3: "recursive_doubling",
              4: "ring", 5: "segmented_ring", 6: "rabenseifner", 7: "allgather_reduce"}
_FROM_MPICH = {"recursive_doubling": 3, "ring": 4, "reduce_scatter_allgather": 6}


def _choice(s: Segment) -> tuple[int, int, str]:
    """(algorithm id, segment size, note) for one segment."""
    if s.algorithm == "rhd":
        return 6, 0, f"{s.source} -> rabenseifner (the same algorithm)"
    if s.algorithm == "multiring":
        rings = int((s.params or {}).get("rings", 1))
        chunk = int((s.params or {}).get("chunk_bytes", 0) or 0)
        more = f"; {rings} rings -> one" if rings > 1 else ""
        if chunk:
            return 5, chunk, f"{s.source} -> segmented_ring, segment {chunk} B{more}"
        return 4, 0, f"{s.source} -> ring{more}"
    if s.impl in _FROM_MPICH:
        alg = _FROM_MPICH[s.impl]
        base = "tuned" if s.note == "tuned" else s.note
        return alg, 0, f"{s.source} -> {ALGORITHMS[alg]} ({base})"
    what = "the library's own decision" if s.impl == DEFAULT else (
        f"the library's own decision: MPICH's {s.impl} has no Open MPI equivalent")
    return 0, 0, f"{s.source} -> {what}" + ("" if s.note == "tuned" else f" ({s.note})")


def render(shapes: Sequence[tuple[Profile, Sequence[Segment]]]) -> tuple[str, list[str]]:
    """The rules text (one communicator size per job shape) and the per-rule notes."""
    main = shapes[-1][0]
    lines = ["# ringtune export: Open MPI coll/tuned dynamic rules",
             f"# profile: {main.path or '-'}",
             "1  # collectives in this file", f"{ALLREDUCE}  # ALLREDUCE",
             f"{len(shapes)}  # communicator sizes"]
    notes: list[str] = []
    for profile, segments in shapes:
        _, world = shape(profile)
        rows: list[tuple[int, int, int, str, int]] = []
        for s in segments:
            alg, seg, note = _choice(s)
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
    text = "\n".join(lines) + "\n"
    parse(text)
    return text, notes


_TOKEN = re.compile(r"#[^\n]*|[+-]?\d+|\S")


def parse(text: str) -> dict[int, dict[int, list[tuple[int, int, int, int]]]]:
    """Read a rules file as Open MPI does: {collective: {comm size: [(bytes, alg, fan,
    seg), …]}}; ``ValueError`` where Open MPI would stop or silently fall back."""
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
            if coll == ALLREDUCE and any(r[1] not in ALGORITHMS for r in rules):
                raise ValueError(f"communicator size {comm}: unknown allreduce algorithm")
            sizes[comm] = rules
        out[coll] = sizes
    if pos != len(nums):
        raise ValueError(f"{len(nums) - pos} numbers after the last rule")
    return out
