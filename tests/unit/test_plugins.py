"""The one plug-in mechanism (``collectives.plugins``): a module outside the tree
(``tests/plugin_example.py``: one algorithm, backend, transport, engine and MPI library)
loaded through ``RINGTUNE_PLUGINS`` or an installed package's ``ringtune.plugins`` entry
point is found by every registry on its first unknown name, listed by every registry, and
offered by the profile loader and the JSON Schema; a failing plug-in is never silent.

Each test saves the registries and the mechanism's state and restores them afterwards.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import collectives.algorithms.registry as algorithms
import collectives.engines.registry as engines
import collectives.natives.base as natives
import collectives.registry as registry
import collectives.transports.registry as transports
from collectives import plugins

from .test_profile import base

EXAMPLE = "tests.plugin_example"


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Registries and plug-in state as copies: what a test's plug-ins register goes away."""
    for module, names in ((algorithms, ("_REGISTRY",)), (engines, ("_ENGINES",)),
                          (natives, ("_REGISTRY",)),
                          (registry, ("_LOADERS", "_BACKENDS")),
                          (transports, ("_TRANSPORTS", "_TRANSPORT_BACKENDS", "_TEST_ONLY",
                                        "_TRANSPORT_CLASSES"))):
        for name in names:
            monkeypatch.setattr(module, name, type(getattr(module, name))(
                getattr(module, name)))
    monkeypatch.delenv(plugins.ENV, raising=False)
    plugins._reset()
    sys.modules.pop(EXAMPLE, None)
    yield monkeypatch
    plugins._reset()
    sys.modules.pop(EXAMPLE, None)


def _distribution(root: Path, name: str, entries: dict[str, str]) -> None:
    """An installed package's metadata with ``ringtune.plugins`` entry points, as pip
    writes it (found by ``importlib.metadata`` on ``sys.path``)."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[ringtune.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


def _everything_is_found() -> list[str]:
    """What is wrong when the example plug-in's names are asked for (empty: all found)."""
    from collectives.profile.schema import schema_text

    wrong = []
    if algorithms.get_algorithm("plug_native").name != "plug_native":
        wrong.append("algorithm")
    if registry.get_backend("plug_host").name != "plug_host":
        wrong.append("backend")
    if registry.transport_refusal("plug_counted", "plug_host") is not None:
        wrong.append("transport")
    if engines.get_engine("plug_engine").name != "plug_engine":
        wrong.append("engine")
    if natives.for_name("PlugMPI").algorithms() != ["plug_ring", "plug_tree"]:
        wrong.append("MPI library")
    listed = {"algorithm_names": ("plug_native", algorithms.algorithm_names()),
              "backend_names": ("plug_host", registry.backend_names()),
              "user_transport_names": ("plug_counted", registry.user_transport_names()),
              "engine_names": ("plug_engine", engines.engine_names())}
    wrong += [f"{k} lacks {n}" for k, (n, names) in listed.items() if n not in names]
    text = schema_text()
    wrong += [f"schema lacks {n}" for n in ("plug_native", "plug_counted", "plug_host",
                                            "plug_engine") if f'"{n}"' not in text]
    return wrong


@pytest.mark.parametrize("first", ["algorithm", "backend", "transport", "engine", "library",
                                   "communicator"])
def test_an_env_plugin_is_loaded_on_the_first_unknown_name_of_any_registry(
        isolated: pytest.MonkeyPatch, first: str) -> None:
    isolated.setenv(plugins.ENV, f" {EXAMPLE} ,")
    assert EXAMPLE not in sys.modules
    ask = {"algorithm": lambda: algorithms.get_algorithm("plug_native"),
           "backend": lambda: registry.get_backend("plug_host"),
           "transport": lambda: registry.make_transport("plug_counted", _comm_self(),
                                                        registry.get_backend("numpy")),
           "engine": lambda: engines.get_engine("plug_engine"),
           "library": lambda: natives.for_name("PlugMPI"),
           "communicator": lambda: engines.engine_for(_World())}
    assert type(ask[first]()).__name__ != "NativeLibrary"
    example: Any = sys.modules[EXAMPLE]
    assert _everything_is_found() == []
    assert example.IMPORTS == [1], "a plug-in is imported once"


