"""The one interface of a distributed engine: the runtime that a ``Communicator`` asks for
everything beyond moving an allreduce's bytes.

Use it where the runtime would otherwise call MPI by name: rank and size, the host name, the
small collectives of construction (``allgather``, ``bcast``, ``Barrier``), sub-groups
(``Split``), separate channels (``Dup``/``Free``), ending every rank (``abort``), the
exchange thread's precondition (``thread_levels``), timings' reductions (``allreduce_array``)
and which transports can move bytes over it. Two engines exist, one module each, registered
by name in ``collectives.engines.registry``: ``mpi`` (mpi4py communicators, and duck-typed
ones such as the tests' in-process world) and ``torch`` (``torch.distributed`` process
groups). ``engine_for(obj)`` picks the engine that claims an object.

The runtime keeps one *communicator object* per ``Communicator``: an mpi4py ``Comm`` (or an
object with its surface) for the ``mpi`` engine, a ``TorchComm`` with the same surface over a
process group for ``torch``. Algorithms see only that object's ``Split``/``Free`` and the
transport: they never know which engine moves their bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np


class Engine(ABC):
    """A distributed runtime ringtune runs over (see the module docstring)."""

    #: The engine's name: in ``--engine``, in a profile's ``engine`` record, in messages.
    name: ClassVar[str] = ""
    #: Where it comes when engines are asked to claim an object: lower first. The ``mpi``
    #: engine claims any mpi4py-like object, so it comes last.
    claim_order: ClassVar[int] = 100
    #: Whether its communicators have MPI thread levels that the exchange thread must
    #: check (``collectives.exchange.check_thread_level``).
    thread_levels: ClassVar[bool] = False

    @abstractmethod
    def claims(self, obj: Any) -> bool:
        """Whether ``obj`` (what a user passed to ``Communicator``) belongs to this engine.
        Must not import heavy modules: it runs for every engine on every construction."""

    def communicator(self, obj: Any) -> Any:
        """The mpi4py-like communicator object the runtime uses for ``obj`` (the ``mpi``
        engine: ``obj`` itself). Not collective."""
        return obj

    def check_world(self, comm: Any) -> None:
        """Refuse, on every rank and before any step, a communicator that cannot be the
        job's (``WorldMismatchError``/``ValueError`` naming both sizes and the fix)."""

    @abstractmethod
    def host_name(self, comm: Any) -> str:
        """This process's host name as its peers should see it (ranks with equal names
        share a host: ring orders and grids follow it)."""

    def world_rank(self, comm: Any) -> int | None:
        """This process's rank in the job's world where ``comm`` is a sub-group of it and
        the two differ (for error lines), else ``None``."""
        return None

    @abstractmethod
    def abort(self, comm: Any, code: int) -> None:
        """End every rank of the job with exit ``code`` (the line is already printed). On a
        real engine it does not return; ``abort_world`` ends this rank should it."""

    @abstractmethod
    def transports(self) -> tuple[str, ...]:
        """The transport names that can move bytes over this engine's communicators; an
        empty tuple means every registered one except other engines' own."""

    @abstractmethod
    def default_transport(self, comm: Any, backend: Any) -> str:
        """The transport for ``backend``'s buffers when neither the call nor the profile
        names one that this engine runs."""

    def runs_transport(self, name: str) -> bool:
        """Whether transport ``name`` moves bytes over this engine's communicators."""
        return name in self.transports()

    @abstractmethod
    def allreduce_array(self, comm: Any, arr: np.ndarray, op: str) -> None:
        """In-place allreduce of a small host array (timings, counts; op sum/prod/min/max)
        with the engine's own collective. Collective over ``comm``."""

    @abstractmethod
    def describe(self, comm: Any) -> dict[str, str]:
        """What a profile records of the engine behind ``comm``: ``{"engine": name,
        "backend": ...}`` (the MPI library's name, or the process group's backends, e.g.
        ``gloo`` or ``cpu:gloo,cuda:nccl``). Not collective."""
