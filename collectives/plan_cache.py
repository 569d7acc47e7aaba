"""A ``Communicator``'s plan cache: the plans it built, keyed by call, and how one is built.

``PlanCache`` is the part of ``collectives.communicator.Communicator`` that prepares plans
(the algorithm instance for a size, dtype, op, backend and choice, with its transport's
context) and caches them, so steady-state calls run only the hot loop. Its public members
(``cached_plan``, ``prepare_plan``, ``evict_plan``, ``clear_plans``, ``prepared``,
``default_transport``) are what online tuning and any caller that chooses its own plans use;
``Prepared`` is what it caches. A mixin: ``_plans``, ``_contexts`` and ``_transports`` are
the communicator's, made in its constructor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from .algorithms import Context, get_algorithm
from .backend import Backend, check_buffer_dtype
from .errors import require_agreement
from .ops import check_op
from .plan import Plan
from .plan import plan_key as _plan_key
from .profile import builtin_profile
from .registry import backend_for, make_transport
from .tensors import as_buffer

log = logging.getLogger("ringtune")


class Prepared:
    """A cached, executable plan: the algorithm instance and what ``run`` needs. Made by
    ``Communicator.prepare_plan`` (or ``prepared``), run by ``Communicator.run_prepared``."""

    __slots__ = ("plan", "algo", "run", "avg", "size", "backend")

    def __init__(self, plan: Plan, algo: Any, avg: bool, size: int, backend: Backend) -> None:
        self.plan = plan
        self.algo = algo
        self.run = algo.run
        self.avg = avg
        self.size = size
        self.backend = backend


class PlanCache:
    """Plans built once per call key and cached (a mixin of ``Communicator``)."""

    if TYPE_CHECKING:
        from .engines import Engine
        from .profile import Profile
        from .transport import Transport

        comm: Any
        engine: Engine
        rank: int
        size: int
        topology: Any
        hosts: tuple[int, ...]
        profile: Profile
        _plans: dict[Any, Prepared]
        _contexts: dict[tuple[str, str], Context]
        _transports: list[Transport]

        def plan_for(self, nbytes: int, tuned: bool = True) -> Plan: ...

        def explain(self, nbytes: int) -> str: ...

        def fail(self, exc: BaseException, plan: Plan, flat: Any) -> NoReturn: ...

    def prepared(self, buf: Any, op: str = "sum", algorithm: str | None = None,
                 transport: str | None = None, **params: Any) -> Prepared:
        """The cached executable plan ``allreduce`` would run for these arguments (for the
        benchmark harness and overhead measurements). Collective on first use."""
        arr = as_buffer(buf)
        backend = backend_for(arr)
        flat = backend.as_flat(arr)
        key = _plan_key(flat, op, backend, algorithm, transport, params)
        return self._plans.get(key) or self.prepare_plan(key, flat, backend, op, algorithm,
                                                     transport, params)

    def cached_plan(self, key: Any) -> Prepared | None:
        """The plan cached under ``key`` (a ``collectives.plan.plan_key``), ``None`` when
        there is none: look here before ``prepare_plan``, which always builds. Local."""
        return self._plans.get(key)

    def prepare_plan(self, key: Any, flat: Any, backend: Backend, op: str,
                     algorithm: str | None = None, transport: str | None = None,
                     params: Mapping[str, Any] | None = None) -> Prepared:
        """Build the plan for ``flat`` (a backend's flat view of the buffer), ``op`` and the
        choice (``algorithm`` ``None``: the profile's for the size; ``transport`` ``None``:
        the profile's or the default), and install it in the cache under ``key``, replacing
        what was there: later ``allreduce`` calls whose arguments give ``key`` run it.
        Collective (setting up may build sub-communicators and transports); bad input is a
        ``ValueError``/``TypeError`` alike on every rank, any other failure goes the way of
        ``fail``."""
        params = {} if params is None else params
        check_op(op)
        dtype = check_buffer_dtype(backend, flat.dtype)
        nbytes = int(flat.size) * int(flat.dtype.itemsize)
        if algorithm is None:
            if params:
                raise ValueError(
                    f"parameters {sorted(params)} given without algorithm=...: name the "
                    "algorithm they belong to"
                )
            chosen = self.plan_for(nbytes)
            prof_backend = getattr(self.profile, "backend", backend.name)
            if transport is None and prof_backend != backend.name:
                # The profile's transports were chosen for its own kind of buffer (a host
                # profile, like the built-in one, says 'mpi'): other buffers use theirs.
                transport = self.default_transport(backend)
            elif transport is None and not self.engine.runs_transport(chosen.transport):
                # A profile's transport of another engine (the built-in profile's 'mpi'
                # under torch): this engine's own for these buffers.
                transport = self.default_transport(backend)
            if transport is not None:
                chosen = Plan(chosen.algorithm, chosen.params, transport, chosen.source,
                              chosen.rule, chosen.min_bytes, chosen.max_bytes, chosen.measured)
            if (chosen.source == "default" and backend.on_gpu
                    and get_algorithm(chosen.algorithm).intra_host_only):
                # The defaults' host-memory choice (shm) is no choice for GPU buffers: the
                # defaults of a layout not known to be one host.
                _, rule = builtin_profile(self.size).select(nbytes)
                chosen = Plan(rule.algorithm, dict(rule.params), chosen.transport,
                              chosen.source, None, rule.min_bytes, rule.max_bytes)
        else:
            chosen = Plan(algorithm=algorithm, params=dict(params),
                          transport=transport or "", source="explicit")
        cls = get_algorithm(chosen.algorithm)
        with self._tuned_with(chosen):
            checked = cls.check_params(chosen.params, self.size)
        tname = chosen.transport or self.default_transport(backend)
        plan = Plan(chosen.algorithm, checked, tname, chosen.source, chosen.rule,
                    chosen.min_bytes, chosen.max_bytes, chosen.measured)
        # ``avg``: an algorithm that fuses it divides what it owns before its all-gather;
        # for the others this communicator sums and divides the whole result.
        divide_after = op == "avg" and not cls.fuses_average
        try:
            ctx = self._context(backend, tname)
            with self._tuned_with(chosen):
                algo = cls(ctx, int(flat.size), dtype, "sum" if divide_after else op, checked)
        except (ValueError, TypeError):
            raise  # bad input found alike on every rank (AgreementError is a ValueError)
        except Exception as exc:
            # Setting up may be collective (transports, sub-communicators): a failure
            # here can leave the other ranks waiting, as one inside ``run`` does.
            self.fail(exc, plan, flat)
        prepared = Prepared(plan, algo, divide_after, self.size, backend)
        self._plans[key] = prepared
        if log.isEnabledFor(logging.INFO) and self.rank == 0:
            log.info("allreduce %d B %s %s -> %s", nbytes, dtype, op, self.explain(nbytes)
                     if algorithm is None else f"{plan.algorithm} {plan.describe_params()}")
            log.debug("plan %d B %s %s: %s with %s over %s (source %s)", nbytes, dtype, op,
                      plan.algorithm, plan.describe_params() or "no parameters",
                      plan.transport, plan.source)
        return prepared

    def _tuned_with(self, chosen: Plan) -> Any:
        """``collectives.natives.tuned_with`` the profile's MPI library for a plan the
        profile chose (its ``native`` impl names are that library's); nothing for an
        explicit choice, which must be one of the running library's."""
        from .natives import tuned_with

        lib = self.profile.library if chosen.source != "explicit" else None
        return tuned_with(lib.name if lib is not None else None)

    def evict_plan(self, key: Any) -> None:
        """Drop the plan cached under ``key`` (its scratch buffers with it), if any: the
        next call with that key plans again. Local."""
        self._plans.pop(key, None)

    def default_transport(self, backend: Backend) -> str:
        """The transport for ``backend``'s buffers when neither the call nor (a profile of
        this engine) names one: the backend's own under MPI, the engine's elsewhere."""
        return self.engine.default_transport(self.comm, backend)

    def _context(self, backend: Backend, tname: str) -> Context:
        ctx = self._contexts.get((backend.name, tname))
        if ctx is None:
            if self.size > 1:
                # Ranks that picked different transports (e.g. CUDA-aware MPI detected on
                # some hosts only) would never match each other's messages: fail together.
                require_agreement(
                    self.comm.allgather(f"{backend.name}/{tname}"), "backends/transports",
                    "name the transport explicitly (transport=... or in the profile) or set "
                    "RINGTUNE_CUDA_AWARE the same on every host")
            transport = make_transport(tname, self.comm, backend)
            self._transports.append(transport)
            ctx = Context(comm=self.comm, backend=backend, transport=transport,
                          hosts=self.hosts, topology=self.topology,
                          world_ranks=tuple(range(self.size)))
            self._contexts[(backend.name, tname)] = ctx
        return ctx

    def clear_plans(self) -> None:
        """Drop cached plans (and their scratch buffers); the next call plans again. The
        tuner calls it between candidates so memory does not grow with every trial."""
        self._plans.clear()

