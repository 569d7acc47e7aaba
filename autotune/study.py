"""The tuning run: one Optuna study per size bucket, then the A/B choice, then the profile.

Use ``tune(comm, options)`` on every rank of the world to tune (``ringtune tune`` does).
Rank 0 owns the Optuna storage (SQLite has one writer) and asks for each trial; the
trial's configuration is broadcast, every rank checks and times it
(``autotune.objective.evaluate``), and rank 0 tells the result. Every decision that
changes control flow is broadcast from rank 0, so all ranks take the same path and an
error raises the same exception on every rank.

Persistence (DESIGN.md "Tuning procedure" 6–7): each bucket's study is named from the
topology fingerprint, dtype, op and size; a bucket marked ``finished`` in its study is not
searched again; a trial left RUNNING by an interrupted run is marked FAIL ("interrupted")
and its configuration queued again; a trial that exceeded ``--trial-timeout`` is FAIL
("timeout") and its configuration is never run again in that study.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import importlib
import json
import math
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from collectives import Communicator, __version__
from collectives.bench import time_allreduce
from collectives.profile import FORMAT, VERSION, builtin_profile, write_profile

from . import space
from .objective import COMPLETE, FAIL, PRUNED, TrialOutcome, busbw, evaluate, timing_for
from .watchdog import Watchdog

SAMPLERS = ("tpe", "random", "grid")

#: Consecutive proposals of already-measured configurations after which a bucket's space
#: counts as exhausted (the sampler keeps proposing what it knows).
MAX_DUPLICATE_STREAK = 15
#: Share of ``--budget`` kept for the final A/B re-measurement.
AB_SHARE = 0.15
#: Interleaved A/B rounds per bucket; each round times native and every candidate once.
AB_ROUNDS = 3


class TuneError(Exception):
    """A tuning failure raised identically on every rank. ``usage`` means bad input."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class TuneOptions:
    """What ``ringtune tune`` was asked for (see its ``--help``)."""

    out: str
    buckets: list[int]
    trials: int = 30
    budget_s: float = 240.0
    storage: str | None = None
    study: str | None = None
    sampler: str = "tpe"
    seed: int = 0
    trial_timeout_s: float | None = 120.0
    margin: float = 0.03
    algorithms: list[str] | None = None
    dtype: str = "float32"
    op: str = "sum"
    fresh: bool = False
    report: str | None = None
    progress: bool = True


@dataclass
class BucketSummary:
    """What a bucket's study found (built on rank 0 from storage, broadcast to all)."""

    nbytes: int
    study: str
    reason: str
    evaluated: int
    #: Best distinct COMPLETE configurations, fastest first: (algorithm, params, time_us).
    top: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    #: Fastest COMPLETE configuration of each algorithm: name -> (params, time_us).
    best_by_algorithm: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)


@dataclass
class Choice:
    """The A/B outcome of one bucket."""

    nbytes: int
    algorithm: str
    params: dict[str, Any]
    time_us: float
    native_time_us: float
    busbw_gbps: float
    native_busbw_gbps: float
    candidates: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return self.native_time_us / self.time_us if self.time_us > 0 else 1.0


@dataclass
class TuneResult:
    profile: dict[str, Any]
    buckets: list[BucketSummary]
    choices: list[Choice]
    seconds: float
    path: str


# -- helpers that keep ranks in step ----------------------------------------------------------


