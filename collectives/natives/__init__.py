"""The MPI libraries ``native`` knows, one module each (``base`` says the interface)."""

from __future__ import annotations

from . import mpich, openmpi  # noqa: F401 - each registers itself
from .base import (
    DEFAULT,
    NativeLibrary,
    current,
    for_name,
    foreign_profile,
    register,
    tuned_with,
)

__all__ = ["DEFAULT", "NativeLibrary", "current", "for_name", "foreign_profile", "register",
           "tuned_with"]
