"""The registries of array backends and transports, by name.

Use ``get_backend(name)`` / ``backend_for(buf)`` for a backend and
``make_transport(name, comm, backend)`` for a transport. The built-in ones (the ``numpy``
backend, the ``mpi`` and ``torch`` transports) are registered here. Everything else comes
from plug-in modules that register their backends and transports (``register_backend``,
``register_transport``) when they are imported: a name not registered yet, or a list of
names, makes the registry import the plug-ins once (``collectives.plugins.load``: the
optional built-in GPU plug-in, installed packages' ``ringtune.plugins`` entry points and
the site's ``RINGTUNE_PLUGINS``). A plug-in module must import cheaply: the GPU plug-in
loads CuPy only inside its backend's loader, so listing the transports never needs a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .backend import NUMPY, Backend, is_gpu_array
from .plugins import load as load_plugins
from .plugins import unknown_hint
from .transport import Transport
from .transports.mpi import MpiTransport, make_mpi_transport
from .transports.torch import TorchTransport, make_torch_transport

#: Makes the backend (called once; the instance is shared). Raises ``ValueError`` saying
#: what to install when the backend cannot work here.
BackendLoader = Callable[[], Backend]
#: Makes a transport over ``comm`` for ``backend``'s buffers; ``ValueError`` (or a
#: subclass) naming the fix when it cannot serve them.
TransportFactory = Callable[[Any, Backend], Transport]

_LOADERS: dict[str, BackendLoader] = {}
_BACKENDS: dict[str, Backend] = {}
_TRANSPORTS: dict[str, TransportFactory] = {}
#: transport -> the backends whose buffers it moves (absent: every backend's).
_TRANSPORT_BACKENDS: dict[str, tuple[str, ...]] = {}
#: Transports registered by tests only (left out of the JSON Schema and of docs).
_TEST_ONLY: set[str] = set()
#: transport -> its ``Transport`` class, where the registration said it.
_TRANSPORT_CLASSES: dict[str, type[Transport]] = {}


def register_backend(name: str, loader: BackendLoader) -> None:
    """Make backend ``name`` available; ``loader`` runs on its first use."""
    _LOADERS[name] = loader


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


def backend_names() -> list[str]:
    """Every registered backend name, built-in first."""
    load_plugins()
    return list(_LOADERS)


def transport_names() -> list[str]:
    """Every registered transport name, built-in first."""
    load_plugins()
    return list(_TRANSPORTS)


def user_transport_names() -> list[str]:
    """The registered transports that are not test-only (what the JSON Schema lists)."""
    return [t for t in transport_names() if t not in _TEST_ONLY]


def transports_for(backend: str) -> list[str]:
    """The registered transports that move ``backend``'s buffers, built-in first."""
    return [t for t in transport_names()
            if backend in _TRANSPORT_BACKENDS.get(t, (backend,))]


def transport_class(name: str) -> type[Transport] | None:
    """The class of transport ``name`` (``None`` when unknown or not said)."""
    if name not in _TRANSPORTS:
        load_plugins()
    return _TRANSPORT_CLASSES.get(name)


def gpu_transport_names() -> list[str]:
    """The registered transports offered for GPU buffers, best first
    (``Transport.gpu_preference``; ties in registration order)."""
    ranked = []
    for i, name in enumerate(transports_for("cupy")):
        cls = _TRANSPORT_CLASSES.get(name)
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
    served = _TRANSPORT_BACKENDS.get(transport)
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
    if name not in _TRANSPORTS:
        load_plugins()
    factory = _TRANSPORTS.get(name)
    if factory is None:
        raise ValueError(
            f"unknown transport {name!r}: use one of {', '.join(transport_names())}"
            f"{unknown_hint()}")
    return factory(comm, backend)


def default_transport(backend: Backend) -> str:
    """The transport used when neither the call nor the profile names one."""
    return backend.default_transport()


register_backend("numpy", lambda: NUMPY)
register_transport("mpi", make_mpi_transport, cls=MpiTransport)
# torch is imported by the transport's constructor only, under the ``torch`` engine.
register_transport("torch", make_torch_transport, cls=TorchTransport)
