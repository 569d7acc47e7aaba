"""The search of one size bucket, on rank 0: the Optuna study's ask and tell, warm start
(its trials: ``autotune.warm_start``), exhaustion, resume after an interruption, and
recording a trial that exceeded ``--trial-timeout``.

Use ``Driver`` on rank 0 only (SQLite has one writer); ``autotune.tuning`` (the whole run,
on every rank) broadcasts what it decides to the other ranks. Use ``make_sampler`` for the
Optuna sampler behind a ``--sampler`` name (the search-efficiency benchmark does).

Persistence (docs/design.md "Tuning" 7–8): a bucket marked ``finished`` in its study is
not searched again; a trial left RUNNING by an interrupted run is marked FAIL
("interrupted") and its configuration queued again. A trial that exceeded
``--trial-timeout`` is recorded as TIMEOUT (an Optuna FAIL whose result says so): a timeout
is evidence about the machine at that moment (a link cut, a busy node), not proof that the
configuration is bad, so the next run retries it once, first; only a second timeout rules
it out.

Exhaustion: a discrete space is exhausted only when every configuration in it is measured
or ruled out. When the sampler keeps proposing configurations it already knows, an untried
one is drawn directly (seeded), so a converged sampler never ends a bucket early.
"""

from __future__ import annotations

import datetime
import functools
import random
import time
import warnings
from typing import Any

from collectives.plan import Config

from . import space
from .objective import COMPLETE, FAIL, PRUNED, TIMEOUT
from .records import BucketSummary, TuneOptions
from .warm_start import warm_start

SAMPLERS = ("tpe", "random", "grid")

#: Consecutive proposals of already-measured configurations after which a continuous space
#: (which cannot be enumerated) counts as converged: the sampler keeps proposing what it knows.
MAX_DUPLICATE_STREAK = 15
#: Consecutive known proposals after which an untried configuration of a discrete space is
#: drawn directly instead of waiting for the sampler to find one.
DRAW_AFTER_DUPLICATES = 3
#: Timeouts of one configuration (over separate runs) after which it is ruled out.
MAX_TIMEOUTS = 2


def make_sampler(name: str, seed: int) -> Any:
    import optuna

    if name == "tpe":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # group/multivariate are "experimental"
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=8,
                                              multivariate=True, group=True)
    # ``grid`` enqueues every configuration of the (conditional) space itself and tracks
    # exhaustion; the random sampler underneath is never consulted for enqueued trials.
    return optuna.samplers.RandomSampler(seed=seed)


