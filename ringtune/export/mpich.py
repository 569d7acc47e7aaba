"""MPICH's collective-selection JSON (``MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE``).

The file replaces MPICH's whole built-in selection tree (every collective), so the export
starts from the *installed* library's own tree (the ``MPII_coll_generic_json`` string inside
its libmpi) and replaces only the allreduce intra-communicator branch:

    "collective=allreduce": {"comm_type=intra": {
        "is_op_built_in=yes": {                 # ringtune tunes built-in ops
            "count<pow2": <the library's own branch>,   # tiny counts: restrictions of
            "avg_msg_size<=HI": {"algorithm=MPIR_Allreduce_intra_X": {params}}, ...
            "avg_msg_size=any": {...}},
        "is_op_built_in=no": <the library's own branch>}}

(grammar: pmodels/mpich ``src/mpi/coll/src/csel.c`` and ``csel_container.c``). MPICH's
selection runs an algorithm without its restriction checks, hence the guards: built-in ops
only (so commutative), counts of at least the power of two below the communicator size, and
``smp`` only on a communicator with a node hierarchy. An algorithm's parameters (``k``,
``tree_type``, …) are written explicitly, from the values the library runs them with now
(MPICH leaves unnamed ones uninitialised). JSON has no comments: notes go to stderr.

A rule's ``composition`` (how MPICH's ch4 layer composes the allreduce of intra- and
inter-node parts) is not part of that tree: it is chosen one level up, by ch4's own
selection tree (``MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE``, the
``MPIDI_Allreduce_intra_composition_*`` leaves). ``render_ch4`` writes that second file
where some rule names a composition: the installed library's ch4 tree with the branch for
commutative ops on a communicator spanning nodes replaced by the rules' compositions per
size (``auto`` rules keep the library's own branch).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from collectives.profile import Profile

from . import DEFAULT, Segment

#: The library whose file this is (a profile's ``library.name``); it maps no other's impl names.
LIBRARY = "MPICH"
TRANSLATES: tuple[str, ...] = ()
ENV_FILE = "MPIR_CVAR_COLL_SELECTION_TUNING_JSON_FILE"
CH4_ENV_FILE = "MPIR_CVAR_CH4_COLL_SELECTION_TUNING_JSON_FILE"
#: ``avg_msg_size<=N`` is read with ``atoi``: larger bounds would overflow.
_INT_MAX = 2**31 - 1

#: JSON parameter → control variable the library runs the algorithm with (from
#: ``src/mpi/coll/coll_algorithms.txt``: extra_params / cvar_params).
PARAMS: dict[str, tuple[tuple[str, str], ...]] = {
    "recursive_multiplying": (("k", "MPIR_CVAR_ALLREDUCE_RECURSIVE_MULTIPLYING_KVAL"),),
    "tree": (("tree_type", "MPIR_CVAR_ALLREDUCE_TREE_TYPE"),
             ("k", "MPIR_CVAR_ALLREDUCE_TREE_KVAL"),
             ("chunk_size", "MPIR_CVAR_ALLREDUCE_TREE_PIPELINE_CHUNK_SIZE"),
             ("buffer_per_child", "MPIR_CVAR_ALLREDUCE_TREE_BUFFER_PER_CHILD")),
    "recexch": (("k", "MPIR_CVAR_ALLREDUCE_RECEXCH_KVAL"),
                ("single_phase_recv", "MPIR_CVAR_ALLREDUCE_RECEXCH_SINGLE_PHASE_RECV")),
    "k_reduce_scatter_allgather": (
        ("k", "MPIR_CVAR_ALLREDUCE_RECEXCH_KVAL"),
        ("single_phase_recv", "MPIR_CVAR_ALLREDUCE_RECEXCH_SINGLE_PHASE_RECV")),
}


def container(impl: str) -> str:
    """The selection tree's leaf name of MPICH algorithm ``impl``."""
    if impl == "nb":
        return "algorithm=MPIR_Allreduce_allcomm_nb"
    return f"algorithm=MPIR_Allreduce_intra_{impl}"


