"""Reruns of a tuning study, in one process against a real Optuna storage: recorded A/B
choices are reused only for the same inputs (so a rerun writes the same profile), a
timed-out configuration is retried once before it is ruled out, and a bucket is called
exhausted only when no untried configuration is left, whatever the sampler proposes."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import optuna
import pytest

from autotune import bucket_search as driver_mod
from autotune import replay, space
from autotune.bucket_search import MAX_TIMEOUTS, Driver
from autotune.choose import build_profile
from autotune.objective import COMPLETE, TrialOutcome
from autotune.records import BucketSummary, Choice, TuneOptions
from autotune.report import profile_heading
from collectives.plan import Config
from collectives.profile import dump_profile

FP = "sha256:" + "ab" * 32
IDENTITY = {"fingerprint": FP, "world_size": 2, "hosts": 1, "ranks_per_host": 2,
            "summary": "1 host x 2 ranks, cpu, shm"}
ALGOS = ["native", "rhd", "multiring"]
NBYTES = 4096


def _storage(tmp_path: Any) -> Any:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path}/s.db")


def _opts(tmp_path: Any, **kw: Any) -> TuneOptions:
    base: dict[str, Any] = dict(out=str(tmp_path / "p.yaml"), buckets=[NBYTES], trials=1000,
                                storage=f"sqlite:///{tmp_path}/s.db", sampler="random",
                                seed=0, algorithms=ALGOS)
    base.update(kw)
    return TuneOptions(**base)


def _driver(tmp_path: Any, storage: Any, **kw: Any) -> Driver:
    d = Driver(_opts(tmp_path, **kw), storage, "study-4096B", NBYTES, 2, ALGOS)
    d.prepare()
    return d


def _run_bucket(d: Driver, limit: int = 500) -> tuple[str, list[str]]:
    """Measure every proposed trial (a fake, constant time per configuration) until the
    driver stops: ``(reason, keys run in order)``."""
    ran: list[str] = []
    for _ in range(limit):
        cmd = d.next_command(deadline=math.inf)
        if cmd["op"] == "done":
            return cmd["reason"], ran
        key = space.config_key(cmd["config"])
        ran.append(key)
        t = 10.0 + len(key) % 7
        d.record(TrialOutcome(COMPLETE, t, NBYTES / t / 1e3))
    raise AssertionError(f"the driver did not stop after {limit} trials")


class Stubborn(optuna.samplers.BaseSampler):
    """Always proposes the first choice of every parameter: a sampler that has converged
    (or a TPE that keeps coming back to one region)."""

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        if isinstance(dist, optuna.distributions.CategoricalDistribution):
            return dist.choices[0]
        return dist.low


# -- exhaustion ------------------------------------------------------------------------------


def test_a_stubborn_sampler_still_covers_the_whole_space(tmp_path: Any,
                                                         monkeypatch: Any) -> None:
    monkeypatch.setattr(driver_mod, "make_sampler", lambda name, seed: Stubborn())
    d = _driver(tmp_path, _storage(tmp_path))
    everything = {space.config_key(cfg) for _, cfg in d.space()}
    reason, ran = _run_bucket(d)
    assert reason == "exhausted"
    assert len(ran) == len(set(ran)), "a configuration was measured twice"
    assert set(ran) == everything == set(d.done)


def test_exhausted_only_when_nothing_is_untried(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(driver_mod, "make_sampler", lambda name, seed: Stubborn())
    storage = _storage(tmp_path)
    d = _driver(tmp_path, storage, trials=4)
    reason, ran = _run_bucket(d)
    assert (reason, len(ran)) == ("trials", 4)
    assert len(d.untried()) == len(d.grid_keys or ()) - 4 > 0


# -- timeouts --------------------------------------------------------------------------------


def test_a_timeout_is_retried_once_then_ruled_out(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(driver_mod, "make_sampler", lambda name, seed: Stubborn())
    storage = _storage(tmp_path)
    first = _driver(tmp_path, storage, trials=3)
    cmd = first.next_command(deadline=math.inf)
    hung = space.config_key(cmd["config"])
    msg = first.record_timeout("trial 0 (x)", timeout_s=3.0)
    assert "recorded as TIMEOUT" in msg and "retries it once" in msg, msg
    assert "will not be retried" not in msg
    ran = [t for t in optuna.load_study(study_name="study-4096B", storage=storage).trials
           if t.user_attrs.get("result")]
    assert [(t.user_attrs["result"]["state"], t.state.name) for t in ran] == [
        ("timeout", "FAIL")]

    # The next run retries it first, and the timeout did not use up one of --trials 3.
    second = _driver(tmp_path, storage, trials=3)
    assert second.evaluated == 0 and hung in second.untried()
    cmd = second.next_command(deadline=math.inf)
    assert space.config_key(cmd["config"]) == hung
    msg = second.record_timeout("trial 1 (x)", timeout_s=3.0)
    assert f"timed out in {MAX_TIMEOUTS} runs and is ruled out" in msg, msg

    # Ruled out now: never run again, and the rest of the space is still searched, with
    # the sampler proposing the ruled-out configuration over and over.
    third = _driver(tmp_path, storage)
    assert hung in third.ruled_out and hung not in third.untried()
    reason, ran = _run_bucket(third)
    assert hung not in ran
    assert reason == "exhausted"
    assert set(ran) == set(third.grid_keys or ()) - {hung}


def test_a_retry_that_passes_is_measured_normally(tmp_path: Any) -> None:
    storage = _storage(tmp_path)
    first = _driver(tmp_path, storage, trials=2)
    cmd = first.next_command(deadline=math.inf)
    hung = space.config_key(cmd["config"])
    first.record_timeout("trial 0 (x)", timeout_s=3.0)
    second = _driver(tmp_path, storage, trials=2)
    cmd = second.next_command(deadline=math.inf)
    assert space.config_key(cmd["config"]) == hung
    second.record(TrialOutcome(COMPLETE, 12.0, 0.3))
    assert hung in second.done and not second.ruled_out
    # Measured now: a later run queues no further retry of it.
    again = _driver(tmp_path, storage)
    waiting = optuna.load_study(study_name="study-4096B", storage=storage).get_trials(
        states=(optuna.trial.TrialState.WAITING,))
    assert "native" not in [t.system_attrs["fixed_params"]["algorithm"] for t in waiting]
    assert hung in again.done and not again.ruled_out


def test_a_kill_between_result_and_close_loses_no_configuration(tmp_path: Any,
                                                                 monkeypatch: Any) -> None:
    """A run killed after a trial's result was written but before the trial was closed
    leaves it RUNNING with a result. The next run marks it interrupted and queues it again;
    a run after that (killed again in between) must still see it as untried, not as a
    failed measurement, and measure it: kill/resume loses no configuration."""
    monkeypatch.setattr(driver_mod, "make_sampler", lambda name, seed: Stubborn())
    storage = _storage(tmp_path)
    first = _driver(tmp_path, storage)
    cmd = first.next_command(deadline=math.inf)
    cut = space.config_key(cmd["config"])
    # What record() does first, then the kill: the result is written, the trial not closed.
    first.pending.set_user_attr("result", {"state": COMPLETE, "busbw_gbps": 0.3,
                                           "time_us": 12.0})
    second = _driver(tmp_path, storage)  # finds it RUNNING: interrupted, queued again
    assert cut in second.untried()
    # Killed again before the retry ran: the third run must still retry it.
    third = _driver(tmp_path, storage)
    assert cut not in third.done and cut in third.untried()
    reason, ran = _run_bucket(third)
    assert reason == "exhausted" and cut in ran
    assert set(third.done) == set(third.grid_keys or ())


def test_a_waiting_retry_is_not_queued_twice(tmp_path: Any) -> None:
    storage = _storage(tmp_path)
    first = _driver(tmp_path, storage)
    first.next_command(deadline=math.inf)
    first.record_timeout("trial 0 (x)", timeout_s=3.0)
    for _ in range(3):  # runs that end before asking for a trial
        _driver(tmp_path, storage)
    waiting = optuna.load_study(study_name="study-4096B", storage=storage).get_trials(
        states=(optuna.trial.TrialState.WAITING,))
    queued = [t.system_attrs["fixed_params"] for t in waiting]
    # The retry is first, once; the warm start the first run left queued follows, once each.
    # (native's warm start carries its own parameters at the library default: MPICH's impl)
    assert queued[0]["algorithm"] == "native"
    assert all(v == "auto" for k, v in queued[0].items() if k != "algorithm")
    assert len(queued) == len({str(q) for q in queued}) == 4


# -- recorded A/B choices ----------------------------------------------------------------------


def _summary(nbytes: int, top: list[tuple[str, dict[str, Any], float]]) -> BucketSummary:
    return BucketSummary(nbytes, f"s-float32-sum-{nbytes}B", "trials", 5,
                         [(Config(a, p), t) for a, p, t in top], {},
                         "2026-12-01T09:00:00Z", "2026-12-01T09:00:05Z", 4.0)


RING = {"rings": 2, "chunk_bytes": 0, "order": "topology"}


def test_recorded_choice_is_reused_only_for_the_same_inputs(tmp_path: Any) -> None:
    opts = _opts(tmp_path, buckets=[1024, 4096])
    sums = [_summary(1024, [("rhd", {}, 9.0)]), _summary(4096, [("multiring", RING, 20.0)])]
    inputs = replay.choice_inputs(opts, sums, 0, 2)
    storage = _storage(tmp_path)
    sid = storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], sums[0].study)
    assert sid is not None and replay.load_choices(storage, [sums[0].study]) == [None]
    choice = Choice(1024, Config("rhd"), 9.0, 11.0, 0.1, 0.09, [(Config("native"), 11.0)],
                    None, 0.7)
    stamped = replay.save_choice(storage, sums[0].study, choice, inputs)
    assert stamped.measured_at and stamped.measured_at.endswith("Z")
    [record] = replay.load_choices(storage, [sums[0].study])
    assert replay.reuse(record, inputs) == stamped
    # Another margin, or a neighbour with a new winner: measured again.
    assert replay.reuse(record, replay.choice_inputs(
        _opts(tmp_path, buckets=[1024, 4096], margin=0.1), sums, 0, 2)) is None
    moved = [sums[0], _summary(4096, [("rhd", {}, 18.0)])]
    assert replay.reuse(record, replay.choice_inputs(opts, moved, 0, 2)) is None
    assert replay.reuse({"inputs": inputs, "choice": {"nbytes": 1}}, inputs) is None
    assert replay.reuse(None, inputs) is None
    # A record written before Config (algorithm and params as fields, a GPU transport inside
    # params) still reads: a rerun after the upgrade reuses it.
    old = {"nbytes": 1024, "algorithm": "multiring", "params": {**RING, "transport": "nccl"},
           "time_us": 9.0, "native_time_us": 11.0, "busbw_gbps": 0.1,
           "native_busbw_gbps": 0.09, "candidates": [["native", {"transport": "nccl"}, 11.0]],
           "measured_at": "2026-12-01T09:00:07Z", "seconds": 0.7}
    was = replay.reuse({"inputs": inputs, "choice": old}, inputs)
    assert was is not None and was.config == Config("multiring", RING, "nccl")
    assert was.candidates == [(Config("native", {}, "nccl"), 11.0)]


def _two_buckets(tmp_path: Any) -> tuple[TuneOptions, list[BucketSummary], list[Choice]]:
    """Options, summaries and A/B choices of a finished two-bucket tune (1 and 4 KiB)."""
    opts = _opts(tmp_path, buckets=[1024, 4096])
    sums = [_summary(1024, [("rhd", {}, 9.0)]), _summary(4096, [("multiring", RING, 20.0)])]
    choices = [Choice(1024, Config("rhd"), 9.0, 11.0, 0.1, 0.09, [], "2026-12-01T09:00:07Z",
                      0.5),
               Choice(4096, Config("multiring", RING), 20.0, 30.0, 0.2, 0.1, [],
                      "2026-12-01T09:00:08Z", 0.5)]
    return opts, sums, choices


def test_same_record_same_profile_bytes_and_a_truthful_heading(tmp_path: Any) -> None:
    opts, sums, choices = _two_buckets(tmp_path)
    texts = {dump_profile(build_profile(IDENTITY, opts, sums, choices, 9.0, ALGOS))
             for _ in range(2)}
    assert len(texts) == 1
    prof = build_profile(IDENTITY, opts, sums, choices, 9.0, ALGOS)
    assert prof["created"] == "2026-12-01T09:00:08Z"
    assert prof["tuning"]["ran"] == "2026-12-01T09:00:00Z/2026-12-01T09:00:08Z"
    head = profile_heading(prof, "p.yaml", added=0)
    assert "10 trials, run 2026-12-01T09:00:00Z .. 2026-12-01T09:00:08Z" in head
    assert head.endswith("this run added 0")
    # A profile from before run times were recorded keeps its old heading.
    old = dict(prof, tuning={k: v for k, v in prof["tuning"].items() if k != "ran"})
    assert "10 trials in 9.0 s" in profile_heading(old)


@pytest.mark.parametrize("stamps", [[None, None], ["2026-12-01T09:00:07Z", None]])
def test_a_choice_measured_now_dates_the_profile_now(tmp_path: Any,
                                                     stamps: list[str | None]) -> None:
    opts = _opts(tmp_path, buckets=[1024, 4096])
    sums = [_summary(1024, []), _summary(4096, [])]
    choices = [Choice(b, Config("native"), 9.0, 9.0, 0.1, 0.1, [], s)
               for b, s in zip((1024, 4096), stamps)]
    created = build_profile(IDENTITY, opts, sums, choices, 1.0, ALGOS)["created"]
    assert created > "2026-12-01T09:00:07Z"


def test_a_workload_rerun_reuses_the_recorded_bucket_size(tmp_path: Any,
                                                          monkeypatch: Any) -> None:
    """``ringtune tune --workload``: the bucket-size search is recorded with what it was
    searched from; the rerun of a finished tune reuses it (same profile bytes, although a
    new search on a noisy machine would time, and here choose, differently), and another
    workload, dtype, budget or tuned rule table searches again."""
    from mpi4py import MPI

    from autotune import fusion

    searched: list[list[int]] = []

    def noisy_search(comm: Any, profile: Any, tensor_bytes: list[int], dtype: str,
                     budget_s: float = 30.0, rounds: int = 7) -> dict[str, Any]:
        assert profile.rules  # it runs under the tuned rules
        searched.append(list(tensor_bytes))
        return {"bucket_bytes": 4096 << (2 * len(searched)),
                "measured": {"tensors": len(tensor_bytes), "gradient_bytes": sum(tensor_bytes),
                             "dtype": dtype, "time_us": {"4096": 100.0 + len(searched)}}}

    monkeypatch.setattr(fusion, "search_bucket_bytes", noisy_search)
    opts, sums, choices = _two_buckets(tmp_path)
    storage = _storage(tmp_path)
    for s in sums:
        storage.create_new_study([optuna.study.StudyDirection.MINIMIZE], s.study)
    said: list[str] = []

    one = dict(IDENTITY, world_size=1, ranks_per_host=1)  # the world of COMM_SELF

    def run(tensors: list[int], dtype: str = "float32", budget: float = 5.0,
            rules: list[Choice] = choices) -> str:
        prof = build_profile(one, opts, sums, rules, 9.0, ALGOS)
        prof["fusion"] = fusion.tuned_fusion(MPI.COMM_SELF, storage, sums[0].study, prof,
                                             tensors, dtype, budget, say=said.append)
        return dump_profile(prof)

    first = run([4096, 8192])
    assert len(searched) == 1 and "searching" in said[-1]
    # A second storage object (a new process) on the same file: the record is read back.
    storage = _storage(tmp_path)
    assert run([4096, 8192]) == first
    assert len(searched) == 1 and "reused" in said[-1]
    # What the search depends on changed: searched again (and recorded anew).
    for kw in ({"tensors": [4096]}, {"tensors": [4096, 8192], "dtype": "float64"},
               {"tensors": [4096, 8192], "budget": 9.0},
               {"tensors": [4096, 8192], "rules": [choices[0], dataclasses.replace(
                   choices[1], config=Config("rhd"))]}):
        before = len(searched)
        run(**kw)  # type: ignore[arg-type]
        assert len(searched) == before + 1, kw
    again = run([4096, 8192])
    assert len(searched) == 6 and again != first  # the newest search is the record now
    assert run([4096, 8192]) == again and len(searched) == 6
    # A record this version cannot read is searched again, not trusted.
    inputs = fusion.fusion_inputs({"rules": []}, [1], "float32", 5.0)
    assert fusion.reuse({"inputs": inputs, "fusion": {"bucket_bytes": "x"}}, inputs) is None
    assert fusion.reuse(None, inputs) is None
