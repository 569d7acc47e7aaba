"""``ringtune tune --shapes``: tune several job shapes of one allocation in one run and write
them as the sections of one profile (``collectives.profile.shapes`` reads them back).

Each listed size s tunes the sub-communicator of world ranks 0..s-1 (the first s ranks, as
a data-parallel group or a smaller job on the same hosts would be), largest first, while
the other ranks wait. The largest becomes the profile's top level; the others become
``tuned`` sections. Every other world size up to the allocation (on large allocations:
the likely ones, see ``predicted_sizes``) gets a ``predicted`` section: per bucket, the
cost model ranks the nearest tuned shape's winner (where its parameters fit the new size),
its own best guesses and ``native`` for the new size, and the fastest predicted wins;
``explain`` says the rules are predicted, not measured.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

from collectives.algorithms import get_algorithm
from collectives.profile import write_profile
from collectives.profile.document import profile_document

from .records import TuneError, TuneOptions, TuneResult


def parse_shapes(text: str, world_size: int) -> list[int]:
    """``"1,2,4"`` → [1, 2, 4]; ``ValueError`` (bad input) for a size that is not a
    positive integer or is larger than the allocation."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ValueError(f"--shapes {text!r}: {part!r} is not a rank count") from None
        if n < 1:
            raise ValueError(f"--shapes {text!r}: rank counts start at 1, got {n}")
        if n > world_size:
            raise ValueError(f"--shapes {text!r}: a {n}-rank shape is larger than this "
                             f"allocation ({world_size} ranks); launch at least {n} ranks "
                             "(-np) or drop it")
        out.add(n)
    if not out:
        raise ValueError(f"--shapes {text!r}: give rank counts, e.g. 1,2,4")
    return sorted(out)


def tune_shapes(comm: Any, opts: TuneOptions, sizes: Sequence[int]) -> TuneResult:
    """Tune every shape in ``sizes`` (collective over ``comm``); rank 0 writes the profile."""
    from mpi4py import MPI

    from .machine import job_pids
    from .tuning import refusal, tune

    t0 = time.monotonic()
    rank = comm.Get_rank()
    names = comm.allgather(MPI.Get_processor_name())
    # The whole allocation's ranks are the job's: those outside a shape's sub-communicator
    # spin at the barrier below and are no "other processes" (autotune.machine).
    opts.job_pids = job_pids(comm)
    results: dict[int, TuneResult] = {}
    for s in sorted(sizes, reverse=True):
        sub = comm.Split(0 if rank < s else MPI.UNDEFINED, rank)
        if sub != MPI.COMM_NULL:
            res = tune(sub, copy.copy(opts), write=False)
            if rank == 0:
                results[s] = res
            sub.Free()
        comm.Barrier()
    busy = comm.bcast(next((r.busy for r in results.values() if r.busy), ""), root=0)
    if busy and opts.busy == "refuse":
        raise TuneError(refusal(busy, opts.out), usage=True)  # every rank, after all shapes
    profile: dict[str, Any] | None = None
    if rank == 0:
        profile = combine({s: r.profile for s, r in results.items()}, comm.Get_size(),
                          names, time.monotonic() - t0)
        write_profile(profile, opts.out)
    profile = comm.bcast(profile, root=0)
    main = max(sizes)
    first = results.get(main)
    return TuneResult(profile, first.buckets if first else [],
                      first.choices if first else [], time.monotonic() - t0, opts.out)


def combine(profiles: Mapping[int, Mapping[str, Any]], world_size: int,
            hostnames: Sequence[str], seconds: float) -> dict[str, Any]:
    """One profile: the largest tuned shape at the top level, the other tuned shapes and a
    predicted section for every untuned world size up to ``world_size``."""
    main = max(profiles)
    sections: list[dict[str, Any]] = []
    for s in sorted(profiles):
        if s != main:
            sections.append({"topology": dict(profiles[s]["topology"]),
                             "rules": list(profiles[s]["rules"]), "source": "tuned"})
    for w in predicted_sizes(world_size, hostnames):
        if w in profiles:
            continue
        nearest = min(profiles, key=lambda s: (abs(s - w), -s))
        sections.append({"topology": _topology(w, hostnames),
                         "rules": predict(profiles[nearest], w),
                         "source": "predicted", "from_world_size": nearest})
    sections.sort(key=lambda sec: sec["topology"]["world_size"])
    tuning = dict(profiles[main].get("tuning") or {})
    tuning["shapes"] = sorted(profiles)
    tuning["seconds"] = round(seconds, 1)
    # The one profile document builder (collectives.profile.document): the largest shape's
    # document, its sections (none: no key) and the run's tuning header.
    return profile_document(profiles[main], shapes=sections or None, tuning=tuning)