def builtin_tree(path: str | None = None, marker: bytes = b"MPIR_Allreduce_intra"
                 ) -> dict[str, Any]:
    """The installed MPICH's built-in selection tree (its libmpi's ``MPII_coll_generic_json``
    string: the one JSON object there that names ``MPIR_Allreduce_intra`` algorithms; with
    ``marker=b"MPIDI_Allreduce_intra_composition"``, ch4's tree of compositions)."""
    lib = path or library_file()
    with open(lib, "rb") as fh:
        data = fh.read()
    key = b'"collective=allreduce"'
    at = data.find(key)
    while at >= 0:
        start, end = data.rfind(b"\0", 0, at) + 1, data.find(b"\0", at)
        blob = data[start:end]
        if marker in blob and blob.lstrip().startswith(b"{"):
            return dict(json.loads(blob.decode()))
        at = data.find(key, at + 1)
    raise ValueError(f"{lib}: no built-in collective-selection tree naming "
                     f"{marker.decode()} found; is this MPICH (>= 4)?")


def library_file() -> str:
    """The libmpi file of the MPICH that mpi4py loaded (from /proc/self/maps)."""
    from mpi4py import MPI  # noqa: F401 - loads the library

    with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            path = line.rsplit(None, 1)[-1] if "/" in line else ""
            if os.path.basename(path).startswith("libmpi.so"):
                return path
    raise ValueError("cannot find the loaded libmpi (no /proc/self/maps entry)")


def leaf(impl: str) -> dict[str, Any]:
    from collectives.natives import mpich

    params: dict[str, Any] = {}
    for key, cvar in PARAMS.get(impl, ()):
        params[f"{key}={mpich.read_cvar(cvar)}"] = {}
    return {container(impl): params}


def allreduce_branch(segments: Sequence[Segment], own: dict[str, Any]) -> dict[str, Any]:
    """The allreduce intra branch for ``segments``, ``own`` being the library's branch."""
    chain: dict[str, Any] = {"count<pow2": copy.deepcopy(own)}
    for k, s in enumerate(segments):
        if s.impl == DEFAULT:
            body = copy.deepcopy(own)
        elif s.impl == "smp":
            body = {"comm_hierarchy=parent": leaf("smp"),
                    "comm_hierarchy=any": copy.deepcopy(own)}
        else:
            body = leaf(s.impl)
        last = k == len(segments) - 1 or s.max_bytes is None or s.max_bytes >= _INT_MAX
        chain["avg_msg_size=any" if last else f"avg_msg_size<={s.max_bytes}"] = body
        if last:
            break
    return {"is_op_built_in=yes": chain, "is_op_built_in=no": copy.deepcopy(own)}


def render(shapes: Sequence[tuple[Profile, Sequence[Segment]]]) -> tuple[str, list[str]]:
    """The JSON text and the notes (for stderr: JSON has no comments). Several job shapes:
    one branch per shape under ``comm_size<=N`` (smallest first), the largest under
    ``comm_size=any``."""
    from collectives.natives import mpich

    why = mpich.unavailable_reason()
    if why:
        raise ValueError(f"--format mpich needs the installed MPICH to read its algorithms "
                         f"and built-in selection: {why}")
    known = set(mpich.native_algorithms())
    for _, segments in shapes:
        for s in segments:
            if s.impl != DEFAULT and s.impl not in known:
                raise ValueError(f"rules[{s.rule}]: MPICH algorithm {s.impl!r} is not in the "
                                 f"installed MPICH ({', '.join(sorted(known))}); re-tune "
                                 "with it")
    tree = builtin_tree()
    allreduce = tree.get("collective=allreduce")
    if not isinstance(allreduce, dict) or "comm_type=intra" not in allreduce:
        raise ValueError("the installed MPICH's built-in tree has no allreduce intra branch")
    own = allreduce["comm_type=intra"]
    if len(shapes) == 1:
        allreduce["comm_type=intra"] = allreduce_branch(shapes[0][1], own)
    else:
        by_size: dict[str, Any] = {}
        for k, (profile, segments) in enumerate(shapes):
            key = ("comm_size=any" if k == len(shapes) - 1
                   else f"comm_size<={profile.world_size}")
            by_size[key] = allreduce_branch(segments, own)
        allreduce["comm_type=intra"] = by_size
    notes = []
    for profile, segments in shapes:
        prefix = f"{profile.world_size} ranks: " if len(shapes) > 1 else ""
        notes += [f"{prefix}rules[{s.rule}] {_range(s)}: {s.source} -> "
                  f"{'MPICH default' if s.impl == DEFAULT else s.impl}"
                  + ("" if s.note == "tuned" else f" ({s.note})") for s in segments]
    return json.dumps(tree, indent=1) + "\n", notes


