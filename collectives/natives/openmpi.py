"""Open MPI: the allreduce algorithms of its ``coll/tuned`` component.

The list is read from the library: ``coll_tuned_allreduce_algorithm`` is an ``MPI_T`` enum
(5.0.x: 1 basic_linear, 2 nonoverlapping, 3 recursive_doubling, 4 ring, 5 segmented_ring,
6 rabenseifner; 6.0 adds 7 allgather_reduce; 0 "ignore" is the library's own decision).
Open MPI reads the variable (with ``coll_tuned_use_dynamic_rules``, which makes it count)
when a communicator is created, not on each call: a plan writes both through MPI_T,
``Dup``s its communicator, and restores them, so the duplicate runs that algorithm and
nothing else changes (``prepare``; the duplicate is freed with the plan's context). Its own
tuning file is the ``coll/tuned`` dynamic rules file (``ringtune export --format ompi``).
"""

from __future__ import annotations

import functools
from typing import Any

from .base import DEFAULT, NativeLibrary, register

ALGORITHM_CVAR = "coll_tuned_allreduce_algorithm"
DYNAMIC_CVAR = "coll_tuned_use_dynamic_rules"
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
        return list(self.table())

    def prepare(self, ctx: Any, impl: str) -> tuple[Any, list[Any]]:
        self.check_impl(impl)
        if impl == DEFAULT or ctx.size == 1:
            return ctx, []
        key = f"native.openmpi:{impl}"
        sub = ctx.cache.get(key)
        if sub is None:
            sub = _dup_with(ctx, self.table()[impl])
            ctx.cache[key] = sub
        return sub, []


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, int]:
    from ..mpit import MpitError
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


def _dup_with(ctx: Any, value: int) -> Any:
    """A context on a duplicate of ``ctx.comm`` created while algorithm ``value`` is
    forced (collective: every rank writes, duplicates, restores)."""
    import dataclasses

    from .base import binding

    mpit, _ = binding()
    assert mpit is not None  # _table() succeeded
    old_dyn = mpit.read_int(DYNAMIC_CVAR)
    old_alg = mpit.read_int(ALGORITHM_CVAR)
    mpit.write_int(DYNAMIC_CVAR, 1)
    try:
        mpit.write_int(ALGORITHM_CVAR, value)
        try:
            dup = ctx.comm.Dup()
        finally:
            mpit.write_int(ALGORITHM_CVAR, old_alg)
    finally:
        mpit.write_int(DYNAMIC_CVAR, old_dyn)
    # Closed (and the duplicate freed) by ``ctx.close()``, as every cached sub-context.
    return dataclasses.replace(ctx, comm=dup, transport=ctx.transport.sub(dup), cache={})
