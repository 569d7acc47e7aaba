"""Golden profiles: the same studies give the same profile bytes, through every builder.

Every path that assembles a profile document is fed fixed inputs and its written file
(``write_profile``: validated, YAML, atomic) is compared byte for byte with a checked-in
file under ``tests/golden/profile/``:

- ``ringtune tune``'s builder (``autotune.choose.build_profile``) on the summaries a
  ``Driver`` reads from an in-memory Optuna study of fixed trials and the A/B choices
  recorded in it (``autotune.replay``, what a rerun reuses): no timing, under the ``mpi``
  engine (the library's version fixed) and under ``tests/toy_engine.py``;
- online tuning's document (``collectives.online.document.tuned_document``) over the
  built-in defaults and over a loaded profile file, with fixed settled classes;
- ``Profile.to_dict`` through ``dump_profile``: the built-in defaults of each layout, a
  loaded file, a section of a several-shape file.

The clock, the job name and the MPI library's version text are pinned; nothing else is.
A difference is a change of the bytes ringtune writes for the same inputs: a refactoring
must keep them. Only an intended change of the format regenerates the files (and its
commit says why)::

    PYTHONPATH=. .venv/bin/python tests/unit/test_profile_golden.py
"""

from __future__ import annotations

import datetime
import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectives.plan import Config
from collectives.profile import builtin_profile, load_profile, profile_from_dict, write_profile

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "profile"
#: Inputs (hand-written profiles) the cases start from, relative to the checkout (the
#: cases run there): online tuning's document names the file it started from.
BASE = "tests/golden/profile/input-base.yaml"
SHAPES = "tests/golden/profile/input-shapes.yaml"
TOPOLOGY = ROOT / "tests" / "fixtures" / "dgx-a100" / "topology.yaml"

FP = "sha256:" + "ab" * 32
IDENTITY = {"fingerprint": FP, "world_size": 4, "hosts": 1, "ranks_per_host": 4,
            "summary": "1 host x 4 ranks, cpu, shm"}
ALGOS = ["native", "rhd", "multiring"]
BUCKETS = [1024, 16384, 262144, 4194304]
MPI_VERSION_TEXT = "MPICH Version:      4.1.2\nMPICH Release date: Wed Jun  7 15:22:45 CDT 2023\n"
#: The pinned clock: every "now" of a builder.
NOW = datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc)
TOY = "tests.toy_engine"


# -- pinning -----------------------------------------------------------------------------------


class _FrozenDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz: Any = None) -> Any:  # type: ignore[override]
        return NOW if tz is not None else NOW.replace(tzinfo=None)

    @classmethod
    def utcnow(cls) -> Any:  # type: ignore[override]
        return NOW.replace(tzinfo=None)


def _pin(mp: pytest.MonkeyPatch) -> None:
    """The clock, the job's name, the MPI library's version text and the folder: fixed."""
    from mpi4py import MPI

    mp.chdir(ROOT)
    mp.setattr(datetime, "datetime", _FrozenDatetime)
    mp.setattr(MPI, "Get_library_version", lambda: MPI_VERSION_TEXT)
    mp.setenv("SLURM_JOB_ID", "4242")


def _toy_engine(mp: pytest.MonkeyPatch) -> None:
    """``tests/toy_engine.py`` registered into a copy of the engine registry (gone after)."""
    from collectives.engines import registry as engines

    engines.engine_names()
    mp.setattr(engines, "_ENGINES", dict(engines._ENGINES))
    sys.modules.pop(TOY, None)
    importlib.import_module(TOY)


# -- ringtune tune -----------------------------------------------------------------------------


def _stamp(minute: int) -> datetime.datetime:
    return datetime.datetime(2026, 3, 1, 10, minute, 0, tzinfo=datetime.timezone.utc)


#: Per bucket: (configuration, time_us) of each measured trial, in trial order.
TRIALS: dict[int, list[tuple[Config, float]]] = {
    1024: [(Config("native"), 8.0), (Config("rhd"), 9.5),
           (Config("native", {"impl": "recursive_doubling"}), 7.9),
           (Config("multiring", {"rings": 1, "chunk_bytes": 0, "order": "topology"}), 14.0)],
    16384: [(Config("native"), 20.0), (Config("rhd"), 16.0),
            (Config("native", {"impl": "ring"}), 21.0), (Config("rhd"), 16.5)],
    262144: [(Config("native"), 120.0),
             (Config("multiring", {"rings": 2, "chunk_bytes": 65536, "order": "topology"}),
              80.0), (Config("rhd"), 95.0)],
    4194304: [(Config("native"), 2400.0),
              (Config("multiring", {"rings": 2, "chunk_bytes": 65536, "order": "topology"}),
               1500.0), (Config("native", {"impl": "ring"}), 2300.0)],
}
#: Per bucket: the recorded A/B (chosen configuration, its time, native's, the other
#: candidates' times, unstable, spread).
AB: dict[int, tuple[Config, float, float, list[tuple[Config, float]], bool, float]] = {
    1024: (Config("native"), 8.1, 8.1,
           [(Config("native", {"impl": "recursive_doubling"}), 7.95), (Config("rhd"), 9.4)],
           False, 0.0),
    16384: (Config("rhd"), 15.8, 20.2, [(Config("native", {"impl": "ring"}), 20.9)],
            True, 0.3125),
    262144: (Config("multiring", {"rings": 2, "chunk_bytes": 65536, "order": "topology"}),
             79.0, 121.0, [(Config("rhd"), 96.0)], False, 0.0),
    4194304: (Config("multiring", {"rings": 2, "chunk_bytes": 65536, "order": "topology"}),
              1490.0, 2410.0, [(Config("native", {"impl": "ring"}), 2290.0)], False, 0.0),
}


