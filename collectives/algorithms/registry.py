"""The algorithm registry itself: ``register`` (the class decorator each algorithm module
applies), ``get_algorithm`` and ``algorithm_names``, and the lists derived from the classes
(``grid_algorithm_names``: what ``hierarchical`` may run along a dimension). Algorithm
modules import ``register`` from here, never from the package, so the package can import
them without a circle; users import the names from ``collectives.algorithms``.

Tests that register an algorithm of their own use ``registered(cls)`` (a context manager)
or ``unregister(name)`` afterwards, so the registry is clean for the next test.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..plugins import ENV as PLUGINS_ENV  # noqa: F401 - re-exported by the package
from ..plugins import load as load_plugins
from ..plugins import unknown_hint
from .base import Algorithm

_REGISTRY: dict[str, type[Algorithm]] = {}

# PLUGINS_ENV (RINGTUNE_PLUGINS) names a site's own plug-in modules (collectives.plugins):
# each registers its Algorithm subclasses with @register — a site's own algorithm, or the
# tests' deliberately slow ``sleep`` — in every process that has it set.


def _loaded() -> dict[str, type[Algorithm]]:
    """The registry, with every plug-in imported (``collectives.plugins.load``: once; a
    module of ``RINGTUNE_PLUGINS`` that does not import raises ``PluginError``)."""
    load_plugins()
    return _REGISTRY


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: add ``cls`` to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove the algorithm called ``name`` (a test's own algorithm, after the test);
    nothing happens for a name that is not registered."""
    _REGISTRY.pop(name, None)


@contextmanager
def registered(cls: type[Algorithm]) -> Iterator[type[Algorithm]]:
    """``with registered(Toy):`` — ``Toy`` is registered inside the block and removed
    after it (an algorithm it replaced under the same name comes back)."""
    before = _REGISTRY.get(cls.name)
    register(cls)
    try:
        yield cls
    finally:
        if before is None:
            unregister(cls.name)
        else:
            _REGISTRY[cls.name] = before


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class called ``name``; ``ValueError`` naming the known ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        pass
    registry = _loaded()  # a name not registered yet: a plug-in's, perhaps
    try:
        return registry[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(registry))
        raise ValueError(f"unknown algorithm {name!r}: use one of {known}"
                         f"{unknown_hint()}") from None


def algorithm_names() -> list[str]:
    """Registered algorithm names, sorted."""
    return sorted(_loaded())


def grid_algorithm_names() -> list[str]:
    """The algorithms that can run along one dimension of a ``hierarchical`` grid (those
    with a ``grid_dimension``), in that order: the first is the default ``inner``."""
    grid = [c for c in _loaded().values() if c.grid_dimension is not None]
    return [c.name for c in sorted(grid, key=lambda c: (c.grid_dimension, c.name))]


def user_algorithm_names(order: str = "display_order") -> list[str]:
    """Registered algorithms that are not test-only, sorted by the class attribute
    ``order`` (``display_order`` for lists for people, ``model_order`` for the cost
    model's candidates), then by name."""
    users = [c for c in _loaded().values() if not c.test_only]
    return [c.name for c in sorted(users, key=lambda c: (getattr(c, order), c.name))]