def composition_leaf(name: str) -> str:
    """ch4's selection-tree leaf of composition ``name`` (``alpha``, ``beta``, …)."""
    return f"composition=MPIDI_Allreduce_intra_composition_{name}"


def file_compositions(path: str | None = None) -> set[str]:
    """The compositions the installed MPICH's ch4 selection file can name (a leaf string
    its parser knows; MPICH 5.0.2 has alpha, beta, gamma: delta only as a control-variable
    value, its parser asserts on a delta leaf)."""
    from collectives.natives.mpich import COMPOSITIONS

    with open(path or library_file(), "rb") as fh:
        data = fh.read()
    return {n for n in COMPOSITIONS if n != DEFAULT
            and composition_leaf(n).encode() + b"\0" in data}


def composition_branch(segments: Sequence[Segment], own: dict[str, Any],
                       known: set[str] | None = None) -> dict[str, Any]:
    """ch4's branch for commutative ops across nodes: each segment's composition by size,
    ``own`` (the library's branch) where the composition is ``auto`` or not in ``known``."""
    chain: dict[str, Any] = {}
    for k, s in enumerate(segments):
        named = s.composition != DEFAULT and (known is None or s.composition in known)
        body = {composition_leaf(s.composition): {}} if named else copy.deepcopy(own)
        last = k == len(segments) - 1 or s.max_bytes is None or s.max_bytes >= _INT_MAX
        chain["avg_msg_size=any" if last else f"avg_msg_size<={s.max_bytes}"] = body
        if last:
            break
    return chain


def render_ch4(shapes: Sequence[tuple[Profile, Sequence[Segment]]]
               ) -> tuple[str, list[str]] | None:
    """ch4's selection file (JSON text and notes) for the rules' compositions, or None
    where every rule leaves the composition to the library."""
    from collectives.natives.mpich import COMPOSITION_CVAR, COMPOSITIONS

    if all(s.composition == DEFAULT for _, segs in shapes for s in segs):
        return None
    for _, segments in shapes:
        for s in segments:
            if s.composition not in COMPOSITIONS:
                raise ValueError(f"rules[{s.rule}]: composition {s.composition!r} is not "
                                 f"one of MPICH's ({', '.join(COMPOSITIONS)})")
    tree = builtin_tree(marker=b"MPIDI_Allreduce_intra_composition")
    try:
        parent = tree["collective=allreduce"]["comm_type=intra"]["comm_size=any"][
            "comm_hierarchy=parent"]
        own = parent["is_commutative=yes"]
    except (KeyError, TypeError):
        raise ValueError("the installed MPICH's ch4 tree has no allreduce branch for "
                         "commutative ops across nodes (comm_size=any / "
                         "comm_hierarchy=parent / is_commutative=yes): cannot place a "
                         "composition") from None
    known = file_compositions()
    if len(shapes) == 1:
        parent["is_commutative=yes"] = composition_branch(shapes[0][1], own, known)
    else:
        parent["is_commutative=yes"] = {
            ("comm_size=any" if k == len(shapes) - 1 else f"comm_size<={p.world_size}"):
            composition_branch(segs, own, known) for k, (p, segs) in enumerate(shapes)}
    notes = [f"rules[{s.rule}] {_range(s)}: composition {s.composition}"
             + ("" if s.composition in known else
                " is not expressible in this MPICH's ch4 selection file (its parser has "
                f"only {', '.join(sorted(known))}): the library's own composition there; "
                f"set {COMPOSITION_CVAR}={COMPOSITIONS[s.composition]} for the whole job "
                "instead")
             for _, segs in shapes for s in segs if s.composition != DEFAULT]
    return json.dumps(tree, indent=1) + "\n", notes


