"""The profile document online tuning writes: the loaded profile (or the built-in
defaults' rules for this shape) with each settled size's winner in force around it
(``merge_rules``), other rules and shapes kept, and a ``tuning`` header saying
``mode: online``, assembled by the one profile document builder
(``collectives.profile.document``) as ``ringtune tune``'s is. Use ``tuned_document(tuner)``
(``OnlineTuner.profile_dict``); ``Settled`` is what a settled class records.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..plan import Config
from ..profile.document import plain, profile_document, utc_now, written_by
from .options import OnlineOptions
from .race import SizeClass


@dataclass
class Settled:
    """A settled class on every rank: its winner and what rank 0 measured."""

    config: Config
    calls: int = 0
    time_us: float | None = None
    incumbent_us: float | None = None
    reason: str = ""
    earlier: bool = False  # settled by an earlier job's profile
    #: The fastest of the library's own allreduce measured here: (params, seconds), what
    #: ``ringtune export`` writes for a rule the library cannot run.
    native: tuple[dict[str, Any], float] | None = None


class TunerState(Protocol):
    """What ``tuned_document`` reads of a tuner (``OnlineTuner``)."""

    comm: Any
    opts: OnlineOptions
    job: str
    started_utc: str
    calls: int
    exploring_calls: int
    explore_seconds: float
    #: Sizes an earlier job settled (the loaded profile's ``tuning.online_settled``).
    earlier: frozenset[int]
    classes: dict[Any, SizeClass]
    settled: dict[Any, Settled]


def tuned_document(tuner: TunerState) -> dict[str, Any]:
    """The profile ``tuner``'s job tuned (rank 0's view): the loaded profile (or the
    built-in defaults) with each settled size's rule replaced, merged with its other
    shapes, and the ``tuning`` header."""
    comm = tuner.comm
    prof = comm.profile
    data = _base_document(comm)
    winners: dict[int, Settled] = {}
    for key, st in tuner.settled.items():
        winners.setdefault(key[0] * itemsize(key[1]), st)
    for key, sc in tuner.classes.items():
        nb = key[0] * itemsize(key[1])
        if key in tuner.settled or nb in winners:
            continue
        # Still exploring when the job ended (a size called a few times only, such as
        # DDP's first-step buckets): what was learnt is kept, so the next job does not
        # explore it again.
        b = sc.best()
        win = b[0] if b is not None else 0
        inc = sc.score(0)
        winners[nb] = Settled(sc.candidates[win], sc.calls,
                              None if b is None else b[1] * 1e6,
                              None if inc is None else inc * 1e6,
                              f"job ended after {sc.calls} exploring call(s)")
    base_rules = [dict(r) for r in _section(data, comm.size)["rules"]]
    # Transports that go without saying: the profile's own, and the engine's default
    # for each buffer kind (a job under the same engine maps the profile's to it).
    implied = {prof.transport}
    for key in tuner.settled:
        with contextlib.suppress(Exception):
            from ..registry import get_backend

            implied.add(comm.default_transport(get_backend(key[3])))
    rules = merge_rules(base_rules, {nb: _rule_body(st, nb, comm.size, implied)
                                     for nb, st in winners.items() if not st.earlier})
    section = _section(data, comm.size)
    section["rules"] = rules
    if "source" in section:
        section["source"] = "tuned"
        section.pop("from_world_size", None)
    settled_sizes = sorted(set(tuner.earlier) | set(winners))
    previous = data.get("tuning")
    # The one profile document builder (collectives.profile.document) stamps the header.
    return profile_document(
        data, **written_by(utc_now()),
        # The engine this job ran over, as an offline tune records it: a profile written
        # under torchrun that said nothing would read as MPI's and be set aside there.
        engine=comm.engine.record(comm.engine.describe(comm.comm)),
        # The MPI library's algorithms were not what ran: its record goes.
        **({} if comm.engine.native_library else {"library": None}),
        tuning=_tuning_header(tuner, prof, winners, settled_sizes, previous))


def _tuning_header(tuner: TunerState, prof: Any, winners: Mapping[int, Settled],
                   settled_sizes: list[int], previous: Any) -> dict[str, Any]:
    """The ``tuning`` header of an online job's document (``mode: online``)."""
    return {
        "mode": "online",
        "job": tuner.job,
        "started": tuner.started_utc,
        "ended": utc_now(),
        "calls": tuner.calls,
        "exploring_calls": tuner.exploring_calls,
        "exploring_seconds": round(tuner.explore_seconds, 3),
        "base": prof.path if not prof.builtin else "built-in defaults",
        "options": tuner.opts.record(),
        "online_settled": settled_sizes,
        "classes": [
            {"bytes": nb, "algorithm": st.config.algorithm,
             "params": plain(dict(st.config.params)), "calls": st.calls,
             "reason": st.reason,
             **({"time_us": round(st.time_us, 3)} if st.time_us is not None else {}),
             **({"incumbent_us": round(st.incumbent_us, 3)}
                if st.incumbent_us is not None else {})}
            for nb, st in sorted(winners.items())],
        **({"previous": previous} if isinstance(previous, Mapping) else {}),
    }