def _tuned(engine: dict[str, str]) -> dict[str, Any]:
    """The profile ``ringtune tune`` builds from fixed trials and recorded choices."""
    import optuna

    from autotune import replay
    from autotune.bucket_search import Driver
    from autotune.choose import build_profile
    from autotune.objective import COMPLETE
    from autotune.records import BucketSummary, Choice, TuneOptions
    from autotune.space import config_key

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.InMemoryStorage()
    opts = TuneOptions(out="golden.yaml", buckets=BUCKETS, trials=4, storage="sqlite://",
                       sampler="random", seed=7, algorithms=ALGOS, margin=0.03)
    summaries: list[BucketSummary] = []
    for b, nbytes in enumerate(BUCKETS):
        name = f"golden-float32-sum-{nbytes}B"
        study = optuna.create_study(storage=storage, study_name=name, direction="minimize")
        for k, (cfg, t) in enumerate(TRIALS[nbytes]):
            trial = optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=t,
                user_attrs={"config": {**cfg.record(), "key": config_key(cfg)},
                            "result": {"state": COMPLETE, "time_us": t,
                                       "busbw_gbps": round(nbytes / t / 1e3, 4)}})
            trial.datetime_start = _stamp(10 * b + 2 * k)
            trial.datetime_complete = _stamp(10 * b + 2 * k + 1)
            study.add_trial(trial)
        driver = Driver(opts, storage, name, nbytes, IDENTITY["world_size"], ALGOS)
        summaries.append(driver.finish("trials"))
    for i, s in enumerate(summaries):
        cfg, t, nat, others, unstable, spread = AB[s.nbytes]
        n = IDENTITY["world_size"]
        choice = Choice(s.nbytes, cfg, t, nat, round(s.nbytes / t / 1e3 * 1.5, 6),
                        round(s.nbytes / nat / 1e3 * 1.5, 6),
                        [(Config("native"), nat), *([(cfg, t)] if cfg != Config("native")
                                                    else []), *others],
                        unstable=unstable, spread=spread)
        inputs = replay.choice_inputs(opts, summaries, i, n)
        replay.save_choice(storage, s.study, choice, inputs)
    recorded = replay.load_choices(storage, [s.study for s in summaries])
    choices = [replay.reuse(recorded[i], replay.choice_inputs(opts, summaries, i,
                                                              IDENTITY["world_size"]))
               for i in range(len(summaries))]
    assert all(c is not None for c in choices)
    seconds = sum(s.trial_seconds for s in summaries) + sum(c.seconds for c in choices
                                                            if c is not None)
    return build_profile(IDENTITY, opts, summaries, [c for c in choices if c is not None],
                         seconds, ALGOS, engine=engine)


def case_tune_mpi(mp: pytest.MonkeyPatch) -> Any:
    return _tuned({"engine": "mpi", "backend": "MPICH"})


def case_tune_toy(mp: pytest.MonkeyPatch) -> Any:
    _toy_engine(mp)
    from tests import inproc

    inproc.register()
    return _tuned({"engine": "toy", "backend": "threads"})


# -- online tuning ---------------------------------------------------------------------------


class _Comm:
    """What the online document reads of a ``Communicator``, fixed."""

    def __init__(self, profile: Any, size: int, engine: str = "mpi") -> None:
        from collectives.engines import get_engine
        from probes.topology import Topology

        topo = Topology.from_yaml(TOPOLOGY.read_text(), str(TOPOLOGY))
        self.profile = profile
        self.size = size
        self.rank = 0
        self.comm = None
        self.hosts = ["dgx-a100"] * size
        self.topology = topo
        self.engine = get_engine(engine)

    def default_transport(self, backend: Any) -> str:
        return str(self.engine.default_transport(None, backend))


