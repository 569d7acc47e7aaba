"""The engine registry: engines by name, and the engine that claims a communicator object.

Use ``engine_for(obj)`` where the runtime meets a user's communicator (``Communicator``,
``abort_world``, the exchange thread) and ``get_engine(name)`` for ``--engine``. An engine
is one module with one ``Engine`` subclass, registered by ``register_engine`` when the
package ``collectives.engines`` imports it.
"""

from __future__ import annotations

from typing import Any

from .base import Engine

_ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    """Make ``engine`` available under its ``name`` (a second one of a name replaces it)."""
    if not engine.name:
        raise ValueError(f"{type(engine).__name__}: an engine needs a name")
    _ENGINES[engine.name] = engine
    return engine


def engine_names() -> list[str]:
    """Every registered engine name, in claim order."""
    return [e.name for e in sorted(_ENGINES.values(), key=lambda e: (e.claim_order, e.name))]


def get_engine(name: str) -> Engine:
    """The engine called ``name``; ``ValueError`` naming the registered ones if unknown."""
    found = _ENGINES.get(name)
    if found is None:
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(engine_names())}")
    return found


def engine_for(obj: Any) -> Engine:
    """The engine that claims ``obj`` (an mpi4py communicator, a ``torch.distributed``
    process group, or the communicator object an engine made); ``TypeError`` naming what
    to pass when none does."""
    if obj is None:
        raise TypeError(
            "no communicator given (None): pass an mpi4py communicator (MPI.COMM_WORLD) or a "
            "torch.distributed process group (torch.distributed.group.WORLD is None until "
            "torch.distributed.init_process_group has run)")
    for engine in sorted(_ENGINES.values(), key=lambda e: (e.claim_order, e.name)):
        if engine.claims(obj):
            return engine
    raise TypeError(
        f"unsupported communicator {type(obj).__module__}.{type(obj).__name__}: pass an "
        "mpi4py communicator or a torch.distributed process group (group.WORLD, new_group)")
