"""Rank 0's Optuna driver for one size bucket: ask and tell, warm start, exhaustion,
resume after an interruption, and recording a trial that exceeded ``--trial-timeout``.

Use ``Driver`` on rank 0 only (SQLite has one writer); ``autotune.study`` broadcasts what
it decides to the other ranks. Use ``make_sampler`` for the Optuna sampler behind a
``--sampler`` name (the search-efficiency benchmark does).

Persistence (DESIGN.md "Tuning procedure" 6–7): a bucket marked ``finished`` in its study is
not searched again; a trial left RUNNING by an interrupted run is marked FAIL
("interrupted") and its configuration queued again; a trial that exceeded
``--trial-timeout`` is FAIL ("timeout") and its configuration is never run again in that
study.
"""

from __future__ import annotations

import importlib
import random
import time
import warnings
from typing import Any

from collectives.profile import builtin_profile

from . import space
from .objective import COMPLETE, FAIL, PRUNED
from .records import BucketSummary, TuneOptions

SAMPLERS = ("tpe", "random", "grid")

#: Consecutive proposals of already-measured configurations after which a bucket's space
#: counts as exhausted (the sampler keeps proposing what it knows).
MAX_DUPLICATE_STREAK = 15


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
                 world_size: int, algorithms: list[str]) -> None:
        import optuna

        self.opts = opts
        self.nbytes = nbytes
        self.world_size = world_size
        self.algorithms = algorithms
        self.study = optuna.create_study(storage=storage, study_name=name,
                                         direction="minimize",
                                         sampler=make_sampler(opts.sampler, opts.seed),
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
                                                self.algorithms, self.opts.transports)
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
        # On GPU buffers every warm-start guess uses the best transport every rank has.
        best_transport = self.opts.transports[0] if self.opts.transports else None
        if "native" in self.algorithms:
            first: dict[str, Any] = {space.ALGORITHM_PARAM: "native"}
            if best_transport is not None and self.world_size > 1:
                first[space.TRANSPORT_PARAM] = best_transport
            try:
                # native's own parameters (MPICH's ``impl``) at the library's default.
                exact = space.trial_params_for(
                    ("native", {k: v for k, v in first.items() if k != space.ALGORITHM_PARAM}),
                    self.space(), self.world_size)
            except ValueError:
                exact = None
            out.append(exact or first)
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
            if best_transport is not None and self.world_size > 1:
                params = {**params, space.TRANSPORT_PARAM: best_transport}
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
                                         self.algorithms, self.opts.transports)
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
