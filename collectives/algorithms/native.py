"""``native``: the communication library's own allreduce (MPI_Allreduce on host buffers,
NCCL allReduce on GPU buffers). The baseline every tuned choice must beat, and often the
best choice for small messages, where its latency-optimised algorithms win.

``impl`` picks one of the library's own algorithms for the call: on MPICH any choice of
``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` the installed library lists (``ring``, ``tree``,
``recursive_doubling``, …; ``collectives.mpit`` reads the list at run time and sets the
variable around each call). ``auto`` (the default) is the library's own selection. Another
MPI, or NCCL on GPU buffers, has only ``auto``: a profile naming an MPICH algorithm runs the
library's default there, with a warning saying so.
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
_warned: set[str] = set()


@register
class Native(Algorithm):
    """Delegate to ``transport.native_allreduce``, optionally with MPICH algorithm ``impl``."""

    name = "native"
    param_names = ("impl",)
    display_order = 0
    model_order = 0
    grid_dimension = 2

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False,
                "properties": {"impl": {
                    "description": "one of the library's own allreduce algorithms (MPICH's "
                                   "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM choices), or auto",
                    "type": "string", "pattern": _IMPL_RE.pattern}}}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """The library's allreduce as the model knows it: on MPICH across hosts with several
        ranks per host, its node-aware composition (``Model.node_aware_native``): the
        intra-node reduce, the node leaders' allreduce, the intra-node bcast (an ``impl``
        applies to the leaders' allreduce); elsewhere ``Model.native_allreduce``."""
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
        self._selector: Any = None
        if impl != "auto" and ctx.size > 1:
            self._selector = _selector(impl, getattr(ctx.transport, "name", ""))

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
        return out

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        from ..mpit import native_algorithms

        impls = ["auto", *native_algorithms()]
        if len(impls) == 1:
            return {}
        impl = trial.suggest_categorical("native.impl", impls)
        return {} if impl == "auto" else {"impl": impl}

    def run(self, buf: Any) -> None:
        if self.count == 0 or self.ctx.size == 1:
            return
        sel = self._selector
        if sel is None:
            self.ctx.transport.native_allreduce(buf, self.op)
            return
        sel.enter()
        try:
            self.ctx.transport.native_allreduce(buf, self.op)
        finally:
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


def _selector(impl: str, transport: str) -> Any:
    """The ``mpit.Selector`` for ``impl``, or None (with one warning) where the library's
    algorithms cannot be chosen: NCCL on GPU buffers, or an MPI other than MPICH."""
    from ..mpit import Selector, unavailable_reason

    why = ("NCCL chooses its own algorithm" if transport == "nccl"
           else unavailable_reason())
    if not why:
        return Selector(impl)
    if impl not in _warned:
        _warned.add(impl)
        warnings.warn(f"native impl={impl}: {why}; running the library's default allreduce "
                      "instead", RuntimeWarning, stacklevel=4)
    return None