class Driver:
    """Rank 0's side of one bucket: the Optuna study, its asks and tells."""

    def __init__(self, opts: TuneOptions, storage: Any, name: str, nbytes: int,
                 world_size: int, algorithms: list[str], hosts: int = 1) -> None:
        import optuna

        self.opts = opts
        self.hosts = hosts  # of the world: some parameters are searched only across hosts
        self.added = 0
        self.nbytes = nbytes
        self.world_size = world_size
        self.algorithms = algorithms
        self.study = optuna.create_study(storage=storage, study_name=name,
                                         direction="minimize",
                                         sampler=make_sampler(opts.sampler, opts.seed),
                                         load_if_exists=True)
        self.name = name
        self.pending: Any = None
        self.pending_cfg: Config | None = None
        self.dup_streak = 0
        self.grid_keys: set[str] | None = None
        self._rng = random.Random(f"{opts.seed}:{name}")
        self._space: list[tuple[dict[str, Any], space.Config]] | None = None
        self._scan()

    def _scan(self) -> None:
        """Read the study's history: what was measured, what failed, what timed out."""
        from optuna.trial import TrialState

        self.done: dict[str, tuple[str, float | None]] = {}
        #: Timeouts recorded per configuration, and the trial params to retry each with.
        self.timeouts: dict[str, int] = {}
        self.timeout_params: dict[str, dict[str, Any]] = {}
        self.evaluated = 0
        self.best: float | None = None
        for t in self.study.get_trials(deepcopy=False):
            key = (t.user_attrs.get("config") or {}).get("key")
            if t.state == TrialState.RUNNING:
                continue
            if key is None:
                continue
            result = t.user_attrs.get("result")
            if not result or t.user_attrs.get("interrupted"):
                # An interrupted trial's result (the run was killed between writing it and
                # closing the trial) was never committed: its retry, queued when the
                # interruption was found, measures the configuration instead.
                continue
            if result.get("timeout") or result.get("state") == TIMEOUT:
                # Not a measurement: it counts against neither --trials nor the space.
                self.timeouts[key] = self.timeouts.get(key, 0) + 1
                self.timeout_params.setdefault(key, dict(t.params))
                continue
            self.evaluated += 1
            state = {TrialState.COMPLETE: COMPLETE, TrialState.PRUNED: PRUNED}.get(
                t.state, FAIL)
            self.done[key] = (state, t.value if state == COMPLETE else None)
            if state == COMPLETE and t.value is not None and (
                    self.best is None or t.value < self.best):
                self.best = t.value

    @property
    def ruled_out(self) -> set[str]:
        """Configurations that timed out ``MAX_TIMEOUTS`` times and were never measured."""
        return {k for k, c in self.timeouts.items() if c >= MAX_TIMEOUTS and k not in self.done}

    def untried(self) -> list[str]:
        """Configurations of a discrete space neither measured nor ruled out (sorted);
        empty for a continuous space, which cannot be listed."""
        if self.grid_keys is None:
            return []
        return sorted(self.grid_keys - set(self.done) - self.ruled_out)

    @property
    def finished(self) -> str | None:
        reason = self.study.user_attrs.get("finished")
        return str(reason) if reason else None

    def space(self) -> list[tuple[dict[str, Any], space.Config]]:
        if self._space is None:
            self._space = space.enumerate_space(self.world_size, self.nbytes,
                                                self.algorithms, self.opts.transports,
                                                self.hosts)
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
                # Optuna has no public way to mark a trial another process left RUNNING
                # (checked on optuna 5.1.0): its storage, by the trial's id.
                self.study._storage.set_trial_user_attr(  # noqa: SLF001
                    t._trial_id, "interrupted", True)  # noqa: SLF001
                self.study.tell(t.number, state=TrialState.FAIL)
                if t.params:
                    self.study.enqueue_trial(dict(t.params), skip_if_exists=False)
        try:
            # Every sampler stops once the whole space is measured (not only ``grid``).
            self.grid_keys = {cfg.key for _, cfg in self.space()}
        except ValueError:
            if self.opts.sampler == "grid":
                raise
            self.grid_keys = None  # a continuous space: only the duplicate streak stops it
        queue_retries(self.study, self.timeouts, self.timeout_params, self.done)
        if trials:
            return
        for params in warm_start(self.algorithms, self.world_size, self.nbytes, self.hosts,
                                 self.opts.transports, self.space):
            self.study.enqueue_trial(params, skip_if_exists=True)
        if self.opts.sampler == "grid":
            order = list(self.space())
            random.Random(self.opts.seed).shuffle(order)
            for tparams, _ in order:
                self.study.enqueue_trial(tparams, skip_if_exists=True)

    def _draw_untried(self) -> None:
        """Queue one untried configuration of the space (seeded choice) for the next ask."""
        untried = self.untried()
        if not untried:
            return
        key = self._rng.choice(untried)
        params = self._trial_params.get(key)
        if params is not None:
            self.study.enqueue_trial(dict(params), skip_if_exists=False)

    @functools.cached_property
    def _trial_params(self) -> dict[str, dict[str, Any]]:
        return {cfg.key: tparams for tparams, cfg in self.space()}

    def next_command(self, deadline: float) -> dict[str, Any]:
        """The next trial to run on every rank, or ``{"op": "done", "reason": …}``."""
        from optuna.trial import TrialState

        while True:
            if self.evaluated >= self.opts.trials:
                return {"op": "done", "reason": "trials"}
            if self.evaluated >= 1 and time.monotonic() > deadline:
                return {"op": "done", "reason": "budget"}
            if self.grid_keys is not None and not self.untried():
                return {"op": "done", "reason": "exhausted"}
            if self.grid_keys is None and self.dup_streak >= MAX_DUPLICATE_STREAK:
                return {"op": "done", "reason": "converged"}
            if self.dup_streak >= MAX_DUPLICATE_STREAK + len(self.grid_keys or ()):
                # Untried configurations were queued and never came back from the sampler:
                # say so rather than call the space exhausted.
                return {"op": "done", "reason": "stalled"}
            trial = self.study.ask()
            cfg = space.suggest(trial, self.world_size, self.nbytes, self.algorithms,
                                self.opts.transports, self.hosts)
            key = cfg.key
            # One attribute per trial (each write is one SQLite transaction).
            config: dict[str, Any] = {"key": key, **cfg.record()}
            if key in self.ruled_out:
                config["note"] = (f"skipped: exceeded --trial-timeout in {MAX_TIMEOUTS} "
                                  "earlier runs")
                trial.set_user_attr("config", config)
                self.study.tell(trial, state=TrialState.FAIL)
                self._known_proposed()
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
                self._known_proposed()
                continue
            if key in self.timeouts:
                config["note"] = "retry: exceeded --trial-timeout in an earlier run"
            trial.set_user_attr("config", config)
            self.dup_streak = 0
            self.pending = trial
            self.pending_cfg = cfg
            return {"op": "run", "number": trial.number, "config": cfg, "best": self.best}

    def _known_proposed(self) -> None:
        self.dup_streak += 1
        if self.grid_keys is not None and self.dup_streak >= DRAW_AFTER_DUPLICATES:
            self._draw_untried()

    def record(self, outcome: Any) -> None:
        from optuna.trial import TrialState

        trial, cfg = self.pending, self.pending_cfg
        assert cfg is not None, "record() without a pending trial"
        key = cfg.key
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
        self.added += 1
        self.pending = self.pending_cfg = None

    def record_timeout(self, description: str, timeout_s: float) -> str:
        """Watchdog thread: record the trial in flight as TIMEOUT and say what happens next
        (retried once by the next run; ruled out after ``MAX_TIMEOUTS``)."""
        from optuna.trial import TrialState

        trial, cfg = self.pending, self.pending_cfg
        where = self.opts.storage or ""
        count = 1
        if trial is not None and cfg is not None:
            key = cfg.key
            count = self.timeouts.get(key, 0) + 1
            trial.set_user_attr("result", {
                "state": TIMEOUT, "timeout": True,
                "reason": f"timeout: still running after {timeout_s:g} s"})
            self.study.tell(trial, state=TrialState.FAIL)
        if count < MAX_TIMEOUTS:
            fate = ("the next run retries it once before ruling it out (a timeout may be the "
                    "machine's, not the configuration's)")
        else:
            fate = f"it timed out in {count} runs and is ruled out"
        return (f"trial {description} exceeded --trial-timeout {timeout_s:g} s; it is "
                f"recorded as TIMEOUT in {where} (study {self.name}) and {fate}: rerun the "
                "same command to resume")

    def finish(self, reason: str) -> BucketSummary:
        from optuna.trial import TrialState

        if not self.finished:
            self.study.set_user_attr("finished", reason)
        top: list[tuple[Config, float]] = []
        by_algo: dict[str, tuple[Config, float]] = {}
        seen: set[str] = set()
        trials = self.study.get_trials(deepcopy=False)
        completes = [t for t in trials if t.state == TrialState.COMPLETE
                     and t.user_attrs.get("result") and t.value is not None]
        # Stable sort over trial numbers: equal times keep the order they were measured in,
        # so a rerun on the same storage builds the same summary.
        completes.sort(key=lambda t: float(t.value or 0.0))
        for t in completes:
            config = t.user_attrs["config"]
            key = config["key"]
            if key in seen:
                continue
            seen.add(key)
            # Records before Config kept the transport inside params: both read alike.
            cfg = Config.from_record(config["algorithm"], config["params"],
                                     config.get("transport"))
            if len(top) < 3:
                top.append((cfg, float(t.value or 0.0)))
            by_algo.setdefault(cfg.algorithm, (cfg, float(t.value or 0.0)))
        self._scan()
        first, last, seconds = trial_history(trials)
        return BucketSummary(self.nbytes, self.name, self.finished or reason, self.evaluated,
                             top, by_algo, first, last, seconds, self.added)


