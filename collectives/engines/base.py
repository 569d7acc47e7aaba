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
    #: check (``collectives.training.exchange.check_thread_level``).
    thread_levels: ClassVar[bool] = False

    # -- what the CLI asks (``ringtune/engine.py``: ``--engine``, tune, bench, probe) ------

    #: ``--engine``'s help for it: how its ranks are started and what moves the bytes.
    cli_help: ClassVar[str] = ""
    #: The command that starts its ranks (``--engine``'s help: "torch under torchrun").
    launcher: ClassVar[str] = ""
    #: Whether the CLI starts this engine's ranks itself when no launcher did (``-np N``:
    #: ringtune relaunches under mpiexec); ``--engine auto`` without a launcher takes the
    #: first such engine. Others get their ranks from their own launcher.
    self_launches: ClassVar[bool] = False
    #: What the CLI can do over it beyond ``bench`` and a one-shape host ``tune``:
    #: ``tune --shapes``, ``tune --backend cupy``, ``probe --measure`` (MPI ping-pongs).
    tunes_shapes: ClassVar[bool] = False
    tunes_gpu: ClassVar[bool] = False
    measures_links: ClassVar[bool] = False
    #: Whether its native allreduce is an MPI library's (``library``: a profile records
    #: which, and a profile of another engine drops the record).
    native_library: ClassVar[bool] = False

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

    def detect(self) -> bool:
        """Whether this engine's launcher started this process (from the environment, never
        by initialising anything): ``--engine auto`` takes the first engine, in claim
        order, that says so."""
        return False

    def cli_refusal(self, verb: str, np: int | None) -> str | None:
        """Why the CLI's ``verb`` cannot run over this engine here (one line naming the fix:
        its launcher's environment missing, its library not installed, ``-np`` given to an
        engine that does not launch itself), else ``None``. Checked on every rank alike,
        before any communication."""
        return None

    def world(self, gpu: bool = False) -> Any:
        """The world communicator object of a CLI verb over this engine (``gpu``: GPU
        buffers will move). Raises ``ImportError`` when the engine's library cannot be
        loaded and ``WorldMismatchError`` when the launcher started another world."""
        raise NotImplementedError(f"the {self.name} engine does not run the CLI's verbs")

    def close_world(self) -> None:
        """End what ``world`` started (nothing by default)."""

    def retune_hint(self, size: int) -> str:
        """The command that tunes a profile for ``size`` ranks over this engine (in the
        message that sets a profile aside)."""
        return f"re-tune here over the {self.name} engine ({size} ranks in all)"

    # -- what a profile records (``autotune.choose``, ``collectives.online.document``) -----

    def version(self) -> str | None:
        """The engine's own version where the profile records it (``engine.version``)."""
        return None

    def library(self, gpu: bool = False) -> dict[str, str] | None:
        """The profile's ``library`` record: the MPI library (and NCCL for ``gpu``) whose
        native allreduce the choices were measured against; ``None`` where there is none."""
        return None

    def record(self, described: dict[str, str]) -> dict[str, str]:
        """The profile's ``engine`` record from what ``describe`` said: name, backend and,
        where the engine has one, its version."""
        out = {"name": self.name}
        if described.get("backend"):
            out["backend"] = described["backend"]
        version = self.version()
        if version:
            out["version"] = version
        return out
