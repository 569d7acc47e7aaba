"""``native``: the communication library's own allreduce (MPI_Allreduce on host buffers,
NCCL allReduce on GPU buffers). The baseline every tuned choice must beat, and often the
best choice for small messages, where its latency-optimised algorithms win.

``impl`` picks one of the library's own algorithms for the call: on MPICH any choice of
``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` the installed library lists (``ring``, ``tree``,
``recursive_doubling``, …; ``collectives.mpit`` reads the list at run time and sets the
variable around each call). ``auto`` (the default) is the library's own selection. Another
MPI, or NCCL on GPU buffers, has only ``auto``: a profile naming an MPICH algorithm runs the
library's default there, with a warning saying so.

``composition`` picks how MPICH composes the allreduce of intra- and inter-node parts
(``MPIR_CVAR_ALLREDUCE_COMPOSITION``, set through MPI_T around each call the same way):
``alpha`` an intra-node reduce, the node leaders' allreduce, an intra-node bcast (what MPICH
5.0.2's own selection runs on a communicator spanning hosts); ``beta`` the network module's
allreduce over every rank (flat: ``impl`` is then the algorithm over all ranks); ``delta``
several leaders per node, each for a part of the message; ``auto`` (the default) the
library's selection. It changes nothing on one host (every composition but ``gamma``, shared
memory only, falls back to ``beta``-like flat algorithms there), so the tuner searches it only
on MPICH across several hosts. Another library runs its default, with a warning.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from typing import Any

from .base import Algorithm, Context
from .multiring import RingSchedule
from .registry import register

_IMPL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
#: ``composition`` values: the names of ``collectives.mpit.COMPOSITIONS``, spelled here
#: because importing ``mpit`` costs ``import collectives`` 5-7 ms (a unit test keeps the two
#: equal); the tuner searches ``SEARCHED_COMPOSITIONS`` (``gamma`` needs a world on one
#: node: across hosts MPICH replaces it with beta).
COMPOSITIONS = ("auto", "alpha", "beta", "gamma", "delta")
SEARCHED_COMPOSITIONS = ("auto", "alpha", "beta", "delta")
_warned: set[str] = set()


@register
class Native(Algorithm):
    """Delegate to ``transport.native_allreduce``, optionally with MPICH algorithm ``impl``."""

    name = "native"
    param_names = ("impl", "composition")
    display_order = 0
    model_order = 0
    grid_dimension = 2

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False,
                "properties": {"impl": {
                    "description": "one of the library's own allreduce algorithms (MPICH's "
                                   "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM choices), or auto",
                    "type": "string", "pattern": _IMPL_RE.pattern},
                    "composition": {
                        "description": "how MPICH composes the allreduce of intra- and "
                                       "inter-node parts (MPIR_CVAR_ALLREDUCE_COMPOSITION): "
                                       "alpha node-aware, beta flat over all ranks, gamma "
                                       "shared memory only, delta multi-leader, or auto",
                        "enum": list(COMPOSITIONS)}}}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """The library's allreduce as the model knows it: on MPICH across hosts with several
        ranks per host, its node-aware composition (``Model.node_aware_native``): the
        intra-node reduce, the node leaders' allreduce, the intra-node bcast (an ``impl``
        applies to the leaders' allreduce); elsewhere ``Model.native_allreduce``."""
        comp = params.get("composition", "auto")
        if comp == "beta" or (comp == "auto" and not model.node_aware_native()):
            return model.native_allreduce(1, model.n, sizes)
        if comp == "delta" and model.node_aware_native():
            return cls._multi_leader_cost(model, sizes)
        if model.node_aware_native():
            leaders = model.node_leaders()
            return (model.shm_cells_phase(sizes, True)
                    + leaders.native_allreduce(1, leaders.n, sizes)
                    + model.shm_cells_phase(sizes, False))
        return model.native_allreduce(1, model.n, sizes)

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
        tname = getattr(ctx.transport, "name", "")
        # Entered in this order, left in reverse: each restores the value it found.
        self._selectors: list[Any] = []
        if ctx.size > 1:
            for sel in (_selector(impl, tname) if impl != "auto" else None,
                        _selector(comp, tname, composition=True) if comp != "auto" else None):
                if sel is not None:
                    self._selectors.append(sel)

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        out = super().check_params(params, world_size)
        impl = out.get("impl", "auto")
        if not isinstance(impl, str) or not _IMPL_RE.match(impl):
            raise ValueError(f"impl: expected the name of one of the library's allreduce "
                             f"algorithms (or auto), got {impl!r}")
        if impl != "auto":
            from ..mpit import choice_value, unavailable_reason

            if not unavailable_reason():
                choice_value(impl)  # ValueError naming the installed algorithms
        comp = out.get("composition", "auto")
        if comp not in COMPOSITIONS:
            raise ValueError(f"composition: expected one of {', '.join(COMPOSITIONS)} (how "
                             f"MPICH composes the allreduce across hosts), got {comp!r}")
        if comp != "auto":
            from ..mpit import MpitError, composition_value, unavailable_reason

            if not unavailable_reason():
                try:
                    composition_value(comp)  # ValueError naming this MPICH's compositions
                except MpitError:
                    pass  # no such variable here: runs the default, warned at run time
        return out

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        return cls.search_space_on(trial, world_size, nbytes, 1)

    @classmethod
    def search_space_on(cls, trial: Any, world_size: int, nbytes: int,
                        hosts: int) -> dict[str, Any]:
        """``impl`` where the library is MPICH; ``composition`` too where the world also
        spans several hosts (on one host every composition runs the same algorithms)."""
        from ..mpit import native_algorithms

        impls = ["auto", *native_algorithms()]
        if len(impls) == 1:
            return {}
        out: dict[str, Any] = {}
        impl = trial.suggest_categorical("native.impl", impls)
        if impl != "auto":
            out["impl"] = impl
        if hosts > 1 and _compositions_searchable():
            comp = trial.suggest_categorical("native.composition",
                                             list(SEARCHED_COMPOSITIONS))
            if comp != "auto":
                out["composition"] = comp
        return out

    @staticmethod
    def _multi_leader_cost(model: Any, sizes: Any) -> Any:
        """MPICH's composition delta (``MPIDI_Allreduce_intra_composition_delta``) with every
        rank of a host a leader: each of the host's k ranks leads 1/k of the message, so
        the host's data crosses the uplink once, in k concurrent leaders' allreduces of
        S/k that share it (modelled as the leaders' allreduce of S, the uplink's whole
        bandwidth), framed by an intra-host reduce to each part's leader and a bcast back,
        the k parts' cell phases concurrent (a phase of S/k each)."""
        leaders = model.node_leaders()
        k = max(1, model.n // max(1, leaders.n))
        return (model.shm_cells_phase(sizes / k, True)
                + leaders.native_allreduce(1, leaders.n, sizes)
                + model.shm_cells_phase(sizes / k, False))

    def run(self, buf: Any) -> None:
        if self.count == 0 or self.ctx.size == 1:
            return
        sels = self._selectors
        if not sels:
            self.ctx.transport.native_allreduce(buf, self.op)
            return
        entered = []
        try:
            for sel in sels:
                sel.enter()
                entered.append(sel)
            self.ctx.transport.native_allreduce(buf, self.op)
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


def _compositions_searchable() -> bool:
    from ..mpit import MpitError, compositions, unavailable_reason

    if unavailable_reason():
        return False
    try:
        return len(compositions()) > 1
    except MpitError:
        return False


def _selector(name: str, transport: str, composition: bool = False) -> Any:
    """The ``mpit.Selector`` for algorithm ``name`` (or composition ``name``), or None
    (with one warning) where the library's choice cannot be set: NCCL on GPU buffers, an
    MPI other than MPICH, an MPICH without the composition variable."""
    from ..mpit import COMPOSITION_CVAR, MpitError, Selector, composition_value, unavailable_reason

    label = f"{'composition' if composition else 'impl'}={name}"
    why = ("NCCL chooses its own algorithm" if transport == "nccl"
           else "the torch.distributed group's backend (gloo, NCCL) chooses its own algorithm"
           if transport == "torch" else unavailable_reason())
    if not why:
        if not composition:
            return Selector(name)
        try:
            return Selector(name, COMPOSITION_CVAR, composition_value(name))
        except MpitError as exc:
            why = str(exc)
    if label not in _warned:
        _warned.add(label)
        warnings.warn(f"native {label}: {why}; running the library's default allreduce "
                      "instead", RuntimeWarning, stacklevel=4)
    return None