def _on_root(comm: Any, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and broadcast its result; if it raised, every rank raises the
    same ``TuneError`` (so no rank is left waiting in the next collective)."""
    payload: Any = None
    if comm.Get_rank() == 0:
        try:
            payload = ("ok", fn())
        except TuneError as exc:
            payload = ("err", str(exc), exc.usage)
        except (ValueError, TypeError, OSError) as exc:
            payload = ("err", str(exc), True)
        except Exception as exc:  # noqa: BLE001 - every rank must learn about it
            payload = ("err", f"{type(exc).__name__}: {exc}", False)
    payload = comm.bcast(payload, root=0)
    if payload[0] == "err":
        raise TuneError(payload[1], usage=payload[2])
    return payload[1]


def default_storage(out: str) -> str:
    """``sqlite:///<profile dir>/<profile stem>.db``."""
    path = os.path.abspath(out)
    stem = os.path.splitext(os.path.basename(path))[0]
    return "sqlite:///" + os.path.join(os.path.dirname(path), stem + ".db")


def power_of_4_buckets(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 from ``min_bytes`` (rounded up to one) to ``max_bytes``."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ValueError(f"--min-bytes ({min_bytes}) must be ≥ 1 and ≤ --max-bytes "
                         f"({max_bytes})")
    b = 1
    while b < min_bytes:
        b *= 4
    out = []
    while b <= max_bytes:
        out.append(b)
        b *= 4
    if not out:
        raise ValueError(f"no power of 4 between --min-bytes {min_bytes} and --max-bytes "
                         f"{max_bytes}; widen the range or give --buckets")
    return out


def world_identity(comm: Any) -> dict[str, Any]:
    """The ``topology`` record of the profile: fingerprint, world size, hosts, ranks per
    host and a summary. Uses ``probes`` when present; otherwise a fingerprint from the world
    size and the rank → host layout (collective)."""
    from mpi4py import MPI

    names = comm.allgather(MPI.Get_processor_name())
    n = len(names)
    hosts = len(set(names))
    per_host = max(names.count(h) for h in set(names))
    fingerprint = summary = None
    try:
        import probes
    except ImportError:
        probes = None  # type: ignore[assignment]
    if probes is not None and hasattr(probes, "world_fingerprint"):
        # The same fingerprint the runtime computes when it loads the profile
        # (Communicator._check_fingerprint); a probe error (a bad $RINGTUNE_TOPOLOGY file)
        # is raised identically on every rank by the probes themselves.
        topo = probes.detect(comm) if hasattr(probes, "detect") else None
        fingerprint = probes.world_fingerprint(comm, topo)
        summ = getattr(topo, "summary", None)
        summary = summ() if callable(summ) else None
    # Every rank must use the same fingerprint (study names); rank 0's decides.
    fingerprint = comm.bcast(fingerprint, root=0)
    summary = comm.bcast(summary, root=0)
    if not fingerprint:
        layout = [sorted(set(names)).index(h) for h in names]
        shape = json.dumps({"world_size": n, "hosts": hosts, "ranks_per_host": per_host,
                            "layout": [layout.count(i) for i in range(hosts)]})
        fingerprint = "sha256:" + hashlib.sha256(shape.encode()).hexdigest()
    if isinstance(fingerprint, str) and not fingerprint.startswith("sha256:"):
        fingerprint = "sha256:" + fingerprint
    if not summary:
        summary = f"{hosts} host{'s' if hosts > 1 else ''} x {per_host} ranks, cpu, " + (
            "shm" if hosts == 1 else "network")
    return {"fingerprint": fingerprint, "world_size": n, "hosts": hosts,
            "ranks_per_host": per_host, "summary": " ".join(str(summary).split())[:200]}


def study_name(prefix: str | None, fingerprint: str, dtype: str, op: str,
               nbytes: int) -> str:
    """One study per bucket, named from the fingerprint (``--study`` replaces the prefix)."""
    head = prefix or "ringtune-" + fingerprint.split(":", 1)[-1][:16]
    return f"{head}-{dtype}-{op}-{nbytes}B"


def _make_sampler(name: str, seed: int) -> Any:
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # group/multivariate are "experimental"
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8,
                                              multivariate=True, group=True)
    # ``grid`` enqueues every configuration of the (conditional) space itself and tracks
    # exhaustion; the random sampler underneath is never consulted for enqueued trials.
    return optuna.samplers.RandomSampler(seed=seed)


# -- the bucket loop --------------------------------------------------------------------------


