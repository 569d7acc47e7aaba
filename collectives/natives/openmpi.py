"""Open MPI: the allreduce algorithms of its ``coll/tuned`` component.

The list is read from the library: ``coll_tuned_allreduce_algorithm`` is an ``MPI_T`` enum
(5.0.x: 1 basic_linear, 2 nonoverlapping, 3 recursive_doubling, 4 ring, 5 segmented_ring,
6 rabenseifner; 6.0 adds 7 allgather_reduce; 0 "ignore" is the library's own decision).
Open MPI reads the variable (with ``coll_tuned_use_dynamic_rules``, which makes it count)
when a communicator is created, not on each call: a plan writes both through MPI_T,
``Dup``s its communicator, and restores them, so the duplicate runs that algorithm and
nothing else changes (``prepare``; the duplicate is freed with the plan's context). Its own
tuning file is the ``coll/tuned`` dynamic rules file (``ringtune export --format ompi``).

Across hosts Open MPI 5.0's default allreduce is not coll/tuned's but ``coll/han``'s (its
priority, 35, beats tuned's 30; han declines a communicator whose ranks share one host):
an intra-host reduce, the host leaders' allreduce, an intra-host bcast, pipelined in
64 KiB segments. ``impl=han`` duplicates with ``coll_han_priority`` raised (han wherever it
accepts the communicator; on one host it declines and tuned's own decision runs); a tuned
algorithm duplicates with han's priority below zero, so that algorithm runs across hosts
too. Where the han component is not loaded (``--mca coll ^han``), ``han`` is not offered
and asking for it is a ``ValueError`` naming it.

The cost model of its default (``default_cost``) is coll/tuned's fixed decision for
commutative ops in 5.0.x (``ompi_coll_tuned_allreduce_intra_dec_fixed`` in
``ompi/mca/coll/tuned/coll_tuned_decision_fixed.c``: the algorithm by communicator size and
message bytes, ``DECISION``), each algorithm by its shape (``impl_cost``), and across hosts
han's pipeline (``node_aware_cost``).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .base import (
    DEFAULT,
    NativeLibrary,
    doubling_cost,
    halving_cost,
    linear_cost,
    reduce_bcast_cost,
    register,
    ring_cost,
    tree_steps,
)

ALGORITHM_CVAR = "coll_tuned_allreduce_algorithm"
DYNAMIC_CVAR = "coll_tuned_use_dynamic_rules"
#: coll/han's priority (35 by default; below zero it declines every communicator).
HAN_PRIORITY_CVAR = "coll_han_priority"
HAN = "han"
#: Above every other coll component's default priority: han wherever it accepts.
HAN_FORCED_PRIORITY = 100
#: han's ``coll_han_allreduce_segsize``: the pipeline's segment.
HAN_SEGMENT_BYTES = 65536
#: coll/tuned's fixed decision for a commutative allreduce in Open MPI 5.0.x: per
#: communicator size below a bound (None: any larger), the algorithm below each message
#: size bound in bytes (None: any larger). 2 nonoverlapping, 3 recursive doubling, 4 ring,
#: 5 segmented ring (with the decision's segment size 0: the ring), 6 Rabenseifner.
DECISION: tuple[tuple[int | None, tuple[tuple[int | None, int], ...]], ...] = (
    (4, ((8, 4), (4096, 3), (8192, 4), (16384, 3), (65536, 4), (262144, 5), (None, 6))),
    (8, ((16, 4), (8192, 3), (None, 6))),
    (16, ((8192, 3), (None, 6))),
    (32, ((64, 5), (4096, 3), (None, 6))),
    (64, ((128, 5), (None, 6))),
    (128, ((262144, 3), (None, 6))),
    (256, ((131072, 2), (262144, 3), (None, 6))),
    (512, ((4096, 2), (None, 6))),
    (2048, ((2048, 2), (16384, 3), (None, 6))),
    (4096, ((2048, 2), (4096, 5), (16384, 3), (None, 6))),
    (None, ((2048, 2), (16384, 5), (32768, 3), (None, 6))),
)
#: Enum items that are not algorithms: the library's own decision.
_NOT_ALGORITHMS = ("ignore",)
#: The algorithms of Open MPI 5.0.x and 6.0 by number, where the library cannot say them
#: (reading a profile or a rules file without that library loaded).
KNOWN = {5: {"basic_linear": 1, "nonoverlapping": 2, "recursive_doubling": 3, "ring": 4,
             "segmented_ring": 5, "rabenseifner": 6}}
KNOWN[6] = {**KNOWN[5], "allgather_reduce": 7}


def known_algorithms(version: str) -> dict[str, int]:
    """Open MPI ``version``'s allreduce algorithms by name (as its releases define them);
    ``ValueError`` for a release ringtune does not know."""
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise ValueError(f"Open MPI version {version!r}: expected MAJOR.MINOR.PATCH") from None
    if major < 5:
        raise ValueError(f"Open MPI {version}: ringtune knows the coll/tuned algorithms of "
                         "5.0 and later only")
    return dict(KNOWN[min(major, max(KNOWN))])


@register
class OpenMpi(NativeLibrary):
    """Open MPI 5.0 and later."""

    name = "Open MPI"
    export_format = "ompi"
    cost_model = "openmpi"
    version_re = r"Open MPI v(\S+?),?\s"
    #: Open MPI's ``MPI_T_SCOPE_*`` are an enum in its ``mpi.h``, from 0.
    mpit_scope_base = 0

    def unavailable_reason(self) -> str:
        try:
            self.table()
        except (RuntimeError, ValueError) as exc:
            return str(exc)
        return ""

    def table(self) -> dict[str, int]:
        """Algorithm name -> value, read from the running library (``MpitError`` when it
        cannot say)."""
        return _table()

    def algorithms(self) -> list[str]:
        if self.unavailable_reason():
            return []
        return list(self.table()) + ([HAN] if han_available() else [])

    def algorithms_on(self, hosts: int) -> list[str]:
        """coll/tuned's algorithms; ``han`` too across hosts (on one host it declines and
        the library's own choice runs: a duplicate of ``auto``)."""
        return [a for a in self.algorithms() if a != HAN or hosts > 1]

    def check_impl(self, impl: str) -> None:
        if impl == HAN and not self.unavailable_reason() and not han_available():
            raise ValueError(f"impl: 'han' needs Open MPI's coll/han component, which this "
                             f"{self.label()} does not load (no {HAN_PRIORITY_CVAR}; "
                             "excluded with --mca coll ^han?); use one of "
                             f"{', '.join([DEFAULT, *self.algorithms()])}")
        super().check_impl(impl)

    def prepare(self, ctx: Any, impl: str) -> tuple[Any, list[Any]]:
        self.check_impl(impl)
        if impl == DEFAULT or ctx.size == 1:
            return ctx, []
        key = f"native.openmpi:{impl}"
        sub = ctx.cache.get(key)
        if sub is None:
            sub = _dup_with(ctx, None if impl == HAN else self.table()[impl])
            ctx.cache[key] = sub
        return sub, []

    # -- the cost model -----------------------------------------------------------------

    def default_cost(self, model: Any, stride: int, d: int, region: Any) -> Any:
        """coll/tuned's fixed decision (``DECISION``) at each size."""
        if d <= 1:
            return region * 0.0
        region = np.asarray(region, dtype=float)
        out = np.zeros_like(region)
        rows = next(r for bound, r in DECISION if bound is None or d < bound)
        lo = -1.0
        for top, alg in rows:
            hit = (region >= lo) if top is None else (region >= lo) & (region < top)
            if hit.any():
                out = np.where(hit, self._alg_cost(model, alg, stride, d, region), out)
            if top is None:
                break
            lo = float(top)
        return out

    def _alg_cost(self, model: Any, alg: int, stride: int, d: int, region: Any) -> Any:
        """coll/base's allreduce ``alg`` (its number), each with its temporary buffer of
        the whole message (the reduce's, for 1 and 2)."""
        fresh = model.fresh_pages_time(region, region)
        if alg == 1:
            return linear_cost(model, stride, d, region) + fresh
        if alg == 2:
            return reduce_bcast_cost(model, stride, d, region) + fresh
        if alg == 3:
            return doubling_cost(model, stride, d, region) + fresh
        if alg in (4, 5):
            return ring_cost(model, stride, d, region) + fresh
        return halving_cost(model, stride, d, region) + fresh

    def impl_cost(self, model: Any, impl: str, stride: int, d: int, region: Any) -> Any:
        """A forced coll/tuned algorithm by its shape (``allgather_reduce``, 6.0's, as
        recursive doubling: every rank reduces every buffer); ``han`` on a flat world (one
        host: it declines) is the default."""
        value = {**KNOWN[max(KNOWN)]}.get(impl)
        if value is None:
            return self.default_cost(model, stride, d, region)
        return self._alg_cost(model, 3 if value == 7 else value, stride, d, region)

    def node_aware(self, model: Any) -> bool:
        """han is the default wherever the world spans hosts (with one rank per host its
        intra-host parts are empty)."""
        c = model.cluster
        return c.host_levels == 1 and c.hosts > 1

    def node_aware_cost(self, model: Any, impl: str, sizes: Any) -> Any:
        """han's allreduce (``auto``, ``han``) in ``HAN_SEGMENT_BYTES`` segments, pipelined:
        each segment's intra-host binomial reduce, the leaders' allreduce (libnbc: a
        binomial reduce and bcast below 64 KiB or 4 hosts, else a ring), the intra-host
        binomial bcast; the segments overlap, so a message costs one pass of all three
        stages plus the slowest stage for every further segment. A forced coll/tuned
        algorithm runs with han declined: flat over every rank."""
        if impl not in (DEFAULT, HAN):
            return self.world_cost(model, impl, sizes)
        sizes = np.asarray(sizes, dtype=float)
        k = model.cluster.ranks_per_host
        leaders = model.node_leaders()
        h = leaders.n
        nseg = np.maximum(1.0, np.ceil(sizes / HAN_SEGMENT_BYTES))
        seg = sizes / nseg
        if k > 1:
            hop = (model.step(model.pair_terms(1, k, "mask", 1 << ((k - 1).bit_length() - 1)),
                              seg) + model.native_over)
            low_reduce = tree_steps(k) * (hop + model.reduce_time(seg, True))
            low_bcast = tree_steps(k) * hop
        else:
            low_reduce = low_bcast = np.zeros_like(seg)
        up = np.where((seg < HAN_SEGMENT_BYTES) | (h < 4),
                      reduce_bcast_cost(leaders, 1, h, seg), ring_cost(leaders, 1, h, seg))
        slowest = np.maximum(np.maximum(low_reduce, low_bcast), up)
        return low_reduce + up + low_bcast + (nseg - 1) * slowest