def itemsize(dtype: Any) -> int:
    """Bytes per element of ``dtype`` (a plan key's dtype name; bfloat16 included)."""
    import numpy as np

    return int(np.dtype(dtype).itemsize) if str(dtype) != "bfloat16" else 2


def _rule_body(st: Settled, nbytes: int, world: int, implied: set[str],
               ) -> dict[str, Any]:
    from ..ops import busbw

    body: dict[str, Any] = {"algorithm": st.config.algorithm,
                            "params": plain(dict(st.config.params))}
    if st.config.transport and st.config.transport not in implied:
        body["transport"] = st.config.transport
    if st.time_us:
        measured: dict[str, Any] = {"bytes": nbytes, "time_us": round(st.time_us, 3),
                                    "busbw_gbps": round(busbw(nbytes, st.time_us, world), 4)}
        body["measured"] = measured
    if st.native is not None and st.config.algorithm != "native":
        params, seconds = st.native
        entry: dict[str, Any] = {"bytes": nbytes, "impl": str(params.get("impl", "auto")),
                                 "busbw_gbps": round(busbw(nbytes, seconds * 1e6, world), 4),
                                 "time_us": round(seconds * 1e6, 3)}
        if params.get("composition"):
            entry["composition"] = str(params["composition"])
        body["native"] = [entry]
    return body


