"""The algorithm registry: one module per algorithm, registered by its name.

Use ``get_algorithm(name)`` to look one up and ``algorithm_names()`` to list them. A new
algorithm is one module with one ``Algorithm`` subclass decorated with ``@register`` (from
``collectives.algorithms.registry``) and an import line below: its class carries its
validation, search space, cost-model formula and schema fragment (``base.py`` says which
defaults apply), so the tuner, the cost model, the profile loader, the generated schema and
the contract tests pick it up from the registry. A test registers one of its own with
``registered(cls)`` (a context manager that unregisters it afterwards).
"""

from __future__ import annotations

import os

# Explicit imports (no plugin magic): each module registers its class.
from . import hierarchical, multiring, native, rhd  # noqa: F401
from .base import Algorithm, Context
from .registry import (
    algorithm_names,
    get_algorithm,
    grid_algorithm_names,
    register,
    registered,
    unregister,
)

if os.environ.get("RINGTUNE_TEST_ALGORITHMS") == "1":
    # Test-only algorithms (deliberately slow or hanging), never in a user's registry.
    import importlib

    importlib.import_module(f"{__name__}._testing")

__all__ = ["Algorithm", "Context", "register", "registered", "unregister", "get_algorithm",
           "algorithm_names", "grid_algorithm_names"]
