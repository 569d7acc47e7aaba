"""Adding an MPI library is one module: a ``NativeLibrary`` subclass registered with
``@register`` is offered by ``native`` (its algorithms and compositions, checked with its
names), timed by the cost model (its default, each algorithm, each composition), listed in
the profile schema and accepted by the profile loader, and named from its version text —
nothing outside ``collectives/natives`` changes. Also: Open MPI's module models coll/tuned's
fixed decision and han's pipeline."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest

from autotune import space
from autotune.model import Model
from collectives.algorithms import get_algorithm
from collectives.natives import base, openmpi
from collectives.natives.base import DEFAULT, NativeLibrary, halving_cost, ring_cost

from .test_model import two_hosts

NATIVE = get_algorithm("native")


class _Selector:
    def __init__(self, log: list[str], name: str) -> None:
        self.log, self.name = log, name

    def enter(self) -> None:
        self.log.append(f"enter {self.name}")

    def exit(self) -> None:
        self.log.append(f"exit {self.name}")


class ZetaMpi(NativeLibrary):
    """A third library, as a plug-in module would write it."""

    name = "Zeta MPI"
    export_format = ""
    cost_model = "zeta"
    version_re = r"Zeta MPI release (\S+)"
    compositions = ("auto", "zflat", "zhier")
    searched_compositions = ("auto", "zflat")
    flat_composition = "zflat"
    log: ClassVar[list[str]] = []

    def unavailable_reason(self) -> str:
        return ""

    def algorithms(self) -> list[str]:
        return ["pairwise", "star"]

    def compositions_searchable(self) -> bool:
        return True

    def composition_selector(self, name: str) -> tuple[Any, str]:
        return _Selector(self.log, name), ""

    def default_cost(self, model: Any, stride: int, d: int, region: Any) -> Any:
        return 3.0 * ring_cost(model, stride, d, region)

    def impl_cost(self, model: Any, impl: str, stride: int, d: int, region: Any) -> Any:
        if impl == "pairwise":
            return halving_cost(model, stride, d, region)
        return self.default_cost(model, stride, d, region)

    def composition_cost(self, model: Any, composition: str, impl: str, sizes: Any) -> Any:
        return 0.5 * self.world_cost(model, impl, sizes)


@pytest.fixture
def zeta(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ZetaMpi]]:
    """Zeta MPI registered and running (the library mpi4py reports)."""
    monkeypatch.setitem(base._REGISTRY, ZetaMpi.name, ZetaMpi)
    monkeypatch.setattr(base, "library", lambda: (ZetaMpi.name, "9.9"))
    base.current.cache_clear()
    try:
        yield base.register(ZetaMpi)
    finally:
        base.current.cache_clear()


def test_native_offers_its_algorithms_and_compositions(zeta: type[ZetaMpi]) -> None:
    one = [c.params for _, c in space.enumerate_space(4, 1 << 22, ["native"], hosts=1)]
    two = [c.params for _, c in space.enumerate_space(4, 1 << 22, ["native"], hosts=2)]
    assert {p.get("impl", DEFAULT) for p in one} == {DEFAULT, "pairwise", "star"}
    assert not any("composition" in p for p in one)
    assert {p.get("composition", DEFAULT) for p in two} == {DEFAULT, "zflat"}
    assert NATIVE.check_params({"impl": "star", "composition": "zhier"}, 4) == {
        "impl": "star", "composition": "zhier"}
    with pytest.raises(ValueError, match=r"'ring' is not an allreduce algorithm of Zeta MPI "
                                         r"9\.9 \(it has auto, pairwise, star"):
        NATIVE.check_params({"impl": "ring"}, 4)
    # Another library's composition is a name a profile may hold, not one Zeta has.
    with pytest.raises(ValueError, match=r"'alpha' is not an allreduce composition of Zeta"):
        NATIVE.check_params({"composition": "alpha"}, 4)


def test_the_call_is_framed_by_its_composition_selector(zeta: type[ZetaMpi]) -> None:
    from collectives.algorithms.native import _composition_selector

    zeta.log.clear()

    s = _composition_selector("zflat", "mpi")
    s.enter()
    s.exit()
    assert zeta.log == ["enter zflat", "exit zflat"]


def test_the_model_times_it_with_its_own_costs(zeta: type[ZetaMpi]) -> None:
    sizes = np.array([4096.0, float(1 << 20), float(16 << 20)])
    c = replace(two_hosts("best"), native_model="zeta")
    m = Model(c)
    assert m.native.name == "Zeta MPI"
    ring = ring_cost(m, 1, m.n, sizes)
    assert np.allclose(m.time("native", {}, sizes), 3.0 * ring, rtol=1e-12)
    assert np.allclose(m.time("native", {"impl": "pairwise"}, sizes),
                       halving_cost(m, 1, m.n, sizes), rtol=1e-12)
    assert np.allclose(m.time("native", {"composition": "zflat"}, sizes), 1.5 * ring,
                       rtol=1e-12)
    # The grid's native sub-allreduce is the library's default too.
    assert np.allclose(m.native_allreduce(1, m.n, sizes), 3.0 * ring, rtol=1e-12)
    # And the calibration on this machine records its model.
    from autotune.primitives import native_cost_model

    assert native_cost_model() == "zeta"


def test_the_schema_and_the_loader_know_its_compositions(zeta: type[ZetaMpi],
                                                         tmp_path: Any) -> None:
    from collectives.profile import load_profile
    from collectives.profile.schema import profile_schema

    text = json.dumps(profile_schema())
    assert '"zflat"' in text and '"zhier"' in text and "Zeta MPI" in text
    path = tmp_path / "zeta.yaml"
    path.write_text(
        "format: ringtune-profile\nversion: 1\ntopology: {world_size: 2}\n"
        "backend: numpy\ntransport: mpi\nlibrary: {name: Zeta MPI, version: '9.9'}\n"
        "rules:\n- {min_bytes: 0, max_bytes: null, algorithm: native,\n"
        "   params: {impl: star, composition: zhier},\n"
        "   native: [{bytes: 1024, impl: pairwise, composition: zflat, busbw_gbps: 1.0,"
        " time_us: 2.0}]}\n")
    prof = load_profile(str(path))
    assert prof.select(0)[1].params == {"impl": "star", "composition": "zhier"}


def test_its_name_and_version_come_from_its_version_text(
        zeta: type[ZetaMpi], monkeypatch: pytest.MonkeyPatch) -> None:
    MPI = pytest.importorskip("mpi4py.MPI")
    monkeypatch.undo()  # the real library(), with Zeta still registered
    monkeypatch.setitem(base._REGISTRY, ZetaMpi.name, ZetaMpi)
    monkeypatch.setattr(MPI, "Get_library_version", lambda: "Zeta MPI release 9.9.1\n")
    assert base.library() == ("Zeta MPI", "9.9.1")
    monkeypatch.setattr(MPI, "Get_library_version", lambda: "Intel(R) MPI Library 2021.13 ")
    assert base.library() == ("Intel MPI", "2021.13")


# -- Open MPI's cost model -----------------------------------------------------------------

def _ompi(cluster: Any) -> Model:
    return Model(replace(cluster, native_model="openmpi"))


def test_open_mpi_default_follows_tuned_fixed_decision() -> None:
    lib = openmpi.OpenMpi()
    m = _ompi(replace(two_hosts(), levels=two_hosts().levels[:1]))  # 2 ranks, one host
    assert m.native.name == "Open MPI" and not m.node_aware_native()
    d = m.n
    # comm size < 4: recursive doubling below 4 KiB, ring to 256 KiB, Rabenseifner above.
    for nbytes, alg in ((1024.0, 3), (32768.0, 4), (131072.0, 5), (float(1 << 20), 6)):
        s = np.array([nbytes])
        assert m.time("native", {}, s)[0] == pytest.approx(
            lib._alg_cost(m, alg, 1, d, s)[0], rel=1e-12), (nbytes, alg)
    s = np.array([float(1 << 20)])
    assert m.time("native", {"impl": "ring"}, s)[0] == pytest.approx(
        lib._alg_cost(m, 4, 1, d, s)[0], rel=1e-12)
    assert m.time("native", {"impl": "basic_linear"}, s)[0] > m.time(
        "native", {"impl": "ring"}, s)[0]


def test_open_mpi_across_hosts_is_han_unless_a_tuned_algorithm_is_forced() -> None:
    m = _ompi(two_hosts())
    sizes = np.array([4096.0, float(1 << 20), float(16 << 20)])
    assert m.node_aware_native()
    han = m.time("native", {}, sizes)
    assert np.allclose(m.time("native", {"impl": "han"}, sizes), han, rtol=1e-12)
    flat_ring = m.time("native", {"impl": "ring"}, sizes)
    assert np.allclose(flat_ring, openmpi.OpenMpi()._alg_cost(m, 4, 1, m.n, sizes),
                       rtol=1e-12)
    assert not np.allclose(han, flat_ring, rtol=1e-3)
    # More segments, more time: the pipeline is charged per segment.
    assert np.all(np.diff(han) > 0)


def test_han_is_searched_only_across_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = openmpi.OpenMpi("Open MPI", "5.0.10")
    monkeypatch.setattr(openmpi, "_table", lambda: {"ring": 4, "rabenseifner": 6})
    monkeypatch.setattr(openmpi, "han_available", lambda: True)
    assert lib.algorithms_on(1) == ["ring", "rabenseifner"]
    assert lib.algorithms_on(2) == ["ring", "rabenseifner", "han"]
    lib.check_impl("han")
    monkeypatch.setattr(openmpi, "han_available", lambda: False)
    with pytest.raises(ValueError, match=r"impl: 'han' needs Open MPI's coll/han component"):
        lib.check_impl("han")


def test_export_asks_the_recorded_library_for_its_format(tmp_path: Any) -> None:
    from collectives.profile import load_profile
    from ringtune.errors import UsageError
    from ringtune.export import format_of

    golden = "tests/golden/export/profile.yaml"  # tuned with MPICH
    assert format_of(load_profile(golden)) == "mpich"
    text = open(golden, encoding="utf-8").read()
    ompi = tmp_path / "ompi.yaml"
    ompi.write_text(text.replace("library: {name: MPICH, version: 5.0.2}",
                                 "library: {name: Open MPI, version: 5.0.10}"))
    assert format_of(load_profile(str(ompi))) == "ompi"
    other = tmp_path / "other.yaml"
    other.write_text(text.replace("library: {name: MPICH, version: 5.0.2}",
                                  "library: {name: Zeta MPI, version: '9.9'}"))
    with pytest.raises(UsageError, match=r"give --format \(mpich, nccl, ompi\): it was tuned "
                                         r"with Zeta MPI, which has no tuning file"):
        format_of(load_profile(str(other)))


# -- Intel MPI: it runs with its default only, said once --------------------------------------

def test_intel_mpi_has_a_module_that_says_why_only_its_default_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.natives import intelmpi

    lib = base.for_name("Intel MPI", "2021.18.1")
    assert type(lib) is intelmpi.IntelMpi and not lib.chooses_per_call
    assert lib.algorithms() == []
    lib.check_impl(DEFAULT)
    with pytest.raises(ValueError, match=r"impl: 'ring' is not an allreduce algorithm of "
                       r"Intel MPI 2021\.18\.1 \(it has auto; .*at MPI_Init "
                       r"\(I_MPI_ADJUST_ALLREDUCE\), not per call"):
        lib.check_impl("ring")
    base.current.cache_clear()
    monkeypatch.setattr(base, "library", lambda: ("Intel MPI", "2021.18.1"))
    monkeypatch.setattr(base, "_warned", set())
    try:
        with pytest.warns(RuntimeWarning, match=r"^ringtune: Intel MPI 2021\.18\.1 chooses "
                          r"its allreduce algorithm once.*impl=auto\)$"):
            assert type(base.current()) is intelmpi.IntelMpi
        base.current.cache_clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per job: a second lookup is silent
            base.current()
    finally:
        base.current.cache_clear()
