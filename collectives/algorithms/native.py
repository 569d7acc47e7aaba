"""``native``: the communication library's own allreduce (MPI_Allreduce on host buffers,
NCCL allReduce on GPU buffers). The baseline every tuned choice must beat, and often the
best choice for small messages, where its latency-optimised algorithms win.

``impl`` picks one of the library's own algorithms for the call, as the library's module
in ``collectives.natives`` offers them (read from the installed library at run time): on
MPICH any choice of ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` (``ring``, ``tree``,
``recursive_doubling``, …), set around each call; on Open MPI its ``coll/tuned`` algorithms
(``ring``, ``recursive_doubling``, ``rabenseifner``, …), on a duplicate communicator created
with the algorithm forced. ``auto`` (the default) is the library's own selection. A library
ringtune does not know, or NCCL on GPU buffers, has only ``auto``; an ``impl`` the running
library does not have is a ``ValueError`` naming the ones it has.

``composition`` picks how the library composes the allreduce of intra- and inter-node parts,
where its module has compositions (MPICH's ``MPIR_CVAR_ALLREDUCE_COMPOSITION``, set per call
the same way: ``alpha`` an intra-node reduce, the node leaders' allreduce, an intra-node
bcast; ``beta`` flat over every rank; ``gamma`` shared memory only; ``delta`` several
leaders per node); ``auto`` (the default) the library's selection. It changes nothing on one
host, so the tuner searches it only across several hosts. A library without compositions
runs its default, with a warning.

The cost model asks the library's module too (``NativeLibrary.cost``): the time of its own
selection, of each ``impl``, of each composition.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

from .base import Context, HostAwareAlgorithm
from .multiring import RingSchedule
from .registry import register

_IMPL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_warned: set[str] = set()


@register
class Native(HostAwareAlgorithm):
    """Delegate to ``transport.native_allreduce``, optionally with the library's algorithm
    ``impl`` and composition ``composition``."""

    name = "native"
    param_names = ("impl", "composition")
    display_order = 0
    model_order = 0
    grid_dimension = 2

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        from ..natives import all_compositions, libraries

        owners = ", ".join(f"{c.name}'s" for c in libraries() if c.compositions)
        return {"type": "object", "additionalProperties": False,
                "properties": {"impl": {
                    "description": "one of the running MPI library's own allreduce "
                                   "algorithms, as its module in collectives.natives reads "
                                   "them from the library, or auto",
                    "type": "string", "pattern": _IMPL_RE.pattern,
                    "not": {"pattern": "\n"}},
                    "composition": {
                        "description": "how the library composes the allreduce of intra- "
                                       f"and inter-node parts ({owners or 'none has any'}), "
                                       "or auto",
                        "enum": list(all_compositions())}}}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """The library's allreduce as its module models it (``NativeLibrary.cost``: its own
        selection, node-aware across hosts where it is, an ``impl``, a composition)."""
        return model.native.cost(model, params, sizes)

    @classmethod
    def grid_cost(cls, model: Any, stride: int, d: int, region: Any,
                  params: Mapping[str, Any]) -> Any:
        """A full sub-allreduce of the region, then a one-ring all-gather back."""
        return (model.native_allreduce(stride, d, region)
                + model.ring_phase(stride, d, region, 1, 0, False))

    @classmethod
    def grid_phase(cls, ctx: Context, offset: int, count: int, dtype: str, op: str,
                   params: Mapping[str, Any]) -> NativePhase:
        return NativePhase(ctx, offset, count, dtype, op)

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        super().__init__(ctx, count, dtype, op, params)
        impl = str(self.params.get("impl", "auto"))
        comp = str(self.params.get("composition", "auto"))
        # Who picks the transport's native allreduce where the MPI library does not (NCCL,
        # a torch.distributed group's backend): ``Transport.native_chooser``.
        chooser = str(getattr(ctx.transport, "native_chooser", ""))
        # Entered in this order, left in reverse: each restores the value it found.
        self._selectors: list[Any] = []
        #: Where the call runs: ``ctx``, or a library's context prepared for ``impl``.
        self._run_ctx = ctx
        if ctx.size > 1:
            if impl != "auto" and not getattr(ctx.transport, "native_impls", True):
                _warn(f"impl={impl}", f"{chooser} chooses its own algorithm")
            elif impl != "auto":
                from ..natives import current, foreign_profile

                lib = current()
                other = foreign_profile()
                if other and impl not in lib.algorithms():
                    _warn(f"impl={impl}", f"the profile was tuned with {other}; "
                          f"{lib.label()} has no {impl!r}")
                else:
                    self._run_ctx, self._selectors = lib.prepare(ctx, impl)
            sel = _selector_for(comp, chooser) if comp != "auto" else None
            if sel is not None:
                self._selectors.append(sel)

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        out = super().check_params(params, world_size)
        impl = out.get("impl", "auto")
        if not isinstance(impl, str) or not _IMPL_RE.fullmatch(impl):
            raise ValueError(f"impl: expected the name of one of the library's allreduce "
                             f"algorithms (or auto), got {impl!r}")
        if impl != "auto":
            from ..natives import current, foreign_profile

            if not foreign_profile():  # another library's profile: its names, warned at run
                current().check_impl(impl)  # ValueError naming the library's algorithms
        comp = out.get("composition", "auto")
        from ..natives import all_compositions, current, foreign_profile

        known = all_compositions()
        if comp not in known:
            raise ValueError(f"composition: expected one of {', '.join(known)} (how the "
                             f"library composes the allreduce across hosts), got {comp!r}")
        if comp != "auto" and not foreign_profile():
            lib = current()
            if lib.compositions:  # a library without any runs its default, warned at run
                lib.check_composition(comp)  # ValueError naming the library's compositions
        return out

    @classmethod
    def search_space_on(cls, trial: Any, world_size: int, nbytes: int,
                        hosts: int) -> dict[str, Any]:
        """``impl`` where the library's module lists algorithms (for a world on ``hosts``
        hosts); ``composition`` too where the library has compositions it can set and the
        world spans several hosts (on one host every composition runs the same
        algorithms)."""
        from ..natives import current

        lib = current()
        impls = ["auto", *lib.algorithms_on(hosts)]
        if len(impls) == 1:
            return {}
        out: dict[str, Any] = {}
        impl = trial.suggest_categorical("native.impl", impls)
        if impl != "auto":
            out["impl"] = impl
        if hosts > 1 and lib.compositions_searchable():
            comp = trial.suggest_categorical("native.composition",
                                             list(lib.searched_compositions))
            if comp != "auto":
                out["composition"] = comp
        return out

    def run(self, buf: Any) -> None:
        if self.count == 0 or self.ctx.size == 1:
            return
        sels = self._selectors
        if not sels:
            self._run_ctx.transport.native_allreduce(buf, self.op)
            return
        entered = []
        try:
            for sel in sels:
                sel.enter()
                entered.append(sel)
            self._run_ctx.transport.native_allreduce(buf, self.op)
        finally:
            for sel in reversed(entered):
                sel.exit()


class NativePhase:
    """One dimension of a ``hierarchical`` grid the library's way: its allreduce of the
    region on the sub-communicator, after which this rank keeps block *rank* of the region;
    the all-gather back is a one-ring all-gather (a transport offers no native one)."""

    def __init__(self, ctx: Context, offset: int, count: int, dtype: str, op: str) -> None:
        self.ctx = ctx
        self.op = op
        self.offset, self.count = offset, count
        self.ring = RingSchedule(ctx, offset, count, dtype, op, 1, 0, "topology")
        self.owned = self.ring.owned
        self.trivial = ctx.size == 1 or count == 0

    def reduce_scatter(self, buf: Any) -> None:
        if not self.trivial:
            o = self.offset
            self.ctx.transport.native_allreduce(buf[o:o + self.count], self.op)

    def all_gather(self, buf: Any) -> None:
        self.ring.all_gather(buf)


def _composition_selector(name: str, transport: str) -> Any:
    """The running library's selector of composition ``name`` for a call over transport
    ``transport`` (by name; its class says who chooses its native allreduce), or None
    (with one warning) where the library's choice cannot be set (``_selector_for``)."""
    from ..registry import transport_class

    cls = transport_class(transport)
    return _selector_for(name, cls.native_chooser if cls is not None else "")


def _selector_for(name: str, chooser: str) -> Any:
    """The running library's selector of composition ``name``, or None (with one warning)
    where the library's choice cannot be set: a transport whose native allreduce another
    ``chooser`` picks (NCCL on GPU buffers, a torch.distributed group), a library without
    compositions or without the variable."""
    label = f"composition={name}"
    if chooser:
        why = f"{chooser} chooses its own algorithm"
    else:
        from ..natives import current

        sel, why = current().composition_selector(name)
        if sel is not None:
            return sel
    _warn(label, why)
    return None


def _warn(label: str, why: str) -> None:
    if label not in _warned:
        _warned.add(label)
        warnings.warn(f"native {label}: {why}; running the library's default allreduce "
                      "instead", RuntimeWarning, stacklevel=5)
