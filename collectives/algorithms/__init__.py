"""The algorithm registry: one module per algorithm, registered by its name.

Use ``get_algorithm(name)`` to look one up and ``algorithm_names()`` to list them. A new
algorithm is one module with one ``Algorithm`` subclass decorated with ``@register`` (from
``collectives.algorithms.registry``) and an import line below: its class carries its
validation, search space, cost-model formula and schema fragment (``base.py`` says which
defaults apply), so the tuner, the cost model, the profile loader, the generated schema and
the contract tests pick it up from the registry. A test registers one of its own with
``registered(cls)`` (a context manager that unregisters it afterwards); a job or a tuning
run loads modules of its own through ``RINGTUNE_PLUGINS`` (below), on every rank.
"""

from __future__ import annotations

# The built-in algorithms, imported explicitly: each module registers its class (a
# site's own come through RINGTUNE_PLUGINS, read when the registry is first used).
from . import hierarchical, multiring, native, rhd, shm  # noqa: F401
from .base import Algorithm, Context
from .registry import (
    PLUGINS_ENV,
    algorithm_names,
    get_algorithm,
    grid_algorithm_names,
    register,
    registered,
    unregister,
)

__all__ = ["PLUGINS_ENV", "Algorithm", "Context", "register", "registered", "unregister",
           "get_algorithm", "algorithm_names", "grid_algorithm_names"]
