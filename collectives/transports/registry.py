"""The transport table itself: ``register_transport`` (what each transport module calls
when it is imported) and what the registrations said. Transport modules import
``register_transport`` from here (or from ``collectives.registry``, which re-exports it),
never from the package, so the package can import them without a circle.

Lookups (listing the names, refusing a backend, making a transport) live in
``collectives.registry``, which loads the plug-ins first; this module only records.
Tests that register a transport of their own patch copies of the tables here
(``_TRANSPORTS``, ``_TRANSPORT_BACKENDS``, ``_TEST_ONLY``, ``_TRANSPORT_CLASSES``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backend import Backend
from ..transport import Transport

#: Makes a transport over ``comm`` for ``backend``'s buffers; ``ValueError`` (or a
#: subclass) naming the fix when it cannot serve them.
TransportFactory = Callable[[Any, Backend], Transport]

_TRANSPORTS: dict[str, TransportFactory] = {}
#: transport -> the backends whose buffers it moves (absent: every backend's).
_TRANSPORT_BACKENDS: dict[str, tuple[str, ...]] = {}
#: Transports registered by tests only (left out of the JSON Schema and of docs).
_TEST_ONLY: set[str] = set()
#: transport -> its ``Transport`` class, where the registration said it.
_TRANSPORT_CLASSES: dict[str, type[Transport]] = {}


def register_transport(name: str, factory: TransportFactory,
                       backends: tuple[str, ...] | None = None,
                       test_only: bool = False,
                       cls: type[Transport] | None = None) -> None:
    """Make transport ``name`` available (names list in registration order). ``backends``:
    the backends whose buffers it moves when not every backend's (the GPU transports:
    ``("cupy",)``); profile loaders ask ``transport_refusal`` with it, so a profile that
    names a transport its buffers cannot use is refused when it is read, not at its first
    allreduce. ``test_only``: a test's stand-in (the in-process ``inproc``), left out of
    ``user_transport_names`` and so of the JSON Schema. ``cls``: the ``Transport`` class
    that ``factory`` makes, whose class attributes (``gpu_preference``,
    ``usable_on_gpu``) are asked without building one (not needed when ``factory`` is the
    class itself)."""
    _TRANSPORTS[name] = factory
    if cls is None and isinstance(factory, type) and issubclass(factory, Transport):
        cls = factory
    if cls is None:
        _TRANSPORT_CLASSES.pop(name, None)
    else:
        _TRANSPORT_CLASSES[name] = cls
    if test_only:
        _TEST_ONLY.add(name)
    else:
        _TEST_ONLY.discard(name)
    if backends is None:
        _TRANSPORT_BACKENDS.pop(name, None)
    else:
        _TRANSPORT_BACKENDS[name] = tuple(backends)


def registered_names() -> list[str]:
    """The registered transports, in registration order (no plug-in is loaded)."""
    return list(_TRANSPORTS)


def factory_of(name: str) -> TransportFactory | None:
    """What makes transport ``name`` (``None`` when not registered)."""
    return _TRANSPORTS.get(name)


def class_of(name: str) -> type[Transport] | None:
    """The ``Transport`` class of ``name`` (``None`` when unknown or not said)."""
    return _TRANSPORT_CLASSES.get(name)


def backends_of(name: str) -> tuple[str, ...] | None:
    """The backends whose buffers ``name`` moves (``None``: every backend's)."""
    return _TRANSPORT_BACKENDS.get(name)


def is_test_only(name: str) -> bool:
    """Whether ``name`` is a test's stand-in (left out of the schema and the docs)."""
    return name in _TEST_ONLY
