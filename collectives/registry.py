"""The registries of array backends and transports, by name.

Use ``get_backend(name)`` / ``backend_for(buf)`` for a backend and
``make_transport(name, comm, backend)`` for a transport. The built-in ``numpy`` backend is
registered here; the built-in transports register themselves (``register_transport``, from
``collectives.transports.registry``, re-exported here) when the package
``collectives.transports`` imports them, in the order of its import line, which is the
order every list of transports keeps. Everything else comes from plug-in modules that
register their backends and transports (``register_backend``, ``register_transport``)
when they are imported: a name not registered yet, or a list of names, makes the registry
import the plug-ins once (``collectives.plugins.load``: the optional built-in GPU plug-in,
installed packages' ``ringtune.plugins`` entry points and the site's
``RINGTUNE_PLUGINS``). A plug-in module must import cheaply: the GPU plug-in loads CuPy
only inside its backend's loader, so listing the transports never needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .backend import NUMPY, Backend, is_gpu_array
from .plugins import load as load_plugins
from .plugins import unknown_hint
from .transport import Transport

# The package imports the built-in transports, each of which registers itself.
from .transports import registry as _table
from .transports.registry import TransportFactory, register_transport

#: Makes the backend (called once; the instance is shared). Raises ``ValueError`` saying
#: what to install when the backend cannot work here.
BackendLoader = Callable[[], Backend]

_LOADERS: dict[str, BackendLoader] = {}
_BACKENDS: dict[str, Backend] = {}

__all__ = ["BackendLoader", "TransportFactory", "register_backend", "register_transport",
           "backend_names", "transport_names", "user_transport_names", "transports_for",
           "transport_class", "gpu_transport_names", "fallback_gpu_transport",
           "transport_refusal", "get_backend", "backend_for", "make_transport",
           "default_transport"]


def register_backend(name: str, loader: BackendLoader) -> None:
    """Make backend ``name`` available; ``loader`` runs on its first use."""
    _LOADERS[name] = loader


def backend_names() -> list[str]:
    """Every registered backend name, built-in first."""
    load_plugins()
    return list(_LOADERS)


def transport_names() -> list[str]:
    """Every registered transport name, built-in first."""
    load_plugins()
    return _table.registered_names()


def user_transport_names() -> list[str]:
    """The registered transports that are not test-only (what the JSON Schema lists)."""
    return [t for t in transport_names() if not _table.is_test_only(t)]


def transports_for(backend: str) -> list[str]:
    """The registered transports that move ``backend``'s buffers, built-in first."""
    return [t for t in transport_names()
            if backend in (_table.backends_of(t) or (backend,))]


def transport_class(name: str) -> type[Transport] | None:
    """The class of transport ``name`` (``None`` when unknown or not said)."""
    if _table.factory_of(name) is None:
        load_plugins()
    return _table.class_of(name)


def gpu_transport_names() -> list[str]:
    """The registered transports offered for GPU buffers, best first
    (``Transport.gpu_preference``; ties in registration order)."""
    ranked = []
    for i, name in enumerate(transports_for("cupy")):
        cls = _table.class_of(name)
        if cls is not None and cls.gpu_preference is not None:
            ranked.append((cls.gpu_preference, i, name))
    return [name for _, _, name in sorted(ranked)]


def fallback_gpu_transport() -> str:
    """The GPU transport of last resort (the highest ``gpu_preference``: ``staged``), whose
    errors explain what is missing where nothing better is available; ``ValueError`` when
    no registered transport is offered for GPU buffers."""
    names = gpu_transport_names()
    if not names:
        raise ValueError("no registered transport moves GPU buffers (collectives.cuda "
                         f"registers them){unknown_hint()}")
    return names[-1]


def transport_refusal(transport: str, backend: str) -> str | None:
    """Why transport ``transport`` cannot move backend ``backend``'s buffers (one phrase
    naming the fix), or ``None`` when it can. Needs neither the backend's library nor a
    device: a loader asks it for any profile on any machine."""
    names = transport_names()
    if transport not in names:
        return (f"unknown transport {transport!r}: use one of {', '.join(names)}"
                f"{unknown_hint()}")
    if backend not in backend_names():
        return (f"unknown backend {backend!r}: use one of {', '.join(backend_names())}"
                f"{unknown_hint()}")
    served = _table.backends_of(transport)
    if served is not None and backend not in served:
        return (f"transport {transport!r} moves {' and '.join(served)} buffers only, not "
                f"{backend} ones; {backend} buffers use {' or '.join(transports_for(backend))}")
    return None


def get_backend(name: str) -> Backend:
    """The backend called ``name``; ``ValueError`` if unknown or unavailable here (the
    message says what to install)."""
    found = _BACKENDS.get(name)
    if found is not None:
        return found
    if name not in _LOADERS:
        load_plugins()
    loader = _LOADERS.get(name)
    if loader is None:
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(backend_names())}"
                         f"{unknown_hint()}")
    backend = _BACKENDS[name] = loader()
    return backend


def backend_for(buf: Any) -> Backend:
    """The backend that owns ``buf``: NumPy arrays → numpy; CuPy arrays, objects exposing
    ``__cuda_array_interface__`` or a CUDA DLPack device (a torch CUDA tensor) → cupy."""
    if isinstance(buf, np.ndarray):
        return NUMPY
    if is_gpu_array(buf):
        return get_backend("cupy")
    raise TypeError(
        f"unsupported buffer type {type(buf).__name__}: pass a NumPy array, a CuPy array, or "
        "a GPU tensor exposing DLPack / __cuda_array_interface__"
    )


def make_transport(name: str, comm: Any, backend: Backend) -> Transport:
    """A transport by name for ``comm`` and ``backend``; ``ValueError`` if it is unknown or
    cannot serve that backend here (the message says why and what to use instead)."""
    factory = _table.factory_of(name)
    if factory is None:
        load_plugins()
        factory = _table.factory_of(name)
    if factory is None:
        raise ValueError(
            f"unknown transport {name!r}: use one of {', '.join(transport_names())}"
            f"{unknown_hint()}")
    return factory(comm, backend)


def default_transport(backend: Backend) -> str:
    """The transport used when neither the call nor the profile names one."""
    return backend.default_transport()


register_backend("numpy", lambda: NUMPY)
