"""One interface per MPI library: what ``native`` can choose in it, how, and what it costs.

Use ``current()`` to get the module of the library mpi4py loaded (``mpich``, ``openmpi``,
``intelmpi``, or the default-only ``NativeLibrary`` for any other; Intel MPI and the others
run their default allreduce only, said once); ``for_name`` for the library a profile
recorded; ``for_cost_model`` for the library a cost model's cluster names
(``Cluster.native_model``); ``libraries()`` for every one (the schema's compositions,
``collectives.mpi.mpit.library``'s names, the export formats). Each library's module registers
itself with ``@register``; ``native.py``, the cost model, the calibration, the schema, the
tuner and ``ringtune export`` ask it instead of naming a library. Adding a library is one
module here (and one import in ``__init__``), or a plug-in module outside the tree
(``collectives.plugins``), loaded for a name not known.

The cost model's side: ``cost(model, params, sizes)`` is ``native``'s time with those
parameters, ``default_cost`` the library's own allreduce on a sub-communicator. ``model``
is an ``autotune.model.Model`` (passed in: collectives never imports autotune); the shapes
every library's algorithms are made of (recursive doubling, halving/doubling, ring, a
reduce and a bcast, linear) are the functions at the end of this module.
"""

from __future__ import annotations

import contextvars
import functools
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np

#: The library's own selection, in every library.
DEFAULT = "auto"


class NativeLibrary:
    """An MPI library as ``native`` sees it. The defaults describe a library ringtune does
    not know: its default allreduce only (``impl=auto``)."""

    #: The library's name as ``library()`` reports it.
    name: ClassVar[str] = ""
    #: ``ringtune export --format`` of its own tuning file ("" when none).
    export_format: ClassVar[str] = ""
    #: The key of its cost model (``Cluster.native_model``, set by the calibration on this
    #: machine): ``"best"``, the fastest of the model's algorithms, unless a module knows
    #: better (the library's own selection, its per-message cost and reduction rate).
    cost_model: ClassVar[str] = "best"
    #: ``False`` for a library whose algorithms cannot be chosen call by call (only its
    #: default runs, and ``current()`` says so once, as for a library without a module).
    chooses_per_call: ClassVar[bool] = True
    #: Regular expression whose group 1 is the version, in ``MPI.Get_library_version()``.
    version_re: ClassVar[str] = ""
    #: Its ``MPI_T_SCOPE_CONSTANT`` (the scopes follow in the standard's order).
    mpit_scope_base: ClassVar[int] = 0
    #: ``native composition=`` values (how the allreduce is composed of intra- and
    #: inter-host parts; ``auto`` first, the library's own choice), empty when it has none.
    compositions: ClassVar[tuple[str, ...]] = ()
    #: The compositions the tuner searches across hosts (a subset of ``compositions``).
    searched_compositions: ClassVar[tuple[str, ...]] = ()
    #: The composition that runs one flat algorithm over every rank ("" when none): a first
    #: guess of the tuners across hosts, where it often beats the library's own choice.
    flat_composition: ClassVar[str] = ""

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
        """The library's allreduce algorithms ``impl`` may name, without ``auto``."""
        return []

    def algorithms_on(self, hosts: int) -> list[str]:
        """The ones the tuner searches for a world on ``hosts`` hosts (some apply only
        across hosts)."""
        return self.algorithms()

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


    # -- compositions ---------------------------------------------------------------------

    def check_composition(self, name: str) -> None:
        """``ValueError`` when ``name`` is not one of this library's compositions (checked
        against the installed library where it can say them)."""
        if name != DEFAULT and name not in self.compositions:
            raise ValueError(f"composition: {name!r} is not an allreduce composition of "
                             f"{self.label()} (it has "
                             f"{', '.join(self.compositions or (DEFAULT,))})")

    def compositions_searchable(self) -> bool:
        """Whether the running library can set its compositions per call."""
        return False

    def composition_selector(self, name: str) -> tuple[Any, str]:
        """``(selector, "")`` whose ``enter()``/``exit()`` frame a call composed as ``name``,
        or ``(None, why not)`` (runs the library's own composition, warned)."""
        return None, f"{self.label()} has no allreduce compositions"

    # -- the cost model -------------------------------------------------------------------

    def calibration(self) -> dict[str, Any]:
        """The fields of a cluster calibrated on this machine (``autotune.primitives``) that
        say how to model this library: its cost model's key."""
        return {"native_model": self.cost_model}

    def default_cost(self, model: Any, stride: int, d: int, region: Any) -> Any:
        """Seconds of the library's own allreduce of each size in ``region`` along a
        dimension (``stride``, ``d`` ranks) of ``model``'s world. Here: the better of
        recursive doubling and halving/doubling at each size, as ringtune would run them —
        what a library tuned for the machine approaches."""
        if d <= 1:
            return region * 0.0
        halving = halving_cost(model, stride, d, region, native=False)
        return np.minimum(halving, doubling_cost(model, stride, d, region, native=False))

    def impl_cost(self, model: Any, impl: str, stride: int, d: int, region: Any) -> Any:
        """Seconds of algorithm ``impl`` along a dimension; a library that does not model
        its algorithms one by one: its default's."""
        return self.default_cost(model, stride, d, region)

    def node_aware(self, model: Any) -> bool:
        """Whether the library's default allreduce on ``model``'s world is composed of
        intra-host parts and a host leaders' allreduce (then ``node_aware_cost``)."""
        return False

    def node_aware_cost(self, model: Any, impl: str, sizes: Any) -> Any:
        """That composed allreduce, ``impl`` (``auto``: the library's own) among the host
        leaders."""
        return self.world_cost(model, impl, sizes)

    def world_cost(self, model: Any, impl: str, sizes: Any) -> Any:
        """Seconds of ``impl`` (``auto``: the library's own) over the whole world, flat."""
        if impl == DEFAULT:
            return self.default_cost(model, 1, model.n, sizes)
        return self.impl_cost(model, impl, 1, model.n, sizes)

    def composition_cost(self, model: Any, composition: str, impl: str, sizes: Any) -> Any:
        """Seconds of ``native`` composed as ``composition`` (not ``auto``)."""
        return self.world_cost(model, impl, sizes)

    def cost(self, model: Any, params: Any, sizes: Any) -> Any:
        """Seconds of ``native`` with ``params`` (``impl``, ``composition``) for each size:
        the library's own choice where both are ``auto``, node-aware where the library's
        default is (``node_aware``)."""
        impl = str(params.get("impl", DEFAULT))
        comp = str(params.get("composition", DEFAULT))
        if comp != DEFAULT:
            return self.composition_cost(model, comp, impl, sizes)
        if self.node_aware(model):
            return self.node_aware_cost(model, impl, sizes)
        return self.world_cost(model, impl, sizes)


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