class _Tuner:
    """A tuner's state at the end of a job (``collectives.online.document.TunerState``)."""

    def __init__(self, comm: _Comm) -> None:
        from collectives.online.document import Settled
        from collectives.online.options import OnlineOptions
        from collectives.online.race import SizeClass

        self.comm = comm
        self.opts = OnlineOptions(seed=3)
        self.job = "SLURM_JOB_ID=4242"
        self.started_utc = "2026-03-04T04:00:00Z"
        self.calls = 1234
        self.exploring_calls = 56
        self.explore_seconds = 1.23456
        self.earlier: frozenset[int] = frozenset({4096})
        ring = Config("multiring", {"rings": 2, "chunk_bytes": 0, "order": "topology"})
        self.settled = {
            (4096, "float32", "sum", "numpy", None, None, None):
                Settled(Config("native"), 10, earlier=True, reason="settled by an earlier job"),
            (65536, "float32", "sum", "numpy", None, None, None):
                Settled(Config("rhd"), 24, 51.25, 60.5, "every candidate measured",
                        native=({"impl": "ring", "composition": "auto"}, 60.5e-6)),
            (1 << 22, "float32", "sum", "numpy", None, None, None):
                Settled(ring, 17, 1812.5, 2400.125, "every candidate measured",
                        native=({"impl": "auto"}, 2400.125e-6)),
        }
        # A class still exploring when the job ended: what was learnt is kept.
        sc = SizeClass(1 << 18, [Config("native"), Config("rhd"), ring], self.opts)
        for index, t in ((0, 1.5e-4), (1, 1.2e-4), (2, 1.1e-4), (2, 1.15e-4)):
            sc.report(index, t)
        self.classes = {(1 << 16, "float32", "sum", "numpy", None, None, None): sc}


def _online(profile: Any, size: int) -> dict[str, Any]:
    from collectives.online.document import tuned_document

    return tuned_document(_Tuner(_Comm(profile, size)))


def case_online_builtin(mp: pytest.MonkeyPatch) -> Any:
    return _online(builtin_profile(4, hosts=1, engine="mpi"), 4)


def case_online_loaded(mp: pytest.MonkeyPatch) -> Any:
    return _online(load_profile(BASE, 4), 4)


def case_online_shapes(mp: pytest.MonkeyPatch) -> Any:
    return _online(load_profile(SHAPES, section_for=8), 8)


# -- Profile.to_dict ----------------------------------------------------------------------------


def case_profile_builtin_one_host(mp: pytest.MonkeyPatch) -> Any:
    return builtin_profile(4, hosts=1, engine="mpi")


def case_profile_builtin_torch_grid(mp: pytest.MonkeyPatch) -> Any:
    return builtin_profile(8, hosts=2, engine="torch", even=True)


def case_profile_builtin_hosts(mp: pytest.MonkeyPatch) -> Any:
    return builtin_profile(6, hosts=3, engine="mpi")


def case_profile_loaded(mp: pytest.MonkeyPatch) -> Any:
    return load_profile(BASE, 4)


def case_profile_section(mp: pytest.MonkeyPatch) -> Any:
    return load_profile(SHAPES, section_for=8)


def case_profile_from_dict(mp: pytest.MonkeyPatch) -> Any:
    import yaml

    data = yaml.safe_load((ROOT / BASE).read_text())
    data["rules"][0]["params"] = {"impl": "auto"}
    return profile_from_dict(data, "<golden>", world_size=4)


CASES: dict[str, Callable[[pytest.MonkeyPatch], Any]] = {
    name[len("case_"):].replace("_", "-"): fn for name, fn in sorted(globals().items())
    if name.startswith("case_") and callable(fn)}


def written(case: str, folder: Path) -> bytes:
    """The bytes ``write_profile`` writes for ``case`` (inputs and clock pinned)."""
    toy_before = TOY in sys.modules
    with pytest.MonkeyPatch.context() as mp:
        _pin(mp)
        built = CASES[case](mp)
        path = folder / f"{case}.yaml"
        write_profile(built, path)
    if not toy_before:
        sys.modules.pop(TOY, None)  # registered into a copy of the registry, gone now
    return path.read_bytes()


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("RINGTUNE_PROFILE", "RINGTUNE_TUNE", "RINGTUNE_TUNE_OUT"):
        monkeypatch.delenv(var, raising=False)
    yield


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_inputs_write_the_same_bytes(case: str, tmp_path: Path) -> None:
    golden = GOLDEN / f"{case}.yaml"
    got = written(case, tmp_path)
    assert golden.exists(), f"{golden} missing: regenerate (see this module's docstring)"
    want = golden.read_bytes()
    assert got == want, (
        f"{case}: the written profile differs from {golden.relative_to(ROOT)}; a refactoring "
        "must keep these bytes (an intended format change regenerates them: see the "
        f"docstring)\n--- got ---\n{got.decode()}")


def test_every_golden_file_is_a_case() -> None:
    outputs = {p.stem for p in GOLDEN.glob("*.yaml") if not p.name.startswith("input-")}
    assert outputs == set(CASES), "a golden file without its case, or the reverse"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(CASES):
            data = written(name, Path(tmp))
            (GOLDEN / f"{name}.yaml").write_bytes(data)
            print(f"wrote {GOLDEN.relative_to(ROOT)}/{name}.yaml ({len(data)} bytes)")
