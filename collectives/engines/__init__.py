"""Engines: the distributed runtimes ringtune runs over, one module each, registered by
name (``mpi``: mpi4py communicators; ``torch``: ``torch.distributed`` process groups).

Use ``engine_for(obj)`` for the engine of a communicator object and ``get_engine(name)``
for one by name; ``base.Engine`` says what an engine answers. A new engine is one module
with one ``Engine`` subclass, registered with ``register_engine`` and imported below.
"""

from __future__ import annotations

# The built-in engines, imported explicitly: each module registers its engine. Neither
# imports mpi4py or torch until a communicator of its kind arrives.
from . import mpi, torch  # noqa: F401
from .base import Engine
from .registry import engine_for, engine_names, get_engine, register_engine

__all__ = ["Engine", "engine_for", "engine_names", "get_engine", "register_engine"]