class _World:
    """An object only the plug-in's engine claims (asked for before it is loaded)."""

    plug_world = True


def _comm_self() -> Any:
    from mpi4py import MPI

    return MPI.COMM_SELF


def test_known_names_do_not_load_plugins(isolated: pytest.MonkeyPatch) -> None:
    """``import collectives`` and questions about built-in names import no plug-in."""
    isolated.setenv(plugins.ENV, EXAMPLE)
    algorithms.get_algorithm("multiring")
    registry.get_backend("numpy")
    engines.get_engine("mpi")
    assert EXAMPLE not in sys.modules


def test_a_profile_may_name_a_plugins_transport_and_engine(
        isolated: pytest.MonkeyPatch) -> None:
    from collectives.profile import profile_from_dict

    isolated.setenv(plugins.ENV, EXAMPLE)
    data = base()
    data.update(backend="plug_host", transport="plug_counted",
                engine={"name": "plug_engine"})
    data["rules"][0]["algorithm"] = "plug_native"
    prof = profile_from_dict(data)
    assert prof.transport == "plug_counted" and prof.rules[0].algorithm == "plug_native"


def test_a_failing_env_plugin_is_an_error_naming_the_variable_every_time(
        isolated: pytest.MonkeyPatch) -> None:
    isolated.setenv(plugins.ENV, f"{EXAMPLE},no_such_plugin_module_here")
    for ask in (plugins.load, algorithms.algorithm_names, registry.transport_names,
                engines.engine_names, lambda: registry.get_backend("nope")):
        with pytest.raises(plugins.PluginError) as err:
            ask()
        line = str(err.value)
        assert line.startswith("RINGTUNE_PLUGINS: cannot import plug-in module "
                               "'no_such_plugin_module_here' (ModuleNotFoundError")
        assert "unset RINGTUNE_PLUGINS" in line and "\n" not in line


def test_a_missing_optional_builtin_registers_nothing_quietly(
        isolated: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    isolated.setattr(plugins, "BUILTIN", ("no_such_optional_builtin_here",))
    with caplog.at_level(logging.INFO, logger="collectives.plugins"):
        assert "mpi" in registry.transport_names()
    assert plugins.failures() == [] and caplog.records == []


def test_installed_packages_entry_points_load_and_a_broken_one_is_named_once(
        isolated: pytest.MonkeyPatch, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "plug_fn_mod.py").write_text(
        "from collectives.registry import register_backend\n"
        "from collectives.backend import NUMPY\n"
        "def register():\n    register_backend('plug_fn', lambda: NUMPY)\n")
    (tmp_path / "plug_broken_mod.py").write_text("raise RuntimeError('needs libfoo')\n")
    _distribution(tmp_path, "plugdist", {"example": EXAMPLE,
                                         "byfunction": "plug_fn_mod:register",
                                         "broken": "plug_broken_mod"})
    isolated.syspath_prepend(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="collectives.plugins"):
        assert _everything_is_found() == []
        assert "plug_fn" in registry.backend_names()
        registry.transport_names()  # loaded once: no second warning
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert ("entry point 'broken' of package plugdist (ringtune.plugins: plug_broken_mod) "
            "failed: RuntimeError: needs libfoo") in lines[0]
    # A name the broken package would have provided is not just "unknown".
    with pytest.raises(ValueError, match="unknown transport 'plug_gone'.*plug-ins that did "
                                         "not load: entry point 'broken' of package plugdist"):
        registry.make_transport("plug_gone", None, registry.get_backend("numpy"))


def test_threads_asking_at_once_all_see_every_plugin(isolated: pytest.MonkeyPatch) -> None:
    """The in-process tests' ranks are threads: none may see half the plug-ins."""
    import threading

    isolated.setenv(plugins.ENV, EXAMPLE)
    seen: list[bool] = []
    barrier = threading.Barrier(4)

    def ask() -> None:
        barrier.wait()
        seen.append("plug_engine" in engines.engine_names()
                    and "plug_native" in algorithms.algorithm_names())

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen == [True] * 4