def libraries() -> list[type[NativeLibrary]]:
    """Every registered library's class, in registration order (plug-ins loaded first)."""
    from ..plugins import load as load_plugins

    load_plugins()
    return list(_REGISTRY.values())


def all_compositions() -> tuple[str, ...]:
    """Every registered library's compositions (``auto`` first): what a profile may name."""
    out = [DEFAULT]
    for cls in libraries():
        out += [c for c in cls.compositions if c not in out]
    return tuple(out)


def for_cost_model(key: str) -> NativeLibrary:
    """The library whose cost model is ``key`` (``Cluster.native_model``); ``"best"`` (or
    a key no module has) the default-only ``NativeLibrary``'s best-of model."""
    for cls in _REGISTRY.values():
        if cls.cost_model == key:
            return cls()
    return NativeLibrary("", "")


def cost_models() -> tuple[str, ...]:
    """Every ``Cluster.native_model`` value a model knows."""
    return tuple(dict.fromkeys(["best", *(c.cost_model for c in _REGISTRY.values())]))


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
    """The module of the library mpi4py loaded (initialises MPI). A library whose
    algorithms cannot be chosen per call (one ringtune does not know, Intel MPI) still runs,
    with ``native impl=auto`` only, and a warning says so once."""
    name, version = library()
    lib = for_name(name, version)
    if (type(lib) is NativeLibrary or not lib.chooses_per_call) and name not in _warned:
        _warned.add(name)
        warnings.warn(f"ringtune: {lib.unavailable_reason()}", RuntimeWarning, stacklevel=2)
    return lib


def library() -> tuple[str, str]:
    """``(name, version)`` of the MPI library mpi4py loaded, e.g. ``("MPICH", "5.0.2")``:
    the first registered module whose ``version_re`` matches the library's version text,
    else the text's first line."""
    from mpi4py import MPI

    text = MPI.Get_library_version()
    for cls in _REGISTRY.values():
        m = re.search(cls.version_re, text) if cls.version_re else None
        if m:
            return cls.name, m.group(1)
    first = text.strip().splitlines()[0] if text.strip() else "unknown"
    return first[:60], ""


