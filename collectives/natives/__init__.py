"""The MPI libraries ``native`` knows, one module each (``base`` says the interface)."""

from __future__ import annotations

from . import intelmpi, mpich, openmpi  # noqa: F401 - each registers itself
from .base import (
    DEFAULT,
    NativeLibrary,
    all_compositions,
    cost_models,
    current,
    for_cost_model,
    for_name,
    foreign_profile,
    libraries,
    library,
    register,
    tuned_with,
)

__all__ = ["DEFAULT", "NativeLibrary", "all_compositions", "cost_models", "current",
           "for_cost_model", "for_name", "foreign_profile", "libraries", "library", "register",
           "tuned_with"]
