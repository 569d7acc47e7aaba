"""The tuner's single-process parts: search space, buckets, rule building, watchdog, report."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from typing import Any

import optuna
import pytest

from autotune import space
from autotune.choose import build_profile, rule_bounds
from autotune.naming import default_storage, power_of_4_buckets, study_name
from autotune.objective import timing_for
from autotune.records import BucketSummary, Choice, TuneOptions, TuneResult
from autotune.report import markdown_table, rule_table, write_report
from autotune.watchdog import Watchdog
from collectives.algorithms import get_algorithm
from collectives.plan import Config
from collectives.profile import profile_from_dict

FP = "sha256:" + "cd" * 32
IDENTITY = {"fingerprint": FP, "world_size": 4, "hosts": 1, "ranks_per_host": 4,
            "summary": "1 host x 4 ranks, cpu, shm"}


# -- space -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4, 6])
@pytest.mark.parametrize("nbytes", [1024, 1 << 20, 16 << 20])
def test_every_configuration_of_the_space_is_valid(n: int, nbytes: int) -> None:
    configs = space.enumerate_space(n, nbytes, space.searchable())
    assert configs
    keys = [space.config_key(cfg) for _, cfg in configs]
    assert len(keys) == len(set(keys)), "duplicates in the enumerated space"
    assert len({cfg for _, cfg in configs}) == len(configs), "equal records, other keys"
    algos = {cfg.algorithm for _, cfg in configs}
    assert {"native", "rhd", "multiring"} <= algos
    for _, cfg in configs:
        get_algorithm(cfg.algorithm).check_params(cfg.params, n)
        assert cfg.transport is None


def test_chunk_choices_fit_the_bucket() -> None:
    small = space.enumerate_space(2, 1024, ["multiring"])
    assert {c.params["chunk_bytes"] for _, c in small} == {0}
    big = space.enumerate_space(2, 16 << 20, ["multiring"])
    chunks = {c.params["chunk_bytes"] for _, c in big}
    assert 0 in chunks and max(chunks) < 16 << 20
    assert all(c == 0 or c & (c - 1) == 0 for c in chunks)


def test_order_is_searched_only_where_it_matters() -> None:
    two = space.enumerate_space(2, 1 << 20, ["multiring"])
    assert {c.params["order"] for _, c in two} == {"topology"}
    four = space.enumerate_space(4, 1 << 20, ["multiring"])
    assert {c.params["order"] for _, c in four} == {"topology", "identity"}


def test_suggest_with_optuna_accepts_dynamic_choices_and_enqueued_params() -> None:
    """A real Optuna study over several buckets' spaces: dynamic categorical choices (chunk
    lists that depend on the bucket or on rings) must not raise, and an enqueued grid point
    comes back as exactly that configuration."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.RandomSampler(seed=1))
    grid = space.enumerate_space(4, 1 << 20, space.searchable())
    tparams, cfg = grid[len(grid) // 2]
    study.enqueue_trial(tparams)
    trial = study.ask()
    assert space.suggest(trial, 4, 1 << 20, space.searchable()) == cfg
    study.tell(trial, 1.0)
    for i in range(60):
        trial = study.ask()
        cfg = space.suggest(trial, 4, [4096, 1 << 20, 16 << 20][i % 3], space.searchable())
        get_algorithm(cfg.algorithm).check_params(cfg.params, 4)
        study.tell(trial, float(i))


def test_trial_params_for_finds_guesses_in_the_space() -> None:
    grid = space.enumerate_space(2, 1 << 20, space.searchable())
    tp = space.trial_params_for(Config("multiring", {"rings": 2}), grid, 2)
    assert tp is not None and tp["algorithm"] == "multiring"
    native = space.trial_params_for(Config("native"), grid, 2)
    # native's only parameter (MPICH's impl, where the library lists algorithms) at auto.
    assert native is not None and native.pop("algorithm") == "native"
    assert all(k.startswith("native.impl") and v == "auto" for k, v in native.items())
    assert space.trial_params_for(Config("multiring", {"rings": 99}), grid, 2) is None


def test_searchable_rejects_unknown_and_hides_test_algorithms() -> None:
    assert "sleep" not in space.searchable()
    with pytest.raises(ValueError, match="unknown algorithm 'warp'"):
        space.searchable(["native", "warp"])


def test_world_of_one_has_no_parameters() -> None:
    configs = space.enumerate_space(1, 1 << 20, ["native", "multiring"])
    assert [cfg for _, cfg in configs] == [Config("native"), Config("multiring")]


# -- buckets, names, rules -------------------------------------------------------------------


def test_buckets_and_names() -> None:
    assert power_of_4_buckets(1024, 64 << 20) == [4 ** k for k in range(5, 14)]
    assert power_of_4_buckets(1000, 5000) == [1024, 4096]
    with pytest.raises(ValueError):
        power_of_4_buckets(5000, 1000)
    with pytest.raises(ValueError, match="no power of 4"):
        power_of_4_buckets(1025, 4095)
    assert default_storage("/a/b/local.yaml") == "sqlite:////a/b/local.db"
    assert study_name(None, FP, "float32", "sum", 4096) == \
        "ringtune-cdcdcdcdcdcdcdcd-float32-sum-4096B"
    assert study_name("mine", FP, "float32", "sum", 4096) == "mine-float32-sum-4096B"


def test_rule_bounds_are_contiguous_geometric_midpoints() -> None:
    b = rule_bounds([1024, 4096, 16384])
    assert b == [(0, 2047), (2048, 8191), (8192, None)]
    assert rule_bounds([4096]) == [(0, None)]


def _choice(nbytes: int, algo: str, params: dict[str, Any], t: float, native: float) -> Choice:
    return Choice(nbytes, Config(algo, params), t, native, nbytes / t / 1e3 * 1.5,
                  nbytes / native / 1e3 * 1.5)


def _result(choices: list[Choice]) -> TuneResult:
    sums = [BucketSummary(c.nbytes, f"s-float32-sum-{c.nbytes}B", "trials", 5,
                          [(c.config, c.time_us)],
                          {c.algorithm: (c.config, c.time_us),
                           "native": (Config("native"), c.native_time_us)})
            for c in choices]
    opts = TuneOptions(out="x.yaml", buckets=[c.nbytes for c in choices], storage="sqlite://")
    prof = build_profile(IDENTITY, opts, sums, choices, 12.0, ["native", "multiring"])
    return TuneResult(prof, sums, choices, 12.0, "x.yaml")


def test_build_profile_merges_equal_neighbours_and_validates() -> None:
    ring = {"rings": 2, "chunk_bytes": 65536, "order": "topology"}
    choices = [_choice(1024, "native", {}, 10.0, 10.0),
               _choice(4096, "native", {}, 12.0, 12.0),
               _choice(16384, "multiring", ring, 20.0, 30.0),
               _choice(65536, "multiring", ring, 40.0, 80.0)]
    prof = _result(choices).profile
    rules = prof["rules"]
    assert [r["algorithm"] for r in rules] == ["native", "multiring"]
    assert (rules[0]["min_bytes"], rules[0]["max_bytes"]) == (0, 8191)
    assert (rules[1]["min_bytes"], rules[1]["max_bytes"]) == (8192, None)
    # The merged rule keeps the largest bucket's figures.
    assert rules[1]["measured"]["bytes"] == 65536
    assert rules[1]["measured"]["speedup"] == 2.0
    loaded = profile_from_dict(prof, "built", world_size=4)
    assert loaded.select(10000)[1].params == ring
    assert prof["tuning"]["buckets"] == [1024, 4096, 16384, 65536]


def test_rule_table_and_report(tmp_path: Any) -> None:
    ring = {"rings": 2, "chunk_bytes": 0, "order": "topology"}
    kept = dataclasses.replace(_choice(4096, "native", {}, 12.0, 12.0),
                               note="native kept: rhd lost to native in round 2 of 3")
    result = _result([kept, _choice(1 << 20, "multiring", ring, 100.0, 150.0)])
    table = rule_table(result.profile)
    assert "multiring" in table and "1.50x" in table and "1.00x" in table
    md = markdown_table(["a", "b"], [["1", "x|y"]])
    assert md.splitlines()[2] == "| 1 | x\\|y |"
    paths = write_report(str(tmp_path / "rep"), result)
    png, mdpath = paths
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    text = open(mdpath).read()
    assert "| multiring |" in text and "busbw.png" in text
    assert "- 4 KiB: native kept: rhd lost to native in round 2 of 3" in text
    assert not [f for f in os.listdir(tmp_path / "rep") if f.endswith(".tmp")]


# -- objective and watchdog ------------------------------------------------------------------


def test_timing_for_bounds() -> None:
    assert timing_for(1.0).iters == 20
    assert timing_for(1e6).iters == 3
    t = timing_for(10_000.0)
    assert 3 <= t.iters <= 20 and 1 <= t.warmup <= 5 and t.quick_iters < t.iters


def test_watchdog_fires_once_with_the_description() -> None:
    fired: list[str] = []
    done = threading.Event()

    def abort(msg: str) -> None:
        fired.append(msg)
        done.set()

    wd = Watchdog(0.2, abort)
    wd.arm("trial 7 (multiring rings=3)", lambda d: f"recorded {d}")
    assert done.wait(5)
    assert fired == ["recorded trial 7 (multiring rings=3)"]
    wd.close()


def test_watchdog_disarmed_does_not_fire() -> None:
    fired: list[str] = []
    wd = Watchdog(0.3, fired.append)
    for _ in range(3):
        wd.arm("quick trial", lambda d: d)
        time.sleep(0.05)
        wd.disarm()
    time.sleep(0.5)
    wd.close()
    assert fired == []
    off = Watchdog(None, fired.append)  # --trial-timeout 0: no thread at all
    off.arm("x", lambda d: d)
    off.close()
    assert fired == []


# -- the configuration record -------------------------------------------------------------


def test_config_is_frozen_hashable_and_keeps_the_recorded_key() -> None:
    a = Config("hierarchical", {"dims": [2, 2], "inner": ["rhd", "native"]}, "nccl")
    b = Config("hierarchical", {"inner": ("rhd", "native"), "dims": (2, 2)}, "nccl")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != a.with_transport(None) and a != a.with_transport("staged")
    # Read-only: a value read out is a copy, and the record itself cannot be changed.
    a.params["dims"].append(7)
    assert a.params["dims"] == [2, 2]
    with pytest.raises(TypeError):
        a.params["dims"] = [4]  # type: ignore[index]
    with pytest.raises(AttributeError):
        a.transport = "mpi"  # type: ignore[misc]
    # The key is the text studies recorded before Config (transport among the params), so
    # a resumed study recognises what it measured.
    assert a.key == json.dumps(["hierarchical", {"dims": [2, 2], "inner": ["rhd", "native"],
                                                 "transport": "nccl"}], sort_keys=True)
    assert a.text() == "hierarchical transport=nccl dims=2x2 inner=rhd,native"
    # The transport is a field, never a parameter; old records with it inside params read.
    with pytest.raises(ValueError, match="transport"):
        Config("native", {"transport": "nccl"})
    assert Config.from_record("native", {"transport": "nccl"}) == Config("native", {}, "nccl")
    assert Config.from_record(**a.record()) == a
