"""The algorithm registry itself: ``register`` (the class decorator each algorithm module
applies), ``get_algorithm`` and ``algorithm_names``. Algorithm modules import ``register``
from here, never from the package, so the package can import them without a circle; users
import the names from ``collectives.algorithms``.
"""

from __future__ import annotations

from .base import Algorithm

_REGISTRY: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: add ``cls`` to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    _REGISTRY[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class called ``name``; ``ValueError`` naming the known ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(_REGISTRY))
        raise ValueError(f"unknown algorithm {name!r}: use one of {known}") from None


def algorithm_names() -> list[str]:
    """Registered algorithm names, sorted."""
    return sorted(_REGISTRY)