def binding() -> tuple[Any, str]:
    """``collectives.mpi.mpit.bound()`` with the running library's scope numbering set: the
    bound MPI_T, or (None, why not)."""
    from ..mpi.mpit import bound

    mpit, why = bound()
    if mpit is not None:
        mpit.set_scope_base(for_name(library()[0]).mpit_scope_base)
    return mpit, why


_warned_library: set[str] = set()


def warn_other_library(profile: Any) -> str:
    """Warn once per profile when it was tuned with another MPI library or version than
    this job's (peers' tuning goes stale across releases); returns the message or ""."""
    lib = profile.library  # the validated record (collectives.profile.records)
    if lib is None:
        return ""
    name, version = library()
    from ..mpi.mpit import nccl_version

    nccl = nccl_version() if lib.nccl and "cupy" in sys.modules else None
    if (lib.name, lib.version) == (name, version) and (nccl is None or nccl == lib.nccl):
        return ""
    tuned, here = f"{lib.name} {lib.version}", f"{name} {version}"
    if nccl is not None:
        tuned, here = f"{tuned}, NCCL {lib.nccl}", f"{here}, NCCL {nccl}"
    msg = (f"{profile.path}: tuned with {tuned}, this job runs {here}; its choices may be "
           "stale: re-tune with `ringtune tune` on this library")
    if profile.path not in _warned_library:
        _warned_library.add(str(profile.path))
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return msg



# -- the shapes libraries' allreduce algorithms are made of (seconds per size) --------------
# ``native``: with the library's per-message cost, reduction rate and partner order (the
# model's ``native_over``, ``native_memory_curve``; nearest partner first); otherwise as
# ringtune's own algorithms run them.


def doubling_cost(model: Any, stride: int, d: int, region: Any, native: bool = True) -> Any:
    """Recursive doubling: the whole buffer every step, with every rank's partner; a world
    not a power of two folds its extra ranks in first and out last."""
    if d <= 1:
        return region * 0.0
    over = model.native_over if native else model.over
    p = 1 << (d.bit_length() - 1)
    total = region * 0.0
    if d > p:
        fold = model.step(model.pair_terms(stride, d, "fold", 0), region) + over
        total = total + 2 * fold + model.reduce_time(region, native)
    mask = p >> 1
    while mask:
        total = total + (model.step(model.pair_terms(stride, d, "mask", mask), region)
                         + 2 * over + model.reduce_time(region, native))
        mask >>= 1
    return total


def halving_cost(model: Any, stride: int, d: int, region: Any, native: bool = True) -> Any:
    """Rabenseifner's halving/doubling: a reduce-scatter by recursive halving, an
    all-gather by recursive doubling."""
    return (model.rhd_phase(stride, d, region, True, native)
            + model.rhd_phase(stride, d, region, False, native))


def ring_cost(model: Any, stride: int, d: int, region: Any, native: bool = True) -> Any:
    """One ring: a reduce-scatter and an all-gather of d - 1 steps of region / d."""
    return (model.ring_phase(stride, d, region, 1, 0, True, native)
            + model.ring_phase(stride, d, region, 1, 0, False, native))


def tree_steps(d: int) -> int:
    """Steps of a binomial tree over ``d`` ranks."""
    return max(0, (d - 1).bit_length())


def reduce_bcast_cost(model: Any, stride: int, d: int, region: Any) -> Any:
    """A binomial-tree reduce to one rank, then a binomial-tree bcast from it: the whole
    buffer each of the ⌈log2 d⌉ steps of each (the library's rates and costs)."""
    if d <= 1:
        return region * 0.0
    p = 1 << (d.bit_length() - 1)
    mask = max(1, p >> 1)
    one = model.step(model.pair_terms(stride, d, "mask", mask), region) + 2 * model.native_over
    k = tree_steps(d)
    return k * (2 * one + model.reduce_time(region, True))


def linear_cost(model: Any, stride: int, d: int, region: Any) -> Any:
    """A linear reduce (one rank receives and reduces every other rank's buffer in turn)
    and a linear bcast (it sends the result to each in turn)."""
    if d <= 1:
        return region * 0.0
    one = model.step(model.pair_terms(stride, d, "mask", 1), region) + model.native_over
    return (d - 1) * (2 * one + model.reduce_time(region, True))
