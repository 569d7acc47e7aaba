"""MPICH: its allreduce algorithms (``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``) and
compositions (``MPIR_CVAR_ALLREDUCE_COMPOSITION``), both set around each call through MPI_T
(``collectives.mpit``: MPICH reads them on every call, so no new communicator is needed).
Its own tuning file is the collective-selection JSON (``ringtune export --format mpich``).
"""

from __future__ import annotations

from typing import Any

from .base import DEFAULT, NativeLibrary, register


@register
class Mpich(NativeLibrary):
    """MPICH (and its ABI: the ``mpich`` wheel, MVAPICH, Cray MPICH report ``MPICH``)."""

    name = "MPICH"
    export_format = "mpich"
    #: MPICH's fixed selection by size, its node-aware composition (``autotune.model``).
    cost_model = "mpich"

    def unavailable_reason(self) -> str:
        from ..mpit import unavailable_reason

        return unavailable_reason()

    def algorithms(self) -> list[str]:
        from ..mpit import native_algorithms

        return native_algorithms()

    def check_impl(self, impl: str) -> None:
        if impl == DEFAULT:
            return
        from ..mpit import choice_value, native_algorithms

        if self.unavailable_reason():
            super().check_impl(impl)  # names why nothing can be chosen
        choice_value(impl)  # ValueError naming the installed algorithms
        if impl not in native_algorithms():
            # In MPICH's list, but needs a library this build lacks (``ccl``): MPICH would
            # silently run another algorithm than the profile says.
            raise ValueError(f"impl: {impl!r} needs a library this MPICH was built without "
                             f"(it would run another algorithm); use one of auto, "
                             f"{', '.join(native_algorithms())}")

    def prepare(self, ctx: Any, impl: str) -> tuple[Any, list[Any]]:
        from ..mpit import Selector

        self.check_impl(impl)
        return ctx, ([Selector(impl)] if impl != DEFAULT and ctx.size > 1 else [])