class _Driver:
    """Rank 0's side of one bucket: the Optuna study, its asks and tells."""

    def __init__(self, opts: TuneOptions, storage: Any, name: str, nbytes: int,
                 world_size: int, algorithms: list[str]) -> None:
        import optuna

        self.opts = opts
        self.nbytes = nbytes
        self.world_size = world_size
        self.algorithms = algorithms
        self.study = optuna.create_study(storage=storage, study_name=name,
                                         direction="minimize",
                                         sampler=_make_sampler(opts.sampler, opts.seed),
                                         load_if_exists=True)
        self.name = name
        self.pending: Any = None
        self.pending_cfg: tuple[str, dict[str, Any]] | None = None
        self.dup_streak = 0
        self.grid_keys: set[str] | None = None
        self._space: list[tuple[dict[str, Any], space.Config]] | None = None
        self._scan()

    def _scan(self) -> None:
        """Read the study's history: what was measured, what failed, what timed out."""
        from optuna.trial import TrialState

        self.done: dict[str, tuple[str, float | None]] = {}
        self.timed_out: set[str] = set()
        self.evaluated = 0
        self.best: float | None = None
        for t in self.study.get_trials(deepcopy=False):
            key = (t.user_attrs.get("config") or {}).get("key")
            if t.state == TrialState.RUNNING:
                continue
            if key is None:
                continue
            result = t.user_attrs.get("result")
            if result and result.get("timeout"):
                self.timed_out.add(key)
            if not result:
                continue
            self.evaluated += 1
            state = {TrialState.COMPLETE: COMPLETE, TrialState.PRUNED: PRUNED}.get(
                t.state, FAIL)
            self.done[key] = (state, t.value if state == COMPLETE else None)
            if state == COMPLETE and t.value is not None and (
                    self.best is None or t.value < self.best):
                self.best = t.value

    @property
    def finished(self) -> str | None:
        reason = self.study.user_attrs.get("finished")
        return str(reason) if reason else None

    def space(self) -> list[tuple[dict[str, Any], space.Config]]:
        if self._space is None:
            self._space = space.enumerate_space(self.world_size, self.nbytes,
                                                self.algorithms)
        return self._space

    def prepare(self) -> None:
        """Recover from an interrupted run, then warm-start a new study."""
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        for t in trials:
            if t.state == TrialState.RUNNING:
                # Left by a run that was killed mid-trial: not the configuration's fault,
                # so it is queued again (the watchdog marks real timeouts FAIL itself).
                self.study.set_user_attr("interrupted_trials",
                                         self.study.user_attrs.get("interrupted_trials", 0) + 1)
                self.study._storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                self.study.tell(t.number, state=TrialState.FAIL)
                if t.params:
                    self.study.enqueue_trial(dict(t.params), skip_if_exists=False)
        try:
            # Every sampler stops once the whole space is measured (not only ``grid``).
            self.grid_keys = {space.config_key(*cfg) for _, cfg in self.space()}
        except ValueError:
            if self.opts.sampler == "grid":
                raise
            self.grid_keys = None  # a continuous space: only the duplicate streak stops it
        if trials:
            return
        for params in self._warm_start():
            self.study.enqueue_trial(params, skip_if_exists=True)
        if self.opts.sampler == "grid":
            order = list(self.space())
            random.Random(self.opts.seed).shuffle(order)
            for tparams, _ in order:
                self.study.enqueue_trial(tparams, skip_if_exists=True)

    def _warm_start(self) -> list[dict[str, Any]]:
        """``native`` first, then the cost model's best guesses and sensible defaults."""
        out: list[dict[str, Any]] = []
        if "native" in self.algorithms:
            out.append({space.ALGORITHM_PARAM: "native"})
        guesses: list[tuple[str, dict[str, Any]]] = []
        try:
            # The cost model is written separately; optional until it exists.
            model = importlib.import_module("autotune.model")
            best_guesses = model.best_guesses
        except (ImportError, AttributeError):
            best_guesses = None
        if best_guesses is not None:
            try:
                guesses.extend((a, dict(p)) for a, p in
                               best_guesses(self.world_size, self.nbytes)[:3])
            except Exception as exc:  # noqa: BLE001 - a guess is only a head start
                warnings.warn(f"cost model guesses unavailable: {exc}", RuntimeWarning,
                              stacklevel=2)
        _, rule = builtin_profile(self.world_size).select(self.nbytes)
        guesses.append((rule.algorithm, dict(rule.params)))
        guesses.append(("multiring", {"rings": 2, "chunk_bytes": 0, "order": "topology"}))
        guesses.append(("rhd", {}))
        try:
            grid = self.space()
        except ValueError:
            return out
        for algo, params in guesses:
            if algo not in self.algorithms:
                continue
            tparams = space.trial_params_for((algo, params), grid, self.world_size)
            if tparams is not None and tparams not in out:
                out.append(tparams)
        return out

    def next_command(self, deadline: float) -> dict[str, Any]:
        """The next trial to run on every rank, or ``{"op": "done", "reason": …}``."""
        from optuna.trial import TrialState

        while True:
            if self.evaluated >= self.opts.trials:
                return {"op": "done", "reason": "trials"}
            if self.evaluated >= 1 and time.monotonic() > deadline:
                return {"op": "done", "reason": "budget"}
            if self.grid_keys is not None and self.grid_keys <= (
                    set(self.done) | self.timed_out):
                return {"op": "done", "reason": "exhausted"}
            if self.dup_streak >= MAX_DUPLICATE_STREAK:
                return {"op": "done", "reason": "exhausted"}
            trial = self.study.ask()
            algo, params = space.suggest(trial, self.world_size, self.nbytes,
                                         self.algorithms)
            key = space.config_key(algo, params)
            # One attribute per trial (each write is one SQLite transaction).
            config = {"key": key, "algorithm": algo, "params": params}
            if key in self.timed_out:
                config["note"] = "skipped: exceeded --trial-timeout in an earlier run"
                trial.set_user_attr("config", config)
                self.study.tell(trial, state=TrialState.FAIL)
                self.dup_streak += 1
                continue
            if key in self.done:
                state, value = self.done[key]
                config["note"] = "duplicate of an earlier trial"
                trial.set_user_attr("config", config)
                if state == COMPLETE:
                    self.study.tell(trial, value)
                else:
                    self.study.tell(trial, state=TrialState.PRUNED if state == PRUNED
                                    else TrialState.FAIL)
                self.dup_streak += 1
                continue
            trial.set_user_attr("config", config)
            self.dup_streak = 0
            self.pending = trial
            self.pending_cfg = (algo, params)
            return {"op": "run", "number": trial.number, "algorithm": algo,
                    "params": params, "best": self.best}

    def record(self, outcome: Any) -> None:
        from optuna.trial import TrialState

        trial, (algo, params) = self.pending, self.pending_cfg  # type: ignore[misc]
        key = space.config_key(algo, params)
        result: dict[str, Any] = {"state": outcome.state}
        if outcome.busbw_gbps is not None:
            result["busbw_gbps"] = round(outcome.busbw_gbps, 4)
            result["time_us"] = round(outcome.time_us, 3)
        if outcome.reason:
            result["reason"] = outcome.reason[:500]
        trial.set_user_attr("result", result)
        if outcome.state == COMPLETE:
            self.study.tell(trial, outcome.time_us)
            if self.best is None or outcome.time_us < self.best:
                self.best = outcome.time_us
        else:
            self.study.tell(trial, state=TrialState.PRUNED if outcome.state == PRUNED
                            else TrialState.FAIL)
        self.done[key] = (outcome.state, outcome.time_us if outcome.state == COMPLETE
                          else None)
        self.evaluated += 1
        self.pending = self.pending_cfg = None

    def record_timeout(self, description: str, timeout_s: float) -> str:
        """Watchdog thread: mark the trial in flight FAIL (never retried) and say why."""
        from optuna.trial import TrialState

        trial = self.pending
        where = self.opts.storage or ""
        if trial is not None:
            trial.set_user_attr("result", {
                "state": FAIL, "timeout": True,
                "reason": f"timeout: still running after {timeout_s:g} s"})
            self.study.tell(trial, state=TrialState.FAIL)
        return (f"trial {description} exceeded --trial-timeout {timeout_s:g} s; it is "
                f"recorded as FAIL in {where} (study {self.name}) and will not be retried: "
                "rerun the same command to resume")

    def finish(self, reason: str) -> BucketSummary:
        from optuna.trial import TrialState

        if not self.finished:
            self.study.set_user_attr("finished", reason)
        top: list[tuple[str, dict[str, Any], float]] = []
        by_algo: dict[str, tuple[dict[str, Any], float]] = {}
        seen: set[str] = set()
        completes = [t for t in self.study.get_trials(deepcopy=False,
                                                      states=(TrialState.COMPLETE,))
                     if t.user_attrs.get("result") and t.value is not None]
        completes.sort(key=lambda t: float(t.value or 0.0))
        for t in completes:
            config = t.user_attrs["config"]
            key = config["key"]
            if key in seen:
                continue
            seen.add(key)
            algo, params = config["algorithm"], dict(config["params"])
            if len(top) < 3:
                top.append((algo, params, float(t.value or 0.0)))
            by_algo.setdefault(algo, (params, float(t.value or 0.0)))
        self._scan()
        return BucketSummary(self.nbytes, self.name, self.finished or reason, self.evaluated,
                             top, by_algo)