def merge_rules(base: list[dict[str, Any]], winners: Mapping[int, Mapping[str, Any]],
                ) -> list[dict[str, Any]]:
    """``base`` rules (sorted, contiguous, from 0 to ``None``) with each settled size's
    winner in force around it: from half to twice the size (the neighbourhood a bucket of
    ``ringtune tune``'s powers of 4 owns), within the base rule that holds it and split at
    the geometric midpoint with a settled neighbour; the rest of each base rule keeps its
    choice. Neighbours with the same choice are joined, their ``native`` entries one per
    bucket (a base rule's parts each carry the rule's entries: joined again, they are the
    same entries, kept once), ascending as ``ringtune export`` reads them."""
    out: list[dict[str, Any]] = []
    fresh: set[int] = set()  # the winners' rules in ``out`` (by id)
    sizes = sorted(winners)
    for rule in base:
        lo, hi = int(rule["min_bytes"]), rule["max_bytes"]
        inside = [s for s in sizes if s >= lo and (hi is None or s <= hi)]
        start = lo
        for j, s in enumerate(inside):
            own_lo = max(start, s // 2)
            own_hi = 2 * s
            if j + 1 < len(inside):
                own_hi = min(own_hi, max(s, math.isqrt(s * inside[j + 1])))
            if hi is not None:
                own_hi = min(own_hi, hi)
            if own_lo > start:
                out.append({**rule, "min_bytes": start, "max_bytes": own_lo - 1})
            out.append({"min_bytes": own_lo, "max_bytes": own_hi, **winners[s]})
            fresh.add(id(out[-1]))
            start = own_hi + 1
        if hi is None or start <= hi:
            out.append({**rule, "min_bytes": start, "max_bytes": hi})
    joined: list[dict[str, Any]] = []
    for r in out:
        prev = joined[-1] if joined else None
        if prev is not None and _same_choice(prev, r) and not (
                "measured" in prev and "measured" in r):
            prev["max_bytes"] = r["max_bytes"]
            if "measured" in r:
                prev["measured"] = r["measured"]
            if r.get("native"):
                prev["native"] = _joined_native(prev.get("native") or [], r["native"],
                                                id(r) in fresh)
            continue
        joined.append(dict(r))
    return joined


def _joined_native(kept: list[Any], more: list[Any], fresh: bool) -> list[Any]:
    """``kept``'s and ``more``'s ``native`` entries, one per bucket (``bytes``), ascending:
    where both hold a bucket, ``more``'s replaces it when it is a settled size's
    (``fresh``: measured by this job), else the entry already kept stays."""
    by_bytes = {e.get("bytes"): e for e in kept}
    for e in more:
        if fresh or e.get("bytes") not in by_bytes:
            by_bytes[e.get("bytes")] = e
    return sorted(by_bytes.values(), key=lambda e: int(e.get("bytes") or 0))


def _same_choice(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("algorithm") == b.get("algorithm") and a.get("transport") == b.get("transport")
            and Config(a["algorithm"], a.get("params") or {}) ==
            Config(b["algorithm"], b.get("params") or {}))


def _section(data: dict[str, Any], world: int) -> dict[str, Any]:
    """The mapping holding this world's ``rules`` in a whole profile document: the top level,
    or its ``shapes`` entry of that world size."""
    topo = data.get("topology") or {}
    if topo.get("world_size") == world:
        return data
    for sec in data.get("shapes") or []:
        if (sec.get("topology") or {}).get("world_size") == world:
            return sec  # type: ignore[no-any-return]
    return data


def _base_document(comm: Any) -> dict[str, Any]:
    """The whole document to merge into: the loaded profile file as it is (every shape),
    or a new profile for this world from the built-in defaults."""
    import copy

    prof = comm.profile
    if not prof.builtin and prof.path:
        from safefiles.safeload import InputError, parse_text, read_bounded

        try:
            whole = parse_text(read_bounded(prof.path, "profile"), prof.path)
        except (InputError, OSError):
            whole = None
        if isinstance(whole, Mapping):
            data = copy.deepcopy(dict(whole))
            if (data.get("topology") or {}).get("world_size") == comm.size or any(
                    (s.get("topology") or {}).get("world_size") == comm.size
                    for s in data.get("shapes") or [] if isinstance(s, Mapping)):
                return data
        data = copy.deepcopy(plain(dict(prof.document)))
        data.pop("shapes", None)
        return data
    topo: dict[str, Any] = {"world_size": comm.size}
    hosts = comm.hosts
    nh = len(set(hosts))
    counts = {hosts.count(h) for h in set(hosts)}
    topo["hosts"] = nh
    if len(counts) == 1:
        topo["ranks_per_host"] = counts.pop()
    t = comm.topology
    if t is not None and hasattr(t, "fingerprint"):
        with contextlib.suppress(Exception):
            topo["fingerprint"] = t.fingerprint()
            topo["summary"] = " ".join(str(t.summary()).split())[:200]
    from ..registry import user_transport_names

    # A test-only transport (the in-process ``inproc``) is no profile's: written as mpi.
    transport = prof.transport if prof.transport in user_transport_names() else "mpi"
    library = None
    if comm.engine.native_library:
        with contextlib.suppress(Exception):
            library = comm.engine.library()
    return profile_document(topology=topo, backend=prof.backend, transport=transport,
                            dtype=prof.dtype, op=prof.op,
                            rules=[r.to_dict() for r in prof.rules], library=library)
