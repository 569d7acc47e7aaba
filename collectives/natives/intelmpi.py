"""Intel MPI: it runs (``ringtune[impi]``, its Hydra launcher), with its default allreduce
only (``native impl=auto``), said once.

Why no algorithm can be chosen per call: Intel MPI fixes its allreduce selection at
``MPI_Init``, from ``I_MPI_ADJUST_ALLREDUCE`` (an algorithm id, optionally by message size,
e.g. ``8:0-65536;1``). Its MPI_T does list that setting, as ``MPIR_CVAR_USE_ALLREDUCE``
(scope ALL_EQ, writable, "range: 0-32"), but a write changes nothing afterwards, not even
on a communicator created after it (``Dup``). Measured with 2021.18.1 on 3 ranks by the bits
of a float32 sum, which depend on the order of the reduction: ids 3, 8 and 16 set in the
environment at launch each give other bits than the default; the same ids written through
MPI_T, before a call or before a ``Dup``, always give the default's. ringtune's tuner tries
every candidate inside one job, so it cannot try these; a job can still set
``I_MPI_ADJUST_ALLREDUCE`` for its whole run, which ``native`` then runs.
"""

from __future__ import annotations

from .base import NativeLibrary, register


@register
class IntelMpi(NativeLibrary):
    """Intel MPI (``MPI.Get_library_version()``: "Intel(R) MPI Library 2021.18.1 ...")."""

    name = "Intel MPI"
    version_re = r"Intel\(R\) MPI Library (\S+)"
    chooses_per_call = False

    def unavailable_reason(self) -> str:
        return (f"{self.label()} chooses its allreduce algorithm once, at MPI_Init "
                "(I_MPI_ADJUST_ALLREDUCE), not per call: native runs its default allreduce "
                "only (impl=auto)")
