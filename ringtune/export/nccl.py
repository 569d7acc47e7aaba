"""NCCL's example tuner-plugin CSV (``NCCL_TUNER_CONFIG_FILE``, loaded through
``NCCL_TUNER_PLUGIN``): ``collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,
nRanks[,numPipeOps,regBuff]``, ``-1`` = any, ``#`` comments (grammar: NVIDIA/nccl
``plugins/tuner/example/plugin.c``; lines are read with a 256-byte buffer, so every line,
comments too, is kept shorter). An unknown algorithm or protocol name silently becomes
ring/simple there: the reader here refuses it instead.

What maps: ``multiring rings=R`` is NCCL's ring with R channels (simple protocol). Rules
whose choice is the library's own (``native``) get no line, so NCCL's cost model decides;
so do ringtune's other algorithms, whose best native candidate on GPU buffers is NCCL's own
choice; each such rule is named in a comment.
"""

from __future__ import annotations

from collections.abc import Sequence

from collectives.profile import Profile

from . import Segment, shape

ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOCOLS = ("ll", "ll128", "simple")
COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
MAX_LINE = 255
_SIZE_MAX = 2**64 - 1


def render(shapes: Sequence[tuple[Profile, Sequence[Segment]]]) -> tuple[str, list[str]]:
    """The CSV text and the per-rule notes; one block per job shape (its ``nNodes`` and
    ``nRanks`` scope its lines to that shape)."""
    main = shapes[-1][0]
    lines = ["# ringtune export for NCCL's example tuner plugin (NCCL_TUNER_CONFIG_FILE)",
             f"# profile: {_short(main.path or '-')}",
             "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks"]
    notes: list[str] = []
    for profile, segments in shapes:
        hosts, world = shape(profile)
        nodes = hosts if hosts is not None else -1
        if len(shapes) > 1:
            label = profile.section or "main shape"
            lines.append(f"# shape: {world} ranks, {nodes} nodes ({label})")
        seen: set[int] = set()
        for s in segments:
            if s.rule in seen:
                continue
            seen.add(s.rule)
            rule = profile.rules[s.rule]
            hi = _SIZE_MAX if rule.max_bytes is None else rule.max_bytes
            if rule.algorithm == "multiring":
                rings = int(rule.params.get("rings", 1))
                lines.append(f"# rules[{s.rule}]: {s.source} -> NCCL ring, {rings} "
                             "channel(s)")
                lines.append(f"allreduce,{rule.min_bytes},{hi},ring,simple,{rings},{nodes},"
                             f"{world}")
                continue
            why = ("NCCL's own choice (tuned)" if rule.algorithm == "native"
                   else "no NCCL equivalent: NCCL's own choice, the native candidate")
            note = f"rules[{s.rule}] {rule.min_bytes}..{hi}: {s.source} -> no line, {why}"
            lines.append("# " + note)
            notes.append((f"{world} ranks: " if len(shapes) > 1 else "") + note)
    text = "\n".join(ln[:MAX_LINE] for ln in lines) + "\n"
    parse(text)
    return text, notes


def _short(path: str) -> str:
    return path if len(path) < 120 else "..." + path[-117:]


def parse(text: str) -> list[dict[str, object]]:
    """Read a tuner CSV as the example plugin does (but refuse what it would silently turn
    into ring/simple): the configurations, in file order; ``ValueError`` naming the line."""
    out: list[dict[str, object]] = []
    for no, raw in enumerate(text.split("\n"), 1):
        if len(raw) + 1 > MAX_LINE + 1:
            raise ValueError(f"line {no}: {len(raw)} characters; the plugin reads 255")
        if not raw or raw.startswith("#"):
            continue
        fields = [f.strip(" \t") for f in raw.split(",")]
        if not 8 <= len(fields) <= 10:
            raise ValueError(f"line {no}: {len(fields)} fields, expected 8 to 10")
        coll, lo, hi, algo, proto = fields[:5]
        if coll not in COLLECTIVES:
            raise ValueError(f"line {no}: unknown collective {coll!r}")
        if algo not in ALGORITHMS or proto not in PROTOCOLS:
            raise ValueError(f"line {no}: unknown algorithm/protocol {algo}/{proto}")
        try:
            nums = [int(f) for f in fields[5:]]
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            raise ValueError(f"line {no}: expected integers in fields 2, 3 and 6..") from None
        if not 0 <= lo_i <= hi_i <= _SIZE_MAX or any(n < -1 for n in nums):
            raise ValueError(f"line {no}: bad range {lo_i}..{hi_i} or a value below -1")
        out.append({"collective": coll, "min_bytes": lo_i, "max_bytes": hi_i,
                    "algorithm": algo, "protocol": proto, "channels": nums[0],
                    "nNodes": nums[1], "nRanks": nums[2]})
    return out