class _Progress:
    """Rank 0's progress display: a bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool, total_buckets: int, stream: TextIO = sys.stderr) -> None:
        self.enabled = enabled
        self.stream = stream
        self.tty = enabled and stream.isatty()
        self.total = total_buckets
        self.t0 = time.monotonic()

    def update(self, index: int, nbytes: int, done: int, trials: int, best: str) -> None:
        if not self.enabled:
            return
        frac = min(1.0, (index + min(done, trials) / max(trials, 1)) / max(self.total, 1))
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        line = (f"[{bar}] bucket {index + 1}/{self.total} {_size(nbytes):>8}  trial "
                f"{done}/{trials}  best {best}  {time.monotonic() - self.t0:5.0f}s")
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            self.stream.flush()
        elif done == 0 or done % 10 == 0:
            print(line, file=self.stream, flush=True)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + " " * 160 + "\r")
        print(text, file=self.stream, flush=True)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def _best_text(summary_best: float | None, nbytes: int, n: int) -> str:
    if summary_best is None:
        return "-"
    return f"{busbw(nbytes, summary_best, n):.2f} GB/s ({summary_best:.0f} us)"


def tune(comm: Any, opts: TuneOptions, out: TextIO = sys.stdout) -> TuneResult:
    """The whole tuning run (collective over ``comm``, an mpi4py communicator)."""
    t_start = time.monotonic()
    rank, n = comm.Get_rank(), comm.Get_size()
    if opts.sampler not in SAMPLERS:
        raise TuneError(f"--sampler: unknown sampler {opts.sampler!r}; use one of "
                        f"{', '.join(SAMPLERS)}", usage=True)
    try:
        algorithms = space.searchable(opts.algorithms)
    except ValueError as exc:
        raise TuneError(str(exc), usage=True) from None
    opts.storage = opts.storage or default_storage(opts.out)
    identity = world_identity(comm)
    runtime = Communicator(comm, profile=builtin_profile(n))
    progress = _Progress(opts.progress and rank == 0, len(opts.buckets))

    storage: Any = None

    def open_storage() -> None:
        nonlocal storage
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        try:
            storage = optuna.storages.RDBStorage(str(opts.storage))
        except Exception as exc:  # noqa: BLE001 - one clear line for a bad --storage
            raise TuneError(f"--storage {opts.storage}: cannot open the Optuna storage "
                            f"({type(exc).__name__}: {exc})", usage=True) from None
        if opts.fresh:
            names = {study_name(opts.study, identity["fingerprint"], opts.dtype, opts.op, b)
                     for b in opts.buckets}
            for s in optuna.get_all_study_summaries(storage=storage,
                                                    include_best_trial=False):
                if s.study_name in names:
                    optuna.delete_study(study_name=s.study_name, storage=storage)

    _on_root(comm, open_storage)
    watchdog = Watchdog(opts.trial_timeout_s if rank == 0 else None,
                        abort=lambda msg: _abort(comm, msg))
    summaries: list[BucketSummary] = []
    budget_end = t_start + opts.budget_s * (1 - AB_SHARE)
    try:
        for index, nbytes in enumerate(opts.buckets):
            name = study_name(opts.study, identity["fingerprint"], opts.dtype, opts.op,
                              nbytes)
            summaries.append(_tune_bucket(comm, runtime, opts, storage, name, nbytes, index,
                                          algorithms, budget_end, progress, watchdog))
    finally:
        watchdog.close()
    progress.line("re-measuring the best candidates against native (interleaved A/B)")
    choices = [_ab_choice(runtime, opts, summaries, i) for i in range(len(summaries))]
    profile = build_profile(identity, opts, summaries, choices, time.monotonic() - t_start,
                            algorithms)

    def write() -> str:
        return write_profile(profile, opts.out)

    path = _on_root(comm, write)
    runtime.close()
    return TuneResult(profile, summaries, choices, time.monotonic() - t_start, path)


def _record(driver: _Driver | None, outcome: TrialOutcome) -> None:
    assert driver is not None
    driver.record(outcome)


ABORT_GRACE_S = 1.0


def _abort(comm: Any, message: str) -> None:
    print(f"ringtune: error: {message}", file=sys.stderr, flush=True)
    # The launcher forwards our stderr asynchronously and the abort kills every process at
    # once: give the forwarding a moment so the message is not lost with them.
    time.sleep(ABORT_GRACE_S)
    comm.Abort(1)


def _tune_bucket(comm: Any, runtime: Communicator, opts: TuneOptions, storage: Any,
                 name: str, nbytes: int, index: int, algorithms: list[str],
                 budget_end: float, progress: _Progress, watchdog: Watchdog) -> BucketSummary:
    rank, n = comm.Get_rank(), comm.Get_size()
    driver: _Driver | None = None

    def open_study() -> str | None:
        nonlocal driver
        driver = _Driver(opts, storage, name, nbytes, n, algorithms)
        if driver.finished:
            return driver.finished
        driver.prepare()
        return None

    finished = _on_root(comm, open_study)
    if finished:
        summary = _on_root(comm, lambda: driver.finish(finished))  # type: ignore[union-attr]
        progress.line(f"bucket {index + 1}/{len(opts.buckets)} {_size(nbytes)}: finished "
                      f"earlier ({finished}, {summary.evaluated} trials), not redone")
        return summary
    # Iterations per candidate from a short timing of native (same on every rank).
    itemsize = 2 if opts.dtype == "bfloat16" else int(__import__("numpy").dtype(
        opts.dtype).itemsize)
    sample = time_allreduce(runtime, nbytes // itemsize, opts.dtype, opts.op, "native", {},
                            warmup=1, iters=3)
    timing = timing_for(sample.time_us)
    # This bucket's share of what is left of the search budget (later buckets are larger).
    weights = [1.0 + math.log(b / opts.buckets[0] + 1, 64) for b in opts.buckets[index:]]
    deadline = time.monotonic() + max(0.0, budget_end - time.monotonic()) * (
        weights[0] / sum(weights))

    while True:
        cmd = _on_root(comm, lambda: driver.next_command(deadline))  # type: ignore[union-attr]
        if cmd["op"] == "done":
            reason = cmd["reason"]
            break
        desc = (f"{cmd['number']} of bucket {_size(nbytes)} "
                f"({space.describe(cmd['algorithm'], cmd['params'])})")
        if rank == 0:
            assert driver is not None
            watchdog.arm(desc, functools.partial(driver.record_timeout,
                                                 timeout_s=watchdog.timeout_s or 0))
        outcome = evaluate(runtime, nbytes, opts.dtype, opts.op, cmd["algorithm"],
                           cmd["params"], timing, cmd["best"])
        if rank == 0:
            watchdog.disarm()
        _on_root(comm, functools.partial(_record, driver, outcome))
        if rank == 0 and driver is not None:
            progress.update(index, nbytes, driver.evaluated, opts.trials,
                            _best_text(driver.best, nbytes, n))
    summary = _on_root(comm, lambda: driver.finish(reason))  # type: ignore[union-attr]
    if summary.top:
        a, p, t = summary.top[0]
        best = f"{space.describe(a, p)} {busbw(nbytes, t, n):.2f} GB/s"
    else:
        best = "nothing passed the check"
    progress.line(f"bucket {index + 1}/{len(opts.buckets)} {_size(nbytes)}: "
                  f"{summary.evaluated} trials ({reason}); best {best}")
    return summary


# -- choosing ---------------------------------------------------------------------------------


def _ab_choice(runtime: Communicator, opts: TuneOptions, summaries: Sequence[BucketSummary],
               i: int) -> Choice:
    """Re-measure the bucket's best candidates (and its neighbours' winners) against
    ``native``, interleaved A/B; a non-native choice must beat native by ``margin``."""
    from collectives.bench import check_allreduce

    s = summaries[i]
    n = runtime.size
    nbytes = s.nbytes
    itemsize = 2 if opts.dtype == "bfloat16" else int(__import__("numpy").dtype(
        opts.dtype).itemsize)
    count = nbytes // itemsize
    cands: list[tuple[str, dict[str, Any]]] = []
    keys = {space.config_key("native", {})}
    own = [(a, p) for a, p, _ in s.top[:2]]
    borrowed = [(a, p) for j in (i - 1, i + 1) if 0 <= j < len(summaries)
                for a, p, _ in summaries[j].top[:1]]
    for a, p in own + borrowed:
        k = space.config_key(a, p)
        if k in keys:
            continue
        if (a, p) not in own:
            # A neighbour's winner was checked at its own size only.
            ok = check_allreduce(runtime, count, opts.dtype, opts.op, a, p).ok
            runtime.clear_plans()
            if not ok:
                continue
        keys.add(k)
        cands.append((a, p))
    sample = time_allreduce(runtime, count, opts.dtype, opts.op, "native", {}, warmup=1,
                            iters=3)
    timing = timing_for(sample.time_us, target_s=0.1)
    everyone: list[tuple[str, dict[str, Any]]] = [("native", {})] + cands
    times: list[list[float]] = [[] for _ in everyone]
    for _ in range(AB_ROUNDS if cands else 1):
        for j, (a, p) in enumerate(everyone):
            m = time_allreduce(runtime, count, opts.dtype, opts.op, a, p,
                               warmup=timing.warmup, iters=timing.iters)
            times[j].append(m.time_us)
    runtime.clear_plans()
    med = [sorted(t)[len(t) // 2] for t in times]
    native_t = med[0]
    best_j = min(range(len(everyone)), key=lambda j: med[j])
    if best_j != 0 and med[best_j] * (1 + opts.margin) > native_t:
        best_j = 0  # not a clear enough win over native: keep the library's own
    a, p = everyone[best_j]
    return Choice(nbytes, a, dict(p), med[best_j], native_t, busbw(nbytes, med[best_j], n),
                  busbw(nbytes, native_t, n),
                  [(everyone[j][0], dict(everyone[j][1]), med[j]) for j in range(len(med))])


def rule_bounds(buckets: Sequence[int]) -> list[tuple[int, int | None]]:
    """Size range of each bucket's rule: from the geometric midpoint with the previous
    bucket (0 for the first) to just below the midpoint with the next (open for the last)."""
    starts = [0] + [int(math.sqrt(a * b)) for a, b in zip(buckets, buckets[1:])]
    return [(lo, starts[k + 1] - 1 if k + 1 < len(starts) else None)
            for k, lo in enumerate(starts)]


def build_profile(identity: Mapping[str, Any], opts: TuneOptions,
                  summaries: Sequence[BucketSummary], choices: Sequence[Choice],
                  seconds: float, algorithms: Sequence[str]) -> dict[str, Any]:
    """The profile mapping: one rule per bucket, adjacent equal choices merged."""
    rules: list[dict[str, Any]] = []
    for (lo, hi), c in zip(rule_bounds([s.nbytes for s in summaries]), choices):
        measured = {"bytes": c.nbytes, "busbw_gbps": round(c.busbw_gbps, 4),
                    "time_us": round(c.time_us, 2),
                    "native_busbw_gbps": round(c.native_busbw_gbps, 4),
                    "native_time_us": round(c.native_time_us, 2),
                    "speedup": round(c.speedup, 3)}
        if rules and rules[-1]["algorithm"] == c.algorithm and rules[-1]["params"] == c.params:
            # Same choice as the previous bucket: one rule; keep the larger size's figures.
            rules[-1]["max_bytes"] = hi
            rules[-1]["measured"] = measured
            continue
        rules.append({"min_bytes": lo, "max_bytes": hi, "algorithm": c.algorithm,
                      "params": dict(c.params), "measured": measured})
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return {
        "format": FORMAT,
        "version": VERSION,
        "created": now.isoformat().replace("+00:00", "Z"),
        "tool": {"name": "ringtune", "version": __version__},
        "topology": dict(identity),
        "backend": "numpy",
        "transport": "mpi",
        "dtype": opts.dtype,
        "op": opts.op,
        "rules": rules,
        "tuning": {
            "trials": sum(s.evaluated for s in summaries),
            "seconds": round(seconds, 1),
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
        },
    }
