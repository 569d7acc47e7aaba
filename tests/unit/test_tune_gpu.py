"""The tuner on GPU buffers, tested on the CPU through seams: the ``transport`` parameter of
the search space, the collective choice of backend and transports (fake communicator and
fake ``available_transports``), the driver's warm start, the GPU profile (per-rule
transports, checked by the loader and the JSON Schema) and ``--backend cupy`` without CuPy."""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
import optuna
import pytest

import collectives.cuda as C
from autotune import space
from autotune.bucket_search import Driver
from autotune.choose import build_profile, native_config
from autotune.naming import study_name
from autotune.records import BucketSummary, Choice, TuneError, TuneOptions
from autotune.report import rule_table
from autotune.tuning import common_transports, resolve_backend
from collectives.algorithms import get_algorithm
from collectives.cuda import detect as D
from collectives.plan import Config
from collectives.profile import profile_from_dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA_PATH = os.path.join(ROOT, "profiles", "schema", "profile-v1.schema.json")
IDENTITY = {"fingerprint": "sha256:" + "ab" * 32, "world_size": 4, "hosts": 1,
            "ranks_per_host": 4, "summary": "1 host x 4 ranks, gpu"}


class FakeComm:
    """An mpi4py-like communicator of ``len(others) + 1`` ranks seen from rank 0: what the
    other ranks contribute to each allgather is scripted, one list per gather."""

    def __init__(self, *gathers: list[Any]) -> None:
        self.gathers = list(gathers)

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's spelling
        return 0

    def allgather(self, mine: Any) -> list[Any]:
        return [mine] + self.gathers.pop(0)


# --- the search space -----------------------------------------------------------------


def test_cupy_space_has_transport_with_exactly_the_given_choices() -> None:
    transports = ["nccl", "staged"]
    grid = space.enumerate_space(2, 1 << 20, space.searchable(), transports)
    seen = {cfg.transport for _, cfg in grid}
    assert seen == set(transports)
    for tparams, cfg in grid:
        assert tparams[space.TRANSPORT_PARAM] == cfg.transport
        # The transport is the record's own field, never one of the algorithm's params.
        assert cfg.transport in transports and space.TRANSPORT_PARAM not in cfg.params
        # The params are valid for the algorithm as they are.
        space.normalise(cfg, 2)
        get_algorithm(cfg.algorithm).check_params(cfg.params, 2)
    # The recorded key still names the transport (studies written before Config resume).
    assert all(json.loads(cfg.key)[1][space.TRANSPORT_PARAM] == cfg.transport
               for _, cfg in grid)
    # Every host configuration exists once per transport.
    host = space.enumerate_space(2, 1 << 20, space.searchable())
    assert len(grid) == len(host) * len(transports)


def test_numpy_space_has_no_transport() -> None:
    for tparams, cfg in space.enumerate_space(4, 1 << 20, space.searchable()):
        assert space.TRANSPORT_PARAM not in tparams and space.TRANSPORT_PARAM not in cfg.params
        assert cfg.transport is None
    study = optuna.create_study()
    trial = study.ask()
    space.suggest(trial, 4, 1 << 20, space.searchable())
    assert space.TRANSPORT_PARAM not in trial.distributions


def test_optuna_trial_gets_a_categorical_transport() -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(6):
        trial = study.ask()
        cfg = space.suggest(trial, 4, 1 << 20, space.searchable(), ["mpi", "staged"])
        dist = trial.distributions[space.TRANSPORT_PARAM]
        assert isinstance(dist, optuna.distributions.CategoricalDistribution)
        assert list(dist.choices) == ["mpi", "staged"]
        assert cfg.transport in ("mpi", "staged")
        assert cfg.transport == trial.params[space.TRANSPORT_PARAM]
        assert space.TRANSPORT_PARAM not in cfg.params
        study.tell(trial, 1.0)


def test_normalise_keeps_the_transport_and_guesses_are_found() -> None:
    grid = space.enumerate_space(2, 1 << 20, space.searchable(), ["nccl", "staged"])
    guess = Config("rhd", {}, "staged")
    assert space.normalise(guess, 2).transport == "staged"
    tparams = space.trial_params_for(guess, grid, 2)
    assert tparams is not None and tparams[space.TRANSPORT_PARAM] == "staged"
    assert space.trial_params_for(Config("rhd", {}, "mpi"), grid, 2) is None
    # Without a transport the guess is none of the GPU space's configurations either.
    assert space.trial_params_for(Config("rhd"), grid, 2) is None


