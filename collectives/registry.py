"""The registries of array backends and transports, by name.

Use ``get_backend(name)`` / ``backend_for(buf)`` for a backend and
``make_transport(name, comm, backend)`` for a transport. The built-in ones (the ``numpy``
backend, the ``mpi`` and ``torch`` transports) are registered here. Everything else comes
from plug-in modules that register their backends and transports (``register_backend``,
``register_transport``) when they are imported: a name not registered yet makes the
registry import the plug-ins listed in ``PLUGINS`` once, and a plug-in whose import fails
registers nothing (as mpi4py's optional backends do). A plug-in module must import
cheaply: the GPU plug-in loads CuPy only inside its backend's loader, so listing the
transports never needs a GPU.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from .backend import NUMPY, Backend, is_gpu_array
from .transport import Transport
from .transports.mpi import make_mpi_transport
from .transports.torch import make_torch_transport

#: Makes the backend (called once; the instance is shared). Raises ``ValueError`` saying
#: what to install when the backend cannot work here.
BackendLoader = Callable[[], Backend]
#: Makes a transport over ``comm`` for ``backend``'s buffers; ``ValueError`` (or a
#: subclass) naming the fix when it cannot serve them.
TransportFactory = Callable[[Any, Backend], Transport]

#: Plug-in modules, imported on the first name that is not registered yet.
PLUGINS: tuple[str, ...] = ("collectives.cuda",)

_log = logging.getLogger(__name__)
_LOADERS: dict[str, BackendLoader] = {}
_BACKENDS: dict[str, Backend] = {}
_TRANSPORTS: dict[str, TransportFactory] = {}
_plugins_loaded = False


def register_backend(name: str, loader: BackendLoader) -> None:
    """Make backend ``name`` available; ``loader`` runs on its first use."""
    _LOADERS[name] = loader


def register_transport(name: str, factory: TransportFactory) -> None:
    """Make transport ``name`` available (names list in registration order)."""
    _TRANSPORTS[name] = factory


def load_plugins() -> None:
    """Import the plug-in modules once (each registers what it provides)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for module in PLUGINS:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            _log.debug("plug-in %s not loaded: %s", module, exc)


def backend_names() -> list[str]:
    """Every registered backend name, built-in first."""
    load_plugins()
    return list(_LOADERS)


def transport_names() -> list[str]:
    """Every registered transport name, built-in first."""
    load_plugins()
    return list(_TRANSPORTS)


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
        raise ValueError(f"unknown backend {name!r}: use one of {', '.join(backend_names())}")
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
    if name not in _TRANSPORTS:
        load_plugins()
    factory = _TRANSPORTS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown transport {name!r}: use one of {', '.join(transport_names())}")
    return factory(comm, backend)


def default_transport(backend: Backend) -> str:
    """The transport used when neither the call nor the profile names one."""
    return backend.default_transport()


register_backend("numpy", lambda: NUMPY)
register_transport("mpi", make_mpi_transport)
# torch is imported by the transport's constructor only, under the ``torch`` engine.
register_transport("torch", make_torch_transport)
