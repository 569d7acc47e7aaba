"""A new algorithm is one module: ``tests/toy_algorithm.py``, registered from this test and
edited nowhere else, is searched, modelled (with the default cost), validated in profiles,
in the generated schema, accepted as a ``hierarchical`` inner choice, and runs.

(``tests/mpi/test_new_algorithm.py`` runs it through the contract checks at every world
size.) Each test registers the toy for its own duration; the registry, and so the schema,
are clean afterwards.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import optuna
import pytest

from autotune import space
from autotune.cluster import Cluster, Level
from autotune.model import Model, model_algorithms
from autotune.objective import COMPLETE, evaluate, timing_for
from collectives.algorithms import algorithm_names, get_algorithm
from collectives.algorithms.hierarchical import check_inner
from collectives.algorithms.registry import grid_algorithm_names, registered
from collectives.errors import ProfileError
from collectives.plan import Config
from collectives.profile import profile_from_dict

from ..toy_algorithm import Toy
from .test_profile import base

BUILTIN = ["hierarchical", "multiring", "native", "rhd", "shm"]


@pytest.fixture
def toy() -> Iterator[type[Toy]]:
    before = algorithm_names()
    assert "toy" not in before
    with registered(Toy):
        yield Toy
    assert algorithm_names() == before


def _cluster(n: int) -> Cluster:
    return Cluster(name=f"flat-{n}", levels=(Level("host", n, 10.0, 2.0, 1.0, True, ""),),
                   memory_gbs=20.0, overhead_us=2.0)


def test_registry_is_clean_after_a_test_registered_an_algorithm() -> None:
    from collectives.profile.schema import schema_text

    assert [n for n in algorithm_names() if n != "sleep"] == BUILTIN
    with registered(Toy):
        assert "toy" in algorithm_names() and "toy" in grid_algorithm_names()
        assert '"toy"' in schema_text()
    assert "toy" not in algorithm_names() and "toy" not in grid_algorithm_names()
    assert '"toy"' not in schema_text()


# -- searched ------------------------------------------------------------------------------


def test_it_is_searched(toy: type[Toy]) -> None:
    assert "toy" in space.searchable()
    grid = space.enumerate_space(4, 1 << 20, space.searchable())
    toys = {cfg for _, cfg in grid if cfg.algorithm == "toy"}
    assert toys == {Config("toy", {"root": 0}), Config("toy", {"root": 3})}
    # A hierarchical grid may run it along a dimension (its grid_dimension).
    assert any(cfg.algorithm == "hierarchical" and "toy" in cfg.params["inner"]
               for _, cfg in grid)
    tparams = space.trial_params_for(Config("toy", {"root": 3}), grid, 4)
    assert tparams is not None and tparams["algorithm"] == "toy"
    # A real Optuna study asks for it and gets exactly that configuration back.
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    study.enqueue_trial(tparams)
    assert space.suggest(study.ask(), 4, 1 << 20, space.searchable()) == \
        Config("toy", {"root": 3})


# -- modelled -----------------------------------------------------------------------------


def test_it_is_modelled_with_the_default_cost(toy: type[Toy]) -> None:
    model = Model(_cluster(4))
    sizes = [1 << 10, 1 << 20, 1 << 26]
    ring = model.time("multiring", {"rings": 1, "chunk_bytes": 0}, sizes)
    # The documented default: one flat ring (reduce-scatter + all-gather, whole segments).
    assert np.array_equal(model.time("toy", {}, sizes), ring)
    assert "toy" in model_algorithms()
    best = model.best(sizes)
    assert [p.time_us for p in best["toy"]] == pytest.approx([t * 1e6 for t in ring])
    assert all(p.params == {} for p in best["toy"])
    ranked = model.ranked(1 << 20, limit=len(model_algorithms()))
    assert "toy" in {p.algorithm for p in ranked}
    # The grid's candidates weigh it per dimension too (its grid_cost, the same default).
    grid = [params for name, params, _ in model.candidates(np.array([1e6]))
            if name == "hierarchical"]
    plain = [p for p in grid if "pipeline" not in p]
    assert plain and all("toy" in p["_inner"] for p in plain)
    # Pipelined grids only among inners that pipeline, which the toy does not declare.
    assert all("toy" not in p["_inner"] for p in grid if "pipeline" in p)


# -- validated in profiles, in the schema -------------------------------------------------


def _profile(params: dict[str, Any]) -> dict[str, Any]:
    d = base()
    d["rules"][1] = {"min_bytes": 65536, "max_bytes": None, "algorithm": "toy",
                     "params": params}
    return d


def test_a_profile_naming_it_loads_and_bad_params_are_refused(toy: type[Toy]) -> None:
    prof = profile_from_dict(_profile({"root": 3}), "toy.yaml", world_size=4)
    assert prof.select(1 << 20)[1].algorithm == "toy"
    assert prof.select(1 << 20)[1].params == {"root": 3}
    with pytest.raises(ProfileError, match=r"toy.yaml: rules\[1\]\.params.*root.*0\.\.3"):
        profile_from_dict(_profile({"root": 4}), "toy.yaml", world_size=4)
    with pytest.raises(ProfileError, match=r"rules\[1\]\.params.*'toy' has no parameter "
                                           r"'speed'"):
        profile_from_dict(_profile({"speed": 3}), "toy.yaml", world_size=4)
    # Inside a grid too, once registered.
    assert check_inner("toy", 2) == ["toy", "toy"]


def test_it_is_in_the_generated_schema(toy: type[Toy]) -> None:
    from collectives.profile.schema import profile_schema

    schema = profile_schema()
    assert "toy" in schema["$defs"]["rule"]["properties"]["algorithm"]["enum"]
    assert set(schema["$defs"]["toy_params"]["properties"]) == {"root", "transport"}
    inner = schema["$defs"]["hierarchical_params"]["properties"]["inner"]["anyOf"][1]
    assert "toy" in inner["enum"]
    v = jsonschema.Draft202012Validator(schema)
    assert v.is_valid(_profile({"root": 3}))
    assert not v.is_valid(_profile({"speed": 3}))
    grid = copy.deepcopy(base())
    grid["rules"][1]["algorithm"] = "hierarchical"
    grid["rules"][1]["params"] = {"dims": [2, 2], "inner": ["toy", "rhd"]}
    assert v.is_valid(grid)
    profile_from_dict(grid, "grid.yaml", world_size=4)


# -- runs ---------------------------------------------------------------------------------


def test_it_runs_and_is_tuned_on_one_rank(toy: type[Toy]) -> None:
    from mpi4py import MPI

    from collectives import Communicator

    assert get_algorithm("toy") is Toy
    comm = Communicator(MPI.COMM_SELF)
    try:
        buf = np.arange(1000, dtype=np.float32)
        out = comm.allreduce(buf, op="sum", algorithm="toy", root=0)
        assert out is buf and np.array_equal(buf, np.arange(1000, dtype=np.float32))
        # The tuner's objective checks and times it like any candidate.
        outcome = evaluate(comm, 4096, "float32", "sum", Config("toy", {"root": 0}),
                           timing_for(10.0))
        assert outcome.state == COMPLETE and outcome.time_us is not None
        bad = evaluate(comm, 4096, "float32", "sum", Config("toy", {"root": 5}),
                       timing_for(10.0))
        assert bad.state != COMPLETE and "root" in (bad.reason or "")
    finally:
        comm.close()
