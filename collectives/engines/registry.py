"""The engine registry: engines by name, and the engine that claims a communicator object.

Use ``engine_for(obj)`` where the runtime meets a user's communicator (``Communicator``,
``abort_world``, the exchange thread) and ``get_engine(name)`` for ``--engine``. An engine
is one module with one ``Engine`` subclass, registered by ``register_engine`` when it is
imported: the built-in ones by the package ``collectives.engines``, others by a plug-in
(``collectives.plugins``), which the registry loads on the first name it does not know and
before it lists names or finds no engine for an object.
"""

from __future__ import annotations

from typing import Any

from ..plugins import load as load_plugins
from ..plugins import unknown_hint
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
    load_plugins()
    return [e.name for e in sorted(_ENGINES.values(), key=lambda e: (e.claim_order, e.name))]


def get_engine(name: str) -> Engine:
    """The engine called ``name``; ``ValueError`` naming the registered ones if unknown."""
    found = _ENGINES.get(name)
    if found is None:
        load_plugins()
        found = _ENGINES.get(name)
    if found is None:
        raise ValueError(f"unknown engine {name!r}: use one of {', '.join(engine_names())}"
                         f"{unknown_hint()}")
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
    found = _claimant(obj)
    if found is None:
        load_plugins()  # a plug-in's engine, perhaps
        found = _claimant(obj)
    if found is not None:
        return found
    raise TypeError(
        f"unsupported communicator {type(obj).__module__}.{type(obj).__name__}: pass an "
        "mpi4py communicator or a torch.distributed process group (group.WORLD, new_group)"
        f"{unknown_hint()}")


def _claimant(obj: Any) -> Engine | None:
    for engine in sorted(_ENGINES.values(), key=lambda e: (e.claim_order, e.name)):
        if engine.claims(obj):
            return engine
    return None