def test_study_names_keep_host_and_gpu_apart() -> None:
    fp = IDENTITY["fingerprint"]
    host = study_name(None, fp, "float32", "sum", 4096)
    gpu = study_name(None, fp, "float32", "sum", 4096, "cupy", ["nccl", "staged"])
    other = study_name(None, fp, "float32", "sum", 4096, "cupy", ["staged"])
    assert len({host, gpu, other}) == 3
    assert host == study_name(None, fp, "float32", "sum", 4096, "numpy", None)
    # The profile's ``tuning.study`` takes the prefix with rsplit("-", 3).
    assert gpu.rsplit("-", 3)[0].endswith("-cupy.nccl.staged")


# --- choosing the backend and the transports -------------------------------------------


def test_common_transports_keep_rank_0_order() -> None:
    assert common_transports([["nccl", "mpi", "staged"], ["staged", "mpi"],
                              ["mpi", "staged", "nccl"]]) == ["mpi", "staged"]
    assert common_transports([["staged"], []]) == []


def _fake_transports(monkeypatch: pytest.MonkeyPatch, mine: list[str]) -> list[Any]:
    calls: list[Any] = []

    def fake(comm: Any = None) -> list[str]:
        calls.append(comm)
        return list(mine)

    monkeypatch.setattr(C, "available_transports", fake)
    monkeypatch.setattr(D, "cupy_status", lambda: (bool(mine), "CUDA sees no GPU (0)"))
    return calls


