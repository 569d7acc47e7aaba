"""The algorithm registry: one module per algorithm, registered by its name.

Use ``get_algorithm(name)`` to look one up and ``algorithm_names()`` to list them. A new
algorithm is one module with one ``Algorithm`` subclass decorated with ``@register`` (from
``collectives.algorithms.registry``) and an import line below; the contract tests pick it
up from the registry.
"""

from __future__ import annotations

import os

# Explicit imports (no plugin magic): each module registers its class.
from . import hierarchical, multiring, native, rhd  # noqa: F401
from .base import Algorithm, Context
from .registry import algorithm_names, get_algorithm, register

if os.environ.get("RINGTUNE_TEST_ALGORITHMS") == "1":
    # Test-only algorithms (deliberately slow or hanging), never in a user's registry.
    import importlib

    importlib.import_module(f"{__name__}._testing")

__all__ = ["Algorithm", "Context", "register", "get_algorithm", "algorithm_names"]
