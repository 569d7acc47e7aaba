"""The one interface every allreduce algorithm implements, and the context it runs in.

An ``Algorithm`` subclass is built once per plan (message size, dtype, op, parameters): its
constructor does all set-up — ring orders, chunk offsets, scratch buffers — and ``run`` is
the hot loop. Algorithms never touch MPI, NCCL, NumPy or CuPy directly: they move data
with ``ctx.transport`` and compute with ``ctx.backend``, so one implementation serves
host and GPU buffers over every transport.

The class is also the single source of truth about the algorithm outside the hot loop:
``check_params`` (validation), ``search_space`` (what the tuner tries), ``cost`` and
``model_space`` (its time in ``autotune.model``'s α–β cost model, and the configurations
the model ranks), ``params_schema`` (its fragment of the profile's JSON Schema, built by
``collectives.profile.schema``) and, for algorithms that can run along one dimension of a
``hierarchical`` grid, ``grid_phase`` and ``grid_cost``. Every one has a working default,
so a new algorithm is one module: an algorithm that overrides nothing but ``run`` is
searched without parameters, modelled as one flat ring, and accepted in profiles with no
parameters.

The cost methods receive the model (``autotune.model.Model``) as an argument and use only
its phase primitives — ``ring_phase``, ``rhd_phase``, ``native_allreduce``, ``step`` /
``flow_terms``, ``reduce_time`` and ``n`` (ranks) — so ``collectives`` never imports
``autotune``. They return seconds per size as an array over ``sizes`` (bytes, NumPy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
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
        """Free the sub-contexts cached here (their transports and sub-communicators) and
        close what else has a ``close`` (shared-memory segments). Collective, like the
        ``Split`` that made them."""
        for value in self.cache.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(sub, Context):
                    sub.close()
                    sub.transport.close()
                    sub.comm.Free()
                elif callable(getattr(sub, "close", None)):
                    sub.close()  # a shared-memory segment (collectives.shm): unmap it
        self.cache.clear()


class Algorithm(ABC):
    """An allreduce algorithm, prepared for one (count, dtype, op, params).

    Subclasses set ``name`` and implement ``check_params`` and ``run``; they register with
    ``@register`` in ``collectives.algorithms``. ``op`` is one of sum/prod/min/max: the
    communicator turns ``avg`` into ``sum`` and divides afterwards — unless the class sets
    ``fuses_average``; it is then handed ``avg`` and divides by the world size itself.
    """

    #: Registry key; equals the module name and the name in profiles and the CLI.
    name: ClassVar[str] = ""
    #: Parameter names the algorithm accepts (for error messages and the CLI).
    param_names: ClassVar[tuple[str, ...]] = ()
    #: A diagnostic algorithm (the tests' ``sleep``, loaded through ``RINGTUNE_PLUGINS``):
    #: never searched unless named, not in the cost model's candidates, not in the
    #: generated profile schema.
    test_only: ClassVar[bool] = False
    #: Where the algorithm comes in lists for people (``ringtune simulate``'s columns, the
    #: schema's enum): lower first, then by name.
    display_order: ClassVar[int] = 100
    #: Where its configurations come in the cost model's candidates: lower first, then by
    #: name. Equal predictions rank the earlier candidate first (warm-start guesses).
    model_order: ClassVar[int] = 100
    #: Position among ``hierarchical``'s ``inner`` choices (lower first; the first is the
    #: tuner's first choice), or ``None`` when the algorithm cannot run along one grid
    #: dimension. An algorithm with a position implements ``grid_phase``; ``grid_cost``
    #: defaults to one flat ring.
    grid_dimension: ClassVar[int | None] = None
    #: Whether its ``grid_phase`` can run in a pipelined grid (``hierarchical``'s
    #: ``pipeline``): the phase object then also offers ``reduce_scatter_steps(buf)`` and
    #: ``all_gather_steps(buf)`` (generators of waits, ``algorithms.steps``), uses only
    #: point-to-point messages, and gives piece ``params["_piece"]`` tags no other piece
    #: uses on the same communicator.
    grid_pipelines: ClassVar[bool] = False
    #: Whether it takes ``op="avg"`` and divides itself (each element once, on the rank
    #: that owns it after the reduce-scatter, before the all-gather copies it: the bits of
    #: the communicator's division of the whole result, with 1/n of the work).
    fuses_average: ClassVar[bool] = False
    #: Whether its data path is host memory shared by ranks of one host (``shm``): the
    #: tuner leaves it out of searches over GPU buffers, and ``hierarchical`` offers it
    #: only along the dimension of ranks that share a host.
    intra_host_only: ClassVar[bool] = False

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

    @classmethod
    def search_space_on(cls, trial: Any, world_size: int, nbytes: int,
                        hosts: int) -> dict[str, Any]:
        """``search_space`` for a world spanning ``hosts`` hosts (what the tuner calls).
        Override it, not ``search_space``, for a parameter that matters only across hosts;
        the default ignores ``hosts``."""
        return cls.search_space(trial, world_size, nbytes)

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        """JSON Schema of a profile rule's ``params`` for this algorithm (an object schema;
        ``collectives.profile.schema`` adds the ``transport`` key every rule's params may carry).
        The default accepts exactly ``param_names``, any value each: ``check_params`` still
        judges the values when the profile loads. Override to let editors and other tools
        see the values' shapes too; keep it no stricter than ``check_params``."""
        return {"type": "object", "additionalProperties": False,
                "properties": {name: {} for name in cls.param_names}}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """Predicted seconds of one allreduce with ``params`` for each message size in
        ``sizes`` (a NumPy array of bytes) on the whole world of ``model`` (more than one
        rank: the model answers 0 for one rank itself). The default is the algorithm's
        ``grid_cost`` over the whole world: one flat ring (reduce-scatter plus all-gather,
        whole segments) unless the algorithm says otherwise — the honest guess for an
        algorithm that moves each byte 2(n−1)/n times in n−1 latency-bound steps."""
        return cls.grid_cost(model, 1, model.n, sizes, params)

    @classmethod
    def grid_cost(cls, model: Any, stride: int, d: int, region: Any,
                  params: Mapping[str, Any]) -> Any:
        """Seconds of a reduce-scatter plus all-gather of ``region`` bytes (array over
        sizes) along one grid dimension: ``d`` ranks, ``stride`` apart in grid positions.
        ``params`` are ``hierarchical``'s (``rings``, ``chunk_bytes``). Default: one ring
        with whole segments."""
        return (model.ring_phase(stride, d, region, 1, 0, True)
                + model.ring_phase(stride, d, region, 1, 0, False))

    @classmethod
    def model_space(cls, model: Any, sizes: Any
                    ) -> Iterable[tuple[dict[str, Any], Any]]:
        """The configurations the cost model ranks for this algorithm, each as ``(params,
        seconds per size)``. Params keys starting with ``_`` are the model's bookkeeping,
        resolved per size by ``concrete``. Default: the algorithm's default parameters."""
        yield {}, cls.cost(model, {}, sizes)

    @classmethod
    def concrete(cls, params: Mapping[str, Any], index: int) -> dict[str, Any]:
        """The runtime parameters of a ``model_space`` candidate at size index ``index``:
        by default the params without the ``_`` bookkeeping keys."""
        return {k: v for k, v in params.items() if not k.startswith("_")}

    @classmethod
    def grid_phase(cls, ctx: Context, offset: int, count: int, dtype: str, op: str,
                   params: Mapping[str, Any]) -> Any:
        """The algorithm's schedule on the region ``[offset, offset + count)`` along one
        dimension of a ``hierarchical`` grid (``ctx`` is that dimension's sub-context;
        ``params`` are ``hierarchical``'s): an object with ``reduce_scatter(buf)``,
        ``all_gather(buf)`` and ``owned`` (the ``(offset, count)`` this rank holds reduced
        after its reduce-scatter). Only algorithms with a ``grid_dimension`` implement it."""
        raise NotImplementedError(f"{cls.name} cannot run along one dimension of a grid")

    @abstractmethod
    def run(self, buf: Any) -> None:
        """Allreduce the flat buffer ``buf`` (``count`` elements) in place, on every rank."""


class HostAwareAlgorithm(Algorithm):
    """An algorithm whose search space depends on how many hosts the world spans: it
    overrides ``search_space_on``, and its ``search_space`` is that space on one host."""

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        return cls.search_space_on(trial, world_size, nbytes, 1)
