"""The one interface every allreduce algorithm implements, and the context it runs in.

An ``Algorithm`` subclass is built once per plan (message size, dtype, op, parameters): its
constructor does all set-up — ring orders, chunk offsets, scratch buffers — and ``run`` is
the hot loop. Algorithms never touch MPI, NCCL, NumPy or CuPy directly: they move data
with ``ctx.transport`` and compute with ``ctx.backend``, so one implementation serves
host and GPU buffers over every transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..backend import Backend
from ..transport import Transport


@dataclass
class Context:
    """Where an algorithm runs: its communicator (possibly a sub-communicator of a grid),
    the backend of the buffer, the transport, and what is known of the rank layout."""

    comm: Any
    backend: Backend
    transport: Transport
    #: Host index of every rank of ``comm`` (ranks on one host share an index).
    hosts: tuple[int, ...] = ()
    #: ``probes.Topology`` of the world when known (for topology-aware ring orders).
    topology: Any = None
    #: Ranks of ``comm`` in terms of the world communicator's ranks (identity for the world).
    world_ranks: tuple[int, ...] = ()
    #: Cache shared by plans built on this context (ring orders, sub-contexts).
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def size(self) -> int:
        return self.transport.size

    def close(self) -> None:
        """Free the sub-contexts cached here (their transports and sub-communicators).
        Collective, like the ``Split`` that made them."""
        for value in self.cache.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, Context):
                    sub.close()
                    sub.transport.close()
                    sub.comm.Free()
        self.cache.clear()


class Algorithm(ABC):
    """An allreduce algorithm, prepared for one (count, dtype, op, params).

    Subclasses set ``name`` and implement ``check_params`` and ``run``; they register with
    ``@register`` in ``collectives.algorithms``. ``op`` is one of sum/prod/min/max: the
    communicator turns ``avg`` into ``sum`` and divides afterwards.
    """

    #: Registry key; equals the module name and the name in profiles and the CLI.
    name: ClassVar[str] = ""
    #: Parameter names the algorithm accepts (for error messages and the CLI).
    param_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, ctx: Context, count: int, dtype: str, op: str, params: Mapping[str, Any]
    ) -> None:
        self.ctx = ctx
        self.count = count
        self.dtype = dtype
        self.op = op
        self.params = dict(params)

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        """Validated parameters with defaults filled in. Raises ``ValueError`` naming the
        parameter, the value and the fix. Must not communicate: it runs before any
        communication, identically on every rank."""
        unknown = sorted(set(params) - set(cls.param_names))
        if unknown:
            accepted = ", ".join(cls.param_names) or "none"
            raise ValueError(
                f"algorithm {cls.name!r} has no parameter {unknown[0]!r} (accepted: {accepted})"
            )
        return dict(params)

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        """Suggest parameters from an Optuna ``trial`` (define-by-run) for a message of
        ``nbytes`` on ``world_size`` ranks. Parameter names passed to ``trial.suggest_*``
        must be prefixed with ``f"{cls.name}."`` so spaces of different algorithms do not
        collide. The default is an algorithm without parameters."""
        return {}

    @abstractmethod
    def run(self, buf: Any) -> None:
        """Allreduce the flat buffer ``buf`` (``count`` elements) in place, on every rank."""