@functools.lru_cache(maxsize=1)
def han_available() -> bool:
    """Whether the running Open MPI loads coll/han (its priority variable exists)."""
    from ..mpi.mpit import MpitError
    from .base import binding

    mpit, _ = binding()
    if mpit is None:
        return False
    try:
        mpit.index(HAN_PRIORITY_CVAR)
    except MpitError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, int]:
    from ..mpi.mpit import MpitError
    from .base import binding

    mpit, why = binding()
    if mpit is None:
        raise MpitError(why)
    _, scope, writable, _, items = mpit.info_enum(ALGORITHM_CVAR)
    if not writable:
        raise MpitError(f"{ALGORITHM_CVAR} has scope {scope}: not writable at run time")
    if not items:
        raise MpitError(f"{ALGORITHM_CVAR}: the library lists no algorithms (no MPI_T enum)")
    mpit.info(DYNAMIC_CVAR)  # MpitError when coll/tuned is not loaded
    return {name: v for name, v in sorted(items.items(), key=lambda kv: kv[1])
            if name not in _NOT_ALGORITHMS and v > 0}


def _dup_with(ctx: Any, value: int | None) -> Any:
    """A context on a duplicate of ``ctx.comm`` created while coll/tuned algorithm
    ``value`` is forced and han declines (``None``: while han's priority is raised above
    every other component's); collective: every rank writes, duplicates, restores."""
    import dataclasses

    from .base import binding

    mpit, _ = binding()
    assert mpit is not None  # _table() succeeded
    writes: list[tuple[str, int]] = []
    if han_available():
        writes.append((HAN_PRIORITY_CVAR, HAN_FORCED_PRIORITY if value is None else -1))
    if value is not None:
        writes += [(DYNAMIC_CVAR, 1), (ALGORITHM_CVAR, value)]
    done: list[tuple[str, int]] = []
    try:
        for name, v in writes:
            done.append((name, mpit.read_int(name)))
            mpit.write_int(name, v)
        dup = ctx.comm.Dup()
    finally:
        for name, old in reversed(done):
            mpit.write_int(name, old)
    # Closed (and the duplicate freed) by ``ctx.close()``, as every cached sub-context.
    return dataclasses.replace(ctx, comm=dup, transport=ctx.transport.sub(dup), cache={})
