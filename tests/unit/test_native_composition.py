"""``native composition=``: MPICH's allreduce composition as a parameter of ``native``.

The parameter is validated with messages naming it, appears in the generated schema, is
searched only where it can change anything (MPICH, a world on several hosts), and the cost
model describes each composition (alpha: the node-aware composition; beta: the flat
halving/doubling over every rank; auto: what MPICH's own selection runs)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autotune import space
from autotune.model import Model
from collectives.algorithms import get_algorithm
from collectives.natives import mpich

from .test_model import two_hosts

NATIVE = get_algorithm("native")
MPICH = not mpich.unavailable_reason()


def test_check_params_accepts_every_composition_and_names_the_key_on_a_bad_one() -> None:
    for comp in ("auto", "alpha", "beta", "gamma", "delta"):
        assert NATIVE.check_params({"composition": comp}, 4) == {"composition": comp}
    for bad in ("omega", 2, None, "Alpha"):
        with pytest.raises(ValueError, match=r"^composition: expected one of auto, alpha"):
            NATIVE.check_params({"composition": bad}, 4)
    assert NATIVE.check_params({"impl": "auto", "composition": "beta"}, 4) == {
        "impl": "auto", "composition": "beta"}


def _configs(hosts: int) -> list[dict[str, Any]]:
    return [cfg.params for _, cfg in space.enumerate_space(4, 1 << 22, ["native"],
                                                           hosts=hosts)]


@pytest.mark.skipif(not MPICH, reason=mpich.unavailable_reason() or "MPICH")
def test_the_parameter_names_the_compositions_mpich_sets() -> None:
    """``native``'s composition names are the MPICH module's, which are the values of the
    installed MPICH's variable."""
    from collectives.natives import all_compositions

    assert mpich.Mpich.compositions == tuple(mpich.COMPOSITIONS) == all_compositions()
    assert set(mpich.compositions()) <= set(mpich.COMPOSITIONS)
    assert set(mpich.Mpich.searched_compositions) == set(mpich.COMPOSITIONS) - {"gamma"}


def test_searched_only_across_hosts_on_mpich() -> None:
    one, two = _configs(1), _configs(2)
    assert not any("composition" in p for p in one)
    comps = {p.get("composition", "auto") for p in two}
    assert comps == {"auto", "alpha", "beta", "delta"}  # gamma: one node only
    # Every algorithm under every composition; nothing lost from the one-host space.
    assert len(two) == 4 * len(one)
    assert all(NATIVE.check_params(p, 4) == p for p in two)
    # The tuner's own (Optuna) path also asks for it only across hosts.
    import optuna

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    asked = [space.suggest(study.ask(), 4, 1 << 22, ["native"], hosts=h).params
             for h in (1, 2) for _ in range(30)]
    assert not any("composition" in p for p in asked[:30])
    assert any("composition" in p for p in asked[30:])


def test_not_searched_without_mpich(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mpich, "native_algorithms", lambda: [])
    monkeypatch.setattr(mpich.Mpich, "compositions_searchable", lambda self: False)
    assert _configs(2) == [{}]


def test_the_model_describes_each_composition() -> None:
    m = Model(two_hosts())
    sizes = np.array([64.0 * 8192, 4.0 * 2**20])
    alpha = m.time("native", {"composition": "alpha"}, sizes)
    beta = m.time("native", {"composition": "beta"}, sizes)
    # auto is what MPICH 5.0.2 selects across hosts with several ranks per host: alpha.
    assert np.allclose(m.time("native", {}, sizes), alpha, rtol=1e-12)
    # beta: the flat halving/doubling over all four ranks.
    assert np.allclose(beta, m.native_allreduce(1, 4, sizes), rtol=1e-12)
    assert not np.allclose(alpha, beta, rtol=1e-3)
    # delta: the leaders' allreduce framed by shared-memory phases of S/k per rank.
    leaders = m.node_leaders()
    delta = m.time("native", {"composition": "delta"}, sizes)
    assert np.all(delta > leaders.native_allreduce(1, leaders.n, sizes))
    assert not np.allclose(delta, alpha, rtol=1e-3)
    # Not the composition (not MPICH's model): every composition is the flat formula.
    best = Model(two_hosts("best"))
    for comp in ("auto", "alpha", "beta", "delta"):
        assert np.allclose(best.time("native", {"composition": comp}, sizes),
                           best.native_allreduce(1, 4, sizes), rtol=1e-12)


@pytest.mark.skipif(not MPICH, reason=mpich.unavailable_reason() or "MPICH")
def test_the_tuner_tries_the_flat_composition_early_only_across_hosts() -> None:
    import optuna

    from autotune.bucket_search import Driver
    from autotune.objective import COMPLETE, TrialOutcome
    from autotune.records import TuneOptions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen = {}
    for hosts in (1, 2):
        opts = TuneOptions(out="x.yaml", buckets=[1 << 22], trials=3)
        driver = Driver(opts, optuna.storages.InMemoryStorage(), "s", 1 << 22, 4,
                        ["native", "multiring"], hosts)
        driver.prepare()
        configs = []
        for _ in range(3):
            cmd = driver.next_command(deadline=float("inf"))
            if cmd["op"] != "run":
                break
            configs.append(cmd["config"])
            driver.record(TrialOutcome(COMPLETE, 10.0, 1.0))
        seen[hosts] = configs
    assert seen[1][0].params == {} and seen[2][0].params == {}  # native's default first
    assert seen[2][1].algorithm == "native" and seen[2][1].params == {"composition": "beta"}
    assert not any("composition" in c.params for c in seen[1])