#: Up to this allocation size every world size gets a section; above it, only the sizes a
#: job is likely to use (so that a 1024-rank allocation does not write 1024 sections).
ALL_SIZES_UP_TO = 64
MAX_PREDICTED = 48


def predicted_sizes(world_size: int, hostnames: Sequence[str]) -> list[int]:
    """World sizes that get a predicted section: all of them on small allocations; else
    the divisors of the allocation and powers of two, then whole hosts (fewest first), at
    most ``MAX_PREDICTED``."""
    if world_size <= ALL_SIZES_UP_TO:
        return list(range(1, world_size + 1))
    per_host = max(1, max(hostnames.count(h) for h in set(hostnames)))
    sizes = {d for d in range(1, world_size + 1) if world_size % d == 0}
    sizes |= {1 << k for k in range(world_size.bit_length()) if 1 << k <= world_size}
    ordered = sorted(sizes)[:MAX_PREDICTED]
    for w in range(per_host, world_size + 1, per_host):  # then whole hosts, fewest first
        if len(ordered) >= MAX_PREDICTED:
            break
        if w not in sizes:
            ordered.append(w)
    return sorted(ordered)


def _topology(w: int, hostnames: Sequence[str]) -> dict[str, Any]:
    first = list(hostnames[:w])
    hosts = len(set(first))
    per_host = max(first.count(h) for h in set(first))
    return {"world_size": w, "hosts": hosts, "ranks_per_host": per_host,
            "summary": f"{hosts} host(s) x {per_host} ranks (predicted)"}


def predict(tuned: Mapping[str, Any], w: int) -> list[dict[str, Any]]:
    """Rules for ``w`` ranks from a tuned profile of another size (see the module doc)."""
    from .choose import rule_bounds
    from .guesses import best_guesses, default_cluster, fit_world
    from .model import Model

    buckets = list((tuned.get("tuning") or {}).get("buckets") or [])
    rules = list(tuned["rules"])
    if not buckets:
        buckets = [int((r.get("measured") or {}).get("bytes") or max(r["min_bytes"], 1))
                   for r in rules]
    tuned_w = int(tuned["topology"]["world_size"])
    model = Model(fit_world(default_cluster(tuned_w), w)) if w > 1 else None
    out: list[dict[str, Any]] = []
    for (lo, hi), b in zip(rule_bounds(buckets), buckets):
        winner = next(r for r in rules if r["min_bytes"] <= b and (
            r["max_bytes"] is None or b <= r["max_bytes"]))
        cands = [(winner["algorithm"], dict(winner.get("params") or {})), ("native", {})]
        if model is not None:
            cands += best_guesses(w, b, calibration=fit_world(default_cluster(tuned_w), w))[:3]
        best: tuple[float, str, dict[str, Any]] | None = None
        for algo, params in cands:
            try:
                get_algorithm(algo).check_params(params, w)
                t = 0.0 if model is None else float(model.time(algo, params, [b])[0])
            except (ValueError, KeyError, TypeError):
                continue  # e.g. a hierarchical grid of the tuned size does not fit w
            if best is None or t < best[0]:
                best = (t, algo, params)
        assert best is not None  # native always fits
        _, algo, params = best
        if out and out[-1]["algorithm"] == algo and out[-1]["params"] == params:
            out[-1]["max_bytes"] = hi
            continue
        out.append({"min_bytes": lo, "max_bytes": hi, "algorithm": algo, "params": params})
    out[-1]["max_bytes"] = None
    return out
