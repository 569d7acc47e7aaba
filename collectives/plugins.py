"""The one plug-in mechanism: the modules that register algorithms, backends, transports,
engines and MPI libraries beyond the built-in ones, imported once.

Use ``load()`` before answering a name a registry does not know, or before listing what
exists: every registry (``collectives.algorithms.registry``, ``collectives.registry``,
``collectives.engines.registry``, ``collectives.natives``) calls it. A plug-in is a module
that registers what it provides when it is imported (``@register``, ``register_backend``,
``register_transport``, ``register_engine``); it must import cheaply (a heavy dependency
is imported inside its loader or constructor). Three sources, in this order, so a later one
may replace an earlier one's name:

1. the optional built-ins (``BUILTIN``: the GPU plug-in ``collectives.cuda``): one whose
   dependency is missing (``ImportError``) registers nothing, quietly (logged at debug);
2. installed packages' entry points in the group ``ringtune.plugins`` (a package declares
   ``[project.entry-points."ringtune.plugins"] name = "pkg.module"``, or
   ``"pkg.module:register"``, a function called with no arguments): read once, lazily,
   through ``importlib.metadata``. One that fails is one warning line naming the entry
   point, its package, the module and the error (logged once); the rest still load;
3. the site's modules in ``RINGTUNE_PLUGINS`` (comma-separated; every rank of a job or a
   tuning run imports them): one that fails is an error naming the variable, the module
   and the error, raised by every later ``load()`` too (the CLI checks it up front: one
   line, exit 2), since a job that silently runs without the user's own plug-in is wrong.

``import collectives`` loads none of them: the first registry question does.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from types import ModuleType

#: The environment variable naming the site's plug-in modules.
ENV = "RINGTUNE_PLUGINS"
#: The entry-point group installed packages declare their plug-ins in.
ENTRY_POINT_GROUP = "ringtune.plugins"
#: Optional built-in plug-ins: each registers nothing where its dependency is missing.
BUILTIN: tuple[str, ...] = ("collectives.cuda",)

_log = logging.getLogger(__name__)
# Reentrant: a plug-in's import may ask a registry (which calls ``load`` again, and must
# not wait for itself); other threads (the in-process tests' ranks) wait until every
# plug-in has registered, so none sees half the names.
_lock = threading.RLock()
_state: dict[str, object] = {}  # "loaded": True once done; "error": the ENV failure
_failures: list[str] = []


class PluginError(ValueError):
    """A module named in ``RINGTUNE_PLUGINS`` does not import (the message names the
    variable, the module, the error and the fix)."""


def load() -> None:
    """Import every plug-in once (see the module docstring). Raises ``PluginError`` when a
    module of ``RINGTUNE_PLUGINS`` failed, on this call and every later one."""
    with _lock:
        if not _state.get("loaded"):
            _state["loaded"] = True  # before importing: a plug-in may ask a registry
            for module in BUILTIN:
                _import_builtin(module)
            _load_entry_points()
            _load_env()
    error = _state.get("error")
    if isinstance(error, PluginError):
        raise error


def failures() -> list[str]:
    """One line per installed plug-in that failed to load (what an unknown-name error adds,
    so a name whose plug-in is broken is never just "unknown")."""
    return list(_failures)


def unknown_hint() -> str:
    """``""``, or ``"; plug-ins that did not load: …"`` for an unknown-name message."""
    return f"; plug-ins that did not load: {'; '.join(_failures)}" if _failures else ""


def env_modules() -> list[str]:
    """The module names of ``RINGTUNE_PLUGINS`` (empty when it is unset)."""
    return [m for m in (m.strip() for m in os.environ.get(ENV, "").split(",")) if m]


def _import_builtin(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as exc:
        _log.debug("optional plug-in %s not loaded: %s", module, exc)


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            found = ep.load()
            if not isinstance(found, ModuleType) and callable(found):
                found()
        except Exception as exc:  # noqa: BLE001 - an installed plug-in's failure is named
            dist = getattr(ep, "dist", None)
            package = f" of package {dist.name}" if dist is not None else ""
            line = (f"entry point {ep.name!r}{package} ({ENTRY_POINT_GROUP}: {ep.value}) "
                    f"failed: {type(exc).__name__}: {exc}")
            _failures.append(line)
            _log.warning("ringtune: plug-in %s; fix or uninstall that package", line)


def _load_env() -> None:
    for module in env_modules():
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - a named plug-in's failure is the user's
            _state["error"] = PluginError(
                f"{ENV}: cannot import plug-in module {module!r} "
                f"({type(exc).__name__}: {exc}); fix the module or its name, or unset {ENV}")
            return


def _reset() -> None:
    """Forget what was loaded (tests: the next ``load`` reads the sources again). Names
    registered stay registered."""
    with _lock:
        _state.clear()
        _failures.clear()