def test_resolve_cupy_intersects_every_ranks_transports(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    calls = _fake_transports(monkeypatch, ["nccl", "mpi", "staged"])
    comm = FakeComm([(["staged", "nccl"], "", "")])
    assert resolve_backend(comm, "cupy") == ("cupy", ["nccl", "staged"])
    # The collective form was used (nccl decided from every rank's GPU).
    assert calls == [comm]


def test_resolve_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_transports(monkeypatch, ["staged"])
    comm = FakeComm([(["mpi", "staged"], "", "")])
    assert resolve_backend(comm, "auto") == ("cupy", ["staged"])
    # A rank without a GPU: host buffers.
    assert resolve_backend(FakeComm([([], "no GPU", "")]), "auto") == ("numpy", None)
    _fake_transports(monkeypatch, [])
    assert resolve_backend(FakeComm([(["staged"], "", "")]), "auto") == ("numpy", None)


def test_resolve_numpy_probes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_transports(monkeypatch, ["staged"])
    assert resolve_backend(FakeComm(), "numpy") == ("numpy", None)
    assert calls == []


def test_resolve_cupy_names_the_rank_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_transports(monkeypatch, ["staged"])
    with pytest.raises(TuneError, match=r"rank 2 .*CUDA sees no GPU.*ringtune\[cuda\]") as e:
        resolve_backend(FakeComm([(["staged"], "", ""), ([], "CUDA sees no GPU (0)", "")]),
                        "cupy")
    assert e.value.usage and "\n" not in str(e.value)
    with pytest.raises(TuneError, match="share no GPU transport") as e:
        resolve_backend(FakeComm([(["nccl"], "", "")]), "cupy")
    assert e.value.usage


def test_resolve_reports_a_probe_error_on_every_rank(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    _fake_transports(monkeypatch, ["staged"])
    bad = "ValueError: RINGTUNE_CUDA_AWARE='yes please': use 0 or 1"
    with pytest.raises(TuneError, match=r"--backend auto: rank 1: ValueError: RINGTUNE") as e:
        resolve_backend(FakeComm([([], bad, bad)]), "auto")
    assert e.value.usage

    def broken(comm: Any = None) -> list[str]:
        raise ValueError("RINGTUNE_CUDA_AWARE='yes please': use 0 or 1")

    monkeypatch.setattr(C, "available_transports", broken)
    comm = FakeComm([(["staged"], "", "")])
    with pytest.raises(TuneError, match=r"rank 0: ValueError: RINGTUNE_CUDA_AWARE"):
        resolve_backend(comm, "cupy")
    # It still took part in the gather (no rank left waiting).
    assert comm.gathers == []


# --- the driver's warm start on GPU ----------------------------------------------------


def test_driver_warm_starts_native_with_the_best_transport() -> None:
    opts = TuneOptions(out="x.yaml", buckets=[1 << 20], trials=4, backend="cupy",
                       transports=["mpi", "staged"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    driver = Driver(opts, optuna.storages.InMemoryStorage(), "s", 1 << 20, 2,
                    ["native", "multiring", "rhd"])
    driver.prepare()
    cmd = driver.next_command(deadline=float("inf"))
    assert cmd["op"] == "run"
    assert cmd["config"] == native_config(opts, 2) == Config("native", {}, "mpi")
    assert dict(cmd["config"].params) == {}
    for _ in range(3):
        from autotune.objective import COMPLETE, TrialOutcome

        driver.record(TrialOutcome(COMPLETE, 10.0, 1.0))
        cmd = driver.next_command(deadline=float("inf"))
        if cmd["op"] == "done":
            break
        assert cmd["config"].transport in ("mpi", "staged")
        assert space.TRANSPORT_PARAM not in cmd["config"].params


# --- the GPU profile ---------------------------------------------------------------------


def _gpu_profile(choices: list[Choice], transports: list[str]) -> dict[str, Any]:
    sums = [BucketSummary(c.nbytes, f"p-cupy.x-float32-sum-{c.nbytes}B", "trials", 5,
                          [(c.config, c.time_us)], {})
            for c in choices]
    opts = TuneOptions(out="x.yaml", buckets=[c.nbytes for c in choices], storage="sqlite://",
                       backend="cupy", transports=transports)
    return build_profile(IDENTITY, opts, sums, choices, 3.0, ["native", "multiring"])


def _choice(nbytes: int, algo: str, params: dict[str, Any],
            transport: str | None = None) -> Choice:
    return Choice(nbytes, Config(algo, params, transport), 10.0, 12.0, 2.0, 1.5)


def _schema() -> jsonschema.Draft202012Validator:
    with open(SCHEMA_PATH, encoding="utf-8") as fh:
        return jsonschema.Draft202012Validator(json.load(fh))


def test_gpu_profile_records_backend_and_per_rule_transports() -> None:
    ring = {"rings": 2, "chunk_bytes": 0, "order": "topology"}
    choices = [_choice(1024, "native", {}, "nccl"),
               _choice(4096, "native", {}, "staged"),
               _choice(16384, "multiring", ring, "staged"),
               _choice(65536, "multiring", ring, "staged")]
    prof = _gpu_profile(choices, ["nccl", "staged"])
    assert prof["backend"] == "cupy"
    assert prof["transport"] == "staged"  # used by 3 of the 4 buckets
    rules = prof["rules"]
    # Same algorithm, other transport: not merged; equal neighbours merged.
    assert [(r["algorithm"], r.get("transport")) for r in rules] == [
        ("native", "nccl"), ("native", None), ("multiring", None)]
    assert all("transport" not in r["params"] for r in rules)
    assert prof["tuning"]["transports"] == ["nccl", "staged"]
    assert list(_schema().iter_errors(json.loads(json.dumps(prof)))) == []
    loaded = profile_from_dict(prof, "built", world_size=4)
    assert loaded.backend == "cupy" and loaded.transport == "staged"
    assert loaded.select(100)[1].transport == "nccl"
    assert loaded.select(5000)[1].transport in (None, "staged")
    assert loaded.select(1 << 20)[1].params == ring
    table = rule_table(prof)
    assert "transport=nccl" in table and "transport=staged" in table


def test_gpu_profile_tie_goes_to_the_preferred_transport() -> None:
    prof = _gpu_profile([_choice(1024, "native", {}, "staged"),
                         _choice(1 << 20, "native", {}, "nccl")],
                        ["nccl", "staged"])
    assert prof["transport"] == "nccl"
    assert [r.get("transport") for r in prof["rules"]] == ["staged", None]
    assert list(_schema().iter_errors(json.loads(json.dumps(prof)))) == []
    profile_from_dict(prof, "built", world_size=4)


def test_host_profile_form_is_unchanged() -> None:
    opts = TuneOptions(out="x.yaml", buckets=[1024], storage="sqlite://")
    c = _choice(1024, "native", {})
    prof = build_profile(IDENTITY, opts, [BucketSummary(1024, "s-float32-sum-1024B", "t", 1)],
                         [c], 1.0, ["native"])
    assert (prof["backend"], prof["transport"]) == ("numpy", "mpi")
    assert "transport" not in prof["rules"][0] and "transports" not in prof["tuning"]
    assert native_config(opts, 4) == Config("native")
    assert native_config(opts, 4).transport is None