def ch4_path(out: str) -> str:
    """Where the ch4 file goes next to ``out``: ``tuning.json`` -> ``tuning.ch4.json``."""
    root, ext = os.path.splitext(out)
    return f"{root}.ch4{ext or '.json'}"


def _range(s: Segment) -> str:
    return f"{s.min_bytes}..{'' if s.max_bytes is None else s.max_bytes}"


def parse(text: str) -> list[tuple[int | None, str]]:
    """Read an exported file back: the allreduce choices for built-in ops as (upper bound
    of avg_msg_size or None for any, algorithm leaf or ``"<library>"`` for a branch)."""
    return parse_shapes(text).popitem()[1]


def parse_shapes(text: str) -> dict[int | None, list[tuple[int | None, str]]]:
    """Like ``parse``, per communicator-size branch ({N: …} for ``comm_size<=N``, None for
    the last, ``comm_size=any``, or for a file of one shape)."""
    tree = json.loads(text)
    intra = tree["collective=allreduce"]["comm_type=intra"]
    if "is_op_built_in=yes" in intra:
        return {None: _parse_branch(intra)}
    out: dict[int | None, list[tuple[int | None, str]]] = {}
    for key, branch in intra.items():
        size = None if key == "comm_size=any" else int(key.split("<=", 1)[1])
        out[size] = _parse_branch(branch)
    return out


def _parse_branch(intra: dict[str, Any]) -> list[tuple[int | None, str]]:
    branch = intra["is_op_built_in=yes"]
    out: list[tuple[int | None, str]] = []
    for key, body in branch.items():
        if key == "count<pow2":
            continue
        if key.startswith("avg_msg_size<="):
            bound: int | None = int(key.split("<=", 1)[1])
        elif key == "avg_msg_size=any":
            bound = None
        else:
            raise ValueError(f"unexpected key {key!r} in the allreduce branch")
        leaves = [k for k in body if k.startswith("algorithm=")]
        out.append((bound, leaves[0] if len(leaves) == 1 and len(body) == 1
                    else "<library>"))
    return out


def check_with_library(text: str, world: int = 1, ch4_text: str | None = None) -> None:
    """Start the installed MPICH with the file (and ch4's, ``ch4_text``; one process, a few
    allreduces of every exported range): ``ValueError`` with MPICH's own message when it
    rejects a file."""
    code = ("import numpy as np\nfrom mpi4py import MPI\n"
            "for n in (0, 1, 8, 1024, 65536, 1 << 20):\n"
            "    a = np.ones(max(n // 4, 1), np.float32)\n"
            "    MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, a)\n"
            "MPI.COMM_WORLD.Barrier(); MPI.COMM_WORLD.Bcast(np.ones(4), 0)\nprint('ok')\n")
    with tempfile.TemporaryDirectory(prefix="ringtune-export-") as tmp:
        path = os.path.join(tmp, "tuning.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PMI_", "PMIX_", "HYDRA", "MPIR_CVAR_"))}
        env[ENV_FILE] = path
        if ch4_text is not None:
            env[CH4_ENV_FILE] = os.path.join(tmp, "tuning.ch4.json")
            with open(env[CH4_ENV_FILE], "w", encoding="utf-8") as fh:
                fh.write(ch4_text)
        try:
            res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                 timeout=120, env=env)
        except subprocess.TimeoutExpired:
            raise ValueError("the installed MPICH hung reading the exported selection "
                             "file; not written") from None
    bad = [ln for ln in res.stderr.splitlines()
           if "unknown key" in ln or "unrecognized key" in ln or "Assertion" in ln]
    if res.returncode != 0 or bad or res.stdout.strip() != "ok":
        tail = (bad or res.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"the installed MPICH rejects the exported selection file: "
                         f"{tail.strip()[:200]}; not written")
