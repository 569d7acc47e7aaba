"""The algorithm registry: one module per algorithm, registered by its name.

Use ``get_algorithm(name)`` to look one up and ``algorithm_names()`` to list them. A new
algorithm is one module with one ``Algorithm`` subclass decorated with ``@register`` and an
import line below; the contract tests pick it up from the registry.
"""

from __future__ import annotations

import os

from .base import Algorithm, Context

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


# Explicit imports (no plugin magic): each module registers its class.
from . import hierarchical, multiring, native, rhd  # noqa: E402,F401

if os.environ.get("RINGTUNE_TEST_ALGORITHMS") == "1":
    # Test-only algorithms (deliberately slow or hanging), never in a user's registry.
    import importlib

    importlib.import_module(f"{__name__}._testing")

__all__ = ["Algorithm", "Context", "register", "get_algorithm", "algorithm_names"]
