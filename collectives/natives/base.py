"""One interface per MPI library: what ``native`` can choose in it and how.

Use ``current()`` to get the module of the library mpi4py loaded (``mpich``, ``openmpi``, or
``Unknown`` for any other: the library's default allreduce only, said once); ``for_name``
for the library a profile recorded. Each library's module registers itself with
``@register``; ``native.py``, the tuner and ``ringtune export`` ask it instead of naming a
library. Adding a library is one module here (and one import in ``__init__``), or a
plug-in module outside the tree (``collectives.plugins``), loaded for a name not known.
"""

from __future__ import annotations

import contextvars
import functools
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

#: The library's own selection, in every library.
DEFAULT = "auto"


class NativeLibrary:
    """An MPI library as ``native`` sees it. The defaults describe a library ringtune does
    not know: its default allreduce only (``impl=auto``)."""

    #: The library's name as ``collectives.mpit.library()`` reports it.
    name: ClassVar[str] = ""
    #: ``ringtune export --format`` of its own tuning file ("" when none).
    export_format: ClassVar[str] = ""
    #: How the cost model times the library's default allreduce (``Cluster.native_model``):
    #: ``"best"``, the fastest of the model's algorithms, unless a module knows better.
    cost_model: ClassVar[str] = "best"

    def __init__(self, name: str = "", version: str = "") -> None:
        self.lib_name = name or self.name
        self.version = version

    def label(self) -> str:
        return f"{self.lib_name} {self.version}".strip()

    def unavailable_reason(self) -> str:
        """Empty when the library's algorithms can be chosen per call; else why not."""
        return (f"{self.label()} is an MPI library ringtune does not know: native runs its "
                "default allreduce only (impl=auto)")

    def algorithms(self) -> list[str]:
        """The library's allreduce algorithms worth searching, without ``auto``."""
        return []

    def check_impl(self, impl: str) -> None:
        """``ValueError`` naming this library's algorithms when ``impl`` is not one."""
        if impl == DEFAULT:
            return
        why = self.unavailable_reason()
        have = self.algorithms()
        if why or impl not in have:
            raise ValueError(
                f"impl: {impl!r} is not an allreduce algorithm of {self.label()} "
                f"(it has {', '.join([DEFAULT, *have])}"
                + (f"; {why}" if why and not have else "")
                + "); a profile tuned with another MPI library: re-tune on this one")

    def prepare(self, ctx: Any, impl: str) -> tuple[Any, list[Any]]:
        """Where and how one call runs ``impl`` on ``ctx``: ``(context, selectors)``, the
        context whose transport's ``native_allreduce`` to call and the objects whose
        ``enter()``/``exit()`` frame the call (collective where a library needs a new
        communicator: every rank prepares the same plan)."""
        self.check_impl(impl)
        return ctx, []


#: The library a profile being read or run was tuned with ("" outside ``tuned_with``).
_TUNED_WITH: contextvars.ContextVar[str] = contextvars.ContextVar("ringtune_tuned_with",
                                                                  default="")


@contextmanager
def tuned_with(library: str | None) -> Iterator[None]:
    """Inside: ``native`` parameters come from a profile tuned with ``library``. Where that
    is another library than the running one, its ``impl`` names are that library's: not
    checked against this one, and run as this library's default with one warning (the
    Communicator also warns that the profile is stale), instead of failing the job."""
    token = _TUNED_WITH.set(library or "")
    try:
        yield
    finally:
        _TUNED_WITH.reset(token)


def foreign_profile() -> str:
    """The library of the profile being read or run when it is not the running library
    (see ``tuned_with``), else ""."""
    name = _TUNED_WITH.get()
    if not name:
        return ""
    return "" if name == current().lib_name else name


_REGISTRY: dict[str, type[NativeLibrary]] = {}
_warned: set[str] = set()


def register(cls: type[NativeLibrary]) -> type[NativeLibrary]:
    """Class decorator: the library module for ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def for_name(name: str, version: str = "") -> NativeLibrary:
    """The module of library ``name`` (a profile's ``library.name``); an unknown name
    gets the default-only ``NativeLibrary`` (after the plug-ins had their chance to
    register a module for it: ``collectives.plugins``)."""
    cls = _REGISTRY.get(name)
    if cls is None:
        from ..plugins import load as load_plugins

        load_plugins()
        cls = _REGISTRY.get(name, NativeLibrary)
    return cls(name, version)


@functools.lru_cache(maxsize=1)
def current() -> NativeLibrary:
    """The module of the library mpi4py loaded (initialises MPI). A library ringtune does
    not know still runs, with ``native impl=auto`` only, and a warning says so once."""
    from ..mpit import library

    name, version = library()
    lib = for_name(name, version)
    if type(lib) is NativeLibrary and name not in _warned:
        _warned.add(name)
        warnings.warn(f"ringtune: {lib.unavailable_reason()}", RuntimeWarning, stacklevel=2)
    return lib