def queue_retries(study: Any, timeouts: dict[str, int], timeout_params: dict[str, dict[str, Any]],
                  done: dict[str, Any]) -> None:
    """Queue in ``study``, ahead of anything else, each configuration that timed out once
    and was never measured (``timeouts``, ``timeout_params``, ``done``: a ``Driver``'s
    history): the retry that decides whether it is ruled out. Once per configuration, not
    per run: a retry left queued by an interrupted run stays one."""
    from optuna.trial import TrialState

    retries: list[dict[str, Any]] = []
    for key, count in sorted(timeouts.items()):
        params = timeout_params.get(key)
        if count < MAX_TIMEOUTS and key not in done and params and params not in retries:
            retries.append(params)
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    # An enqueued trial carries its params as ``fixed_params`` until it is asked for.
    queued = [t.system_attrs.get("fixed_params") for t in waiting]
    if not retries or queued[:len(retries)] == retries:
        return
    # Optuna hands out the oldest waiting trial first: take back what earlier runs left
    # queued (each ``ask`` pops one; it is closed without a configuration, which the
    # history ignores) and queue it again behind the retries.
    for _ in waiting:
        popped = study.ask()
        popped.set_user_attr("requeued", "behind a --trial-timeout retry")
        study.tell(popped, state=TrialState.FAIL)
    for params in retries + [q for q in queued if q and q not in retries]:
        study.enqueue_trial(dict(params), skip_if_exists=False)


def trial_history(trials: Any) -> tuple[str | None, str | None, float]:
    """``(first start, last end, seconds)`` of the trials that ran (a result is recorded):
    from the storage, so the same on every rerun. Times are UTC ISO 8601."""
    starts, ends, seconds = [], [], 0.0
    for t in trials:
        if not t.user_attrs.get("result") or t.datetime_start is None:
            continue
        starts.append(t.datetime_start)
        if t.datetime_complete is not None:
            ends.append(t.datetime_complete)
            seconds += (t.datetime_complete - t.datetime_start).total_seconds()
    if not starts:
        return None, None, 0.0
    return _utc(min(starts)), _utc(max(ends or starts)), round(seconds, 3)


def _utc(when: datetime.datetime) -> str:
    # Optuna stores naive local times; astimezone() reads a naive time as local.
    return when.astimezone(datetime.timezone.utc).replace(microsecond=0).isoformat().replace(
        "+00:00", "Z")
