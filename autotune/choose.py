"""Choosing each bucket's configuration and building the profile from the choices.

Use ``ab_choice`` after the search, on every rank (it is collective): it re-measures a
bucket's best candidates and its neighbours' winners against ``native``, interleaved A/B,
and keeps a non-native choice only when it beats native by ``--margin`` and by native's
own measurement noise, and then wins again in every round of a confirmation that times it
and native side by side (``confirm``). Use
``rule_bounds`` and ``build_profile`` to turn the choices into the profile mapping (one rule
per bucket, adjacent equal choices merged).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collectives import Communicator
from collectives.bench import busbw, time_allreduce
from collectives.engines import get_engine
from collectives.ops import itemsize
from collectives.plan import Config
from collectives.profile.document import profile_document, utc_now, written_by
from collectives.registry import fallback_gpu_transport, get_backend

from .objective import timing_for
from .records import BucketSummary, Choice, TuneOptions

#: Share of ``--budget`` kept for the final A/B re-measurement.
AB_SHARE = 0.15
#: Interleaved A/B rounds per bucket; each round times native and every candidate once.
AB_ROUNDS = 3
#: A re-measurement this many times slower or faster than the same run's search measured
#: the same configuration is not noise: measured again, and if it persists the tune stops.
DISAGREEMENT = 10.0
#: ``stop`` (default): such a persistent disagreement stops the tune; ``warn``: one warning
#: and the A/B times are kept (test suites that run more ranks than cores on purpose and
#: check correctness, not speed).
TIMING_CHECK_ENV = "RINGTUNE_TIMING_CHECK"
#: Rounds of the confirmation of a non-native winner: native and the winner side by side,
#: the order alternated so that a drift of the machine's load favours neither.
CONFIRM_ROUNDS = 3


def ab_choice(runtime: Communicator, opts: TuneOptions, summaries: Sequence[BucketSummary],
               i: int) -> Choice:
    """Re-measure the bucket's best candidates (and its neighbours' winners) against
    ``native``, interleaved A/B; a non-native choice must beat native by ``margin``."""
    from collectives.bench import check_allreduce

    s = summaries[i]
    n = runtime.size
    nbytes = s.nbytes
    count = nbytes // itemsize(opts.dtype)
    from collectives.registry import backend_names

    backend = opts.backend if opts.backend in backend_names() else "numpy"  # auto: host

    def check(c: Config) -> bool:
        return check_allreduce(runtime, count, opts.dtype, opts.op, c.algorithm,
                               dict(c.params), transport=c.transport, backend=backend).ok

    def timed(c: Config, warmup: int, iters: int) -> float:
        # Each candidate is re-measured with its own transport (GPU configurations).
        return time_allreduce(runtime, count, opts.dtype, opts.op, c.algorithm,
                              dict(c.params), warmup=warmup, iters=iters,
                              transport=c.transport, backend=backend).time_us

    native, own, borrowed = ab_candidates(opts, summaries, i, n)
    cands: list[Config] = []
    keys = {native.key}
    for c in own + borrowed:
        if c.key in keys:
            continue
        if c not in own:
            # A neighbour's winner was checked at its own size only.
            ok = check(c)
            runtime.clear_plans()
            if not ok:
                continue
        keys.add(c.key)
        cands.append(c)
    timing = timing_for(timed(native, warmup=1, iters=3), target_s=0.1)
    everyone: list[Config] = [native] + cands
    times: list[list[float]] = [[] for _ in everyone]
    for _ in range(AB_ROUNDS if cands else 1):
        for j, c in enumerate(everyone):
            times[j].append(timed(c, timing.warmup, timing.iters))
    runtime.clear_plans()
    med = [_median(t) for t in times]
    again = check_against_search(s, everyone, med,
                                 lambda c: timed(c, timing.warmup, timing.iters))
    for j, t in again.items():
        times[j], med[j] = [t], t
    runtime.clear_plans()
    native_t = med[0]
    best_j = min(range(len(everyone)), key=lambda j: med[j])
    note = ""
    if best_j != 0 and med[best_j] * (1 + opts.margin) > native_t:
        best_j = 0  # not a clear enough win over native: keep the library's own
        note = f"native kept: the best candidate did not beat it by --margin {opts.margin:g}"
    if best_j != 0:
        winner = everyone[best_j]
        pairs: list[tuple[float, float]] = []
        for r in range(CONFIRM_ROUNDS):
            if r % 2 == 0:
                nat = timed(native, timing.warmup, timing.iters)
                win = timed(winner, timing.warmup, timing.iters)
            else:
                win = timed(winner, timing.warmup, timing.iters)
                nat = timed(native, timing.warmup, timing.iters)
            pairs.append((nat, win))
        runtime.clear_plans()
        times[0] += [nat for nat, _ in pairs]
        times[best_j] += [win for _, win in pairs]
        native_t = med[0] = _median(times[0])
        med[best_j] = _median(times[best_j])
        verdict = confirm(times[0], times[best_j], pairs, opts.margin)
        if verdict:
            best_j, note = 0, f"native kept: {winner.text()} {verdict}"
    unstable, spread = ab_stability(times, best_j, opts.margin)
    return Choice(nbytes, everyone[best_j], med[best_j], native_t,
                  busbw(nbytes, med[best_j], n), busbw(nbytes, native_t, n),
                  [(everyone[j], med[j]) for j in range(len(med))], note=note,
                  unstable=unstable, spread=round(spread, 4))


def spread_of(times: Sequence[float]) -> float:
    """How far one configuration's A/B rounds scatter: (max - min) / median; 0 for fewer
    than two rounds."""
    mid = _median(times)
    return (max(times) - min(times)) / mid if len(times) > 1 and mid > 0 else 0.0


def ab_stability(times: Sequence[Sequence[float]], chosen: int,
                 margin: float) -> tuple[bool, float]:
    """``(unstable, spread)`` of a bucket's A/B: ``times[j]`` are configuration ``j``'s
    rounds (native first), ``chosen`` the index kept. The runner-up is native when a
    candidate was chosen, else the fastest candidate; the spread is the larger of the two's
    (``spread_of``). Unstable when that spread exceeds both the difference between the two
    medians (relative to the chosen's) and ``margin``: the rounds scatter more than the gap
    the choice rests on, so on a quieter machine it could go the other way. Using the
    margin as a floor keeps a near-tie that native kept (a clear "no gain") unmarked on an
    idle machine's ordinary few-percent scatter."""
    meds = [_median(t) for t in times]
    if chosen != 0:
        runner = 0
    else:
        others = [j for j in range(1, len(times)) if meds[j] > 0]
        if not others:
            return False, 0.0
        runner = min(others, key=lambda j: meds[j])
    if meds[chosen] <= 0 or meds[runner] <= 0:
        return False, 0.0
    spread = max(spread_of(times[chosen]), spread_of(times[runner]))
    difference = abs(meds[runner] / meds[chosen] - 1)
    return spread > max(difference, margin), spread


def check_against_search(summary: BucketSummary, configs: Sequence[Config],
                         medians: Sequence[float],
                         remeasure: Callable[[Config], float]) -> dict[int, float]:
    """Compare each A/B median with what this run's search measured for the same
    configuration at the same size. One that disagrees by more than ``DISAGREEMENT`` times
    is measured once more (``remeasure``: collective, as every timing); if it still
    disagrees, ``TuneError`` (every rank sees the same agreed times) names the likely cause
    and nothing is written (``RINGTUNE_TIMING_CHECK=warn``: a warning, the times kept);
    else returns ``{index: the new time}`` to use instead."""
    from .records import TuneError

    search: dict[Any, float] = {c.key: t for c, t in summary.top}
    for c, t in summary.best_by_algorithm.values():
        search.setdefault(c.key, t)
    out: dict[int, float] = {}
    for j, c in enumerate(configs):
        ref = search.get(c.key)
        if not ref or ref <= 0 or medians[j] <= 0 or _apart(medians[j], ref) <= DISAGREEMENT:
            continue
        t = remeasure(c)
        if t > 0 and _apart(t, ref) <= DISAGREEMENT:
            out[j] = t
            continue
        error = TuneError(
            f"bucket {summary.nbytes} B: {c.text()} took {medians[j]:.1f} us, then "
            f"{t:.1f} us, when re-measured against native, but {ref:.1f} us in this run's "
            f"search ({_apart(t if t > 0 else medians[j], ref):.0f}x apart): the timings "
            "cannot be trusted, so no profile was written; the likely cause is unpinned or "
            "oversubscribed ranks (more ranks than cores, or mpiexec --oversubscribe, which "
            "leaves ranks unbound, or other work on the cores): tune with at most one rank "
            "per core, bound to it")
        if timing_check() == "stop":
            raise error
        import warnings

        warnings.warn(f"{error} ({TIMING_CHECK_ENV}=warn: kept)", RuntimeWarning,
                      stacklevel=2)
    return out


def timing_check() -> str:
    """``RINGTUNE_TIMING_CHECK``: ``stop`` (default) or ``warn``; ``TuneError`` (bad input)
    for anything else."""
    import os

    from .records import TuneError

    value = os.environ.get(TIMING_CHECK_ENV, "stop").strip().lower() or "stop"
    if value not in ("stop", "warn"):
        raise TuneError(f"{TIMING_CHECK_ENV}={value!r}: expected stop or warn", usage=True)
    return value


def _apart(a: float, b: float) -> float:
    """How many times apart two positive times are (>= 1)."""
    return max(a, b) / min(a, b)


def noise(times: Sequence[float]) -> float:
    """Relative measurement noise of one configuration timed in several rounds: half the
    range over the median (a configuration no faster than native can look this much faster
    than native's median by chance)."""
    if len(times) < 2:
        return 0.0
    mid = _median(times)
    return (max(times) - min(times)) / (2 * mid) if mid > 0 else 0.0


def confirm(native_times: Sequence[float], winner_times: Sequence[float],
            pairs: Sequence[tuple[float, float]], margin: float) -> str:
    """Why a non-native winner is not kept, or "" when it is: it must beat native by
    ``margin`` in every confirmation round (``pairs``: native's and its time, side by side)
    and, over all rounds, by more than native's own noise (``noise``)."""
    lost = [k + 1 for k, (nat, win) in enumerate(pairs) if win * (1 + margin) >= nat]
    if lost:
        return (f"lost to native (by --margin {margin:g}) in confirmation round(s) "
                f"{', '.join(map(str, lost))} of {len(pairs)}")
    need = max(margin, noise(native_times))
    gain = _median(native_times) / _median(winner_times) - 1 if _median(winner_times) else 0
    if gain <= need:
        return (f"beat native by {100 * gain:.1f}%, within native's measurement noise "
                f"({100 * noise(native_times):.1f}%)")
    return ""


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else 0.0


def ab_candidates(opts: TuneOptions, summaries: Sequence[BucketSummary], i: int,
                  world_size: int) -> tuple[Config, list[Config], list[Config]]:
    """What bucket ``i``'s A/B compares: ``(native, its own two best, its neighbours'
    winners)``; with ``--margin`` all that its choice depends on besides the timings."""
    s = summaries[i]
    own = [c for c, _ in s.top[:2]]
    if "native" in s.best_by_algorithm:
        # The best of the library's own algorithms is re-measured too: it is what
        # `ringtune export` writes for the bucket when the winner has no native equivalent.
        own.append(s.best_by_algorithm["native"][0])
    borrowed = [c for j in (i - 1, i + 1) if 0 <= j < len(summaries)
                for c, _ in summaries[j].top[:1]]
    return native_config(opts, world_size), own, borrowed


def native_config(opts: TuneOptions, world_size: int) -> Config:
    """The reference every choice must beat: ``native``, on GPU buffers with the best
    transport every rank has (NCCL's allReduce where ``nccl`` is available)."""
    if opts.transports and world_size > 1:
        return Config("native", {}, opts.transports[0])
    return Config("native")


def rule_bounds(buckets: Sequence[int]) -> list[tuple[int, int | None]]:
    """Size range of each bucket's rule: from the geometric midpoint with the previous
    bucket (0 for the first) to just below the midpoint with the next (open for the last)."""
    starts = [0] + [int(math.sqrt(a * b)) for a, b in zip(buckets, buckets[1:])]
    return [(lo, starts[k + 1] - 1 if k + 1 < len(starts) else None)
            for k, lo in enumerate(starts)]


def build_profile(identity: Mapping[str, Any], opts: TuneOptions,
                  summaries: Sequence[BucketSummary], choices: Sequence[Choice],
                  seconds: float, algorithms: Sequence[str],
                  engine: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The profile mapping: one rule per bucket, adjacent equal choices merged.

    Host buffers: ``backend: numpy``, ``transport: mpi``. GPU buffers (``opts.backend``
    ``cupy``): ``backend: cupy``, the top-level ``transport`` is the one most rules use, and
    a rule whose transport differs names its own. ``engine``: what the engine the run
    went over says of itself (``Engine.describe``; default the ``mpi`` engine), recorded
    as the profile's ``engine``; under MPI the library and its version are recorded too
    (``library``), under torch.distributed torch's version is the engine's."""
    gpu = opts.backend == "cupy"
    described = dict(engine or {"engine": "mpi"})
    ran_over = get_engine(described.get("engine", "mpi"))
    rules: list[dict[str, Any]] = []
    for (lo, hi), c in zip(rule_bounds([s.nbytes for s in summaries]), choices):
        params, transport = dict(c.params), c.transport
        measured = {"bytes": c.nbytes, "busbw_gbps": round(c.busbw_gbps, 4),
                    "time_us": round(c.time_us, 2),
                    "native_busbw_gbps": round(c.native_busbw_gbps, 4),
                    "native_time_us": round(c.native_time_us, 2),
                    "speedup": round(c.speedup, 3)}
        if c.unstable:
            # Written only when true: a quiet machine's profile keeps its bytes.
            measured.update(unstable=True, ab_spread=round(c.spread, 4))
        if gpu and transport is None:
            # A configuration without one (a world of one rank) ran with the best transport.
            transport = (opts.transports or [fallback_gpu_transport()])[0]
        native = best_native(c, opts.margin)
        if (rules and rules[-1]["algorithm"] == c.algorithm and rules[-1]["params"] == params
                and rules[-1].get("transport") == transport):
            # Same choice as the previous bucket: one rule; keep the larger size's figures.
            rules[-1]["max_bytes"] = hi
            earlier = rules[-1]["measured"]
            if earlier.get("unstable") and not measured.get("unstable"):
                # A merged rule is unstable when any of its buckets' choices was.
                measured.update(unstable=True, ab_spread=earlier["ab_spread"])
            rules[-1]["measured"] = measured
            rules[-1].setdefault("native", []).extend(native)
            continue
        rule: dict[str, Any] = {"min_bytes": lo, "max_bytes": hi, "algorithm": c.algorithm,
                                "params": params}
        if gpu:
            rule["transport"] = transport
        rule["measured"] = measured
        if native:
            rule["native"] = native
        rules.append(rule)
    default_transport = ran_over.default_transport(None, get_backend("numpy"))
    if gpu:
        default_transport = _most_common([r["transport"] for r in rules],
                                          list(opts.transports or []))
        for r in rules:
            if r["transport"] == default_transport:
                del r["transport"]  # the profile's own transport applies
    # The one profile document builder (collectives.profile.document): the format's name
    # and version, the header, the key order. No library where the engine has none.
    return profile_document(
        **written_by(_created(choices)),
        library=ran_over.library(gpu),
        engine=ran_over.record(described),
        topology=dict(identity),
        backend="cupy" if gpu else "numpy",
        transport=default_transport,
        dtype=opts.dtype,
        op=opts.op,
        rules=rules,
        tuning={
            "trials": sum(s.evaluated for s in summaries),
            "seconds": round(seconds, 1),
            **({"ran": ran} if (ran := _ran(summaries, choices)) else {}),
            "sampler": {"tpe": "TPESampler", "random": "RandomSampler",
                        "grid": "grid (every configuration enqueued)"}[opts.sampler],
            "seed": opts.seed,
            "storage": opts.storage,
            "study": summaries[0].study.rsplit("-", 3)[0] if summaries else opts.study,
            "buckets": [s.nbytes for s in summaries],
            "trials_per_bucket": opts.trials,
            "budget_s": opts.budget_s,
            "margin": opts.margin,
            "algorithms": list(algorithms),
            **({"transports": list(opts.transports or [])} if gpu else {}),
        },
    )


def _created(choices: Sequence[Choice]) -> str:
    """When the profile's content was measured: the latest A/B of its choices (recorded in
    the storage, so a rerun that reuses them writes the same date), else now."""
    stamps = [c.measured_at for c in choices if c.measured_at]
    if stamps and len(stamps) == len(choices):
        return max(stamps)
    return utc_now()


def _ran(summaries: Sequence[BucketSummary], choices: Sequence[Choice]) -> str | None:
    """``FIRST/LAST`` (ISO 8601 interval, UTC): from the first trial to the last A/B, over
    every run that contributed; ``None`` without recorded trial times."""
    firsts = [s.first_trial for s in summaries if s.first_trial]
    lasts = [t for s in summaries for t in (s.last_trial,) if t]
    lasts += [c.measured_at for c in choices if c.measured_at]
    if not firsts or not lasts:
        return None
    return f"{min(firsts)}/{max(lasts)}"


def best_native(c: Choice, margin: float = 0.0) -> list[dict[str, Any]]:
    """The fastest ``native`` configuration of the bucket's A/B (the library's default or
    one of its own algorithms), as the one-entry list a rule's ``native`` key holds.

    One of the library's own algorithms replaces its default only when it beat the default
    by ``margin`` (the tuner's ``--margin``), as any non-native choice must: ``ringtune
    export`` writes this entry into the library's file, and a plain job should not run an
    algorithm that was faster only within the timings' noise."""
    natives = [(cfg, t) for cfg, t in c.candidates if cfg.algorithm == "native" and t > 0]
    if not natives:
        return []
    best, t = min(natives, key=lambda ct: ct[1])
    default = [(cfg, u) for cfg, u in natives
               if str(cfg.params.get("impl", "auto")) == "auto"
               and str(cfg.params.get("composition", "auto")) == "auto"]
    if default and best is not default[0][0] and t * (1 + margin) > default[0][1]:
        best, t = default[0]
    n = c.native_busbw_gbps * c.native_time_us  # busbw · time is constant for a size
    entry: dict[str, Any] = {"bytes": c.nbytes, "impl": str(best.params.get("impl", "auto"))}
    composition = str(best.params.get("composition", "auto"))
    if composition != "auto":
        # Part of what was measured: `ringtune export` writes it to the library's file.
        entry["composition"] = composition
    entry.update(busbw_gbps=round(n / t, 4) if n else 0.0, time_us=round(t, 2))
    return [entry]


def _most_common(names: Sequence[str], preference: Sequence[str]) -> str:
    """The name used most often; a tie goes to the one earlier in ``preference`` (best
    first), then to the one seen first."""
    if not names:
        return preference[0] if preference else fallback_gpu_transport()
    counts = Counter(names)

    def rank(name: str) -> tuple[int, int, int]:
        pref = preference.index(name) if name in preference else len(preference)
        return (-counts[name], pref, names.index(name))

    return min(counts, key=rank)
