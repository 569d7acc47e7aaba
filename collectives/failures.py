"""What a ``Communicator`` does when a call fails on one rank while its peers may wait.

``Failures`` is the part of ``collectives.communicator.Communicator`` that hands a failure
to the caller (one rank, or ``RINGTUNE_ON_ERROR=raise``) or ends every rank with a line
naming this one (``collectives.plumbing.abort``), and checks per call, under
``RINGTUNE_CHECK=1``, that every rank passed the same arguments. A mixin: ``comm`` and
``size`` are the communicator's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from .errors import PeerFailure, require_agreement
from .plan import Plan
from .plumbing.abort import abort_world, on_error_mode, rank_line


class Failures:
    """A failing call's way out, alike on every rank (a mixin of ``Communicator``)."""

    if TYPE_CHECKING:
        comm: Any
        size: int

    @property
    def raises_failures(self) -> bool:
        """Whether a failure inside a call goes to the caller (one rank has no peers to
        leave waiting; ``RINGTUNE_ON_ERROR=raise``) rather than ending every rank."""
        return self.size == 1 or on_error_mode() == "raise"

    def fail(self, exc: BaseException, plan: Plan, flat: Any) -> NoReturn:
        """This rank failed running or preparing ``plan`` on ``flat`` where its peers may
        be waiting for it: raise ``exc`` to the caller where ``raises_failures``, else end
        every rank with a line naming this one (``collectives.plumbing.abort``). Use it in the
        ``except`` of any call that runs a plan outside ``allreduce``."""
        if self.raises_failures:
            raise exc
        nbytes = int(flat.size) * int(flat.dtype.itemsize)
        what = plan.algorithm + (f" ({plan.describe_params()})" if plan.params else "")
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        kind = type(exc).__name__
        if type(exc).__module__.startswith("torch"):
            kind = "torch." + kind
        if type(exc).__module__.startswith("mpi4py"):
            kind = "MPI." + kind
            if "MPI_ERROR field" in first:  # MPI_ERR_IN_STATUS: the detail is per request
                first = ("a send or receive failed (MPI_ERR_IN_STATUS; usually a message "
                         "larger than its receive buffer)")
        if isinstance(exc, PeerFailure):
            # A peer died or went silent and the message names it: advice on the call's
            # arguments would send the reader after the wrong cause.
            why = "the rank it names is gone or silent"
        else:
            why = ("every rank must call allreduce with the same size, dtype, op and choice: "
                   "RINGTUNE_CHECK=1 checks it")
        abort_world(self.comm, rank_line(
            self.comm, f"allreduce of {nbytes} B with {what} failed: {kind}: {first}; ending "
            f"every rank ({why}; RINGTUNE_ON_ERROR=raise hands such failures to the caller)"))

    def _check_agreement(self, key: Any) -> None:
        """RINGTUNE_CHECK=1: every rank passed the same size, dtype, op and choice."""
        require_agreement(
            self.comm.allgather(repr(key)),
            "allreduce arguments (size, dtype, op, backend, algorithm, transport, params)",
            "every rank must call allreduce with the same arguments in the same order")

