"""MPICH: its allreduce algorithms (``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``) and
compositions (``MPIR_CVAR_ALLREDUCE_COMPOSITION``), both set around each call through MPI_T
(``collectives.mpi.mpit``: MPICH reads them on every call, so no new communicator is needed),
and the cost model of its own selection and of each algorithm. Its own tuning file is the
collective-selection JSON (``ringtune export --format mpich``).

``native_algorithms()`` lists the allreduce algorithms the *installed* MPICH offers (read
at run time from the description of ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM``: MPICH exposes
that enum-like variable as a plain ``MPI_INT`` without an ``MPI_T_enum``, and numbers its
choices in the order the description lists them); ``selected(name)`` runs one allreduce
with that algorithm; ``read_cvar`` reads a variable for the export. The variable has scope
``MPI_T_SCOPE_ALL_EQ`` (writable at run time, the same value on every rank of a
collective), and MPICH reads it on every ``MPIR_Allreduce_impl`` call (the switch generated
by ``maint/gen_coll.py``), so writing it just before a call and restoring it just after
selects that call's algorithm without touching the user's other calls.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from .base import (
    DEFAULT,
    NativeLibrary,
    doubling_cost,
    halving_cost,
    reduce_bcast_cost,
    register,
    ring_cost,
)

ALGORITHM_CVAR = "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"
#: Choices that are not algorithms of their own or need a library this build may lack.
#: ``ccl`` runs an external CCL (absent from the PyPI wheel; MPICH falls back silently).
_NOT_CANDIDATES = ("auto", "ccl")
_CHOICE_RE = re.compile(r"^\s*([a-z][a-z0-9_]*)\s+-\s+\S")

#: MPICH's default MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: recursive doubling up to this size.
SHORT_BYTES = 2048
#: One hand-off of MPICH's intra-node reduce and bcast (POSIX ``release_gather``): a shared
#: buffer of MPIR_CVAR_{REDUCE,BCAST}_INTRANODE_BUFFER_TOTAL_SIZE (32768) bytes in
#: MPIR_CVAR_*_INTRANODE_NUM_CELLS (4) cells; a message crosses the host cell by cell.
SHM_CELLS = 4
SHM_CELL_BYTES = 32768 // SHM_CELLS


@register
class Mpich(NativeLibrary):
    """MPICH (and its ABI: the ``mpich`` wheel, MVAPICH, Cray MPICH report ``MPICH``)."""

    name = "MPICH"
    export_format = "mpich"
    #: MPICH's fixed selection by size, its node-aware composition (``default_cost``).
    cost_model = "mpich"
    version_re = r"MPICH Version:\s*(\S+)"
    mpit_scope_base = 60438
    compositions = ("auto", "alpha", "beta", "gamma", "delta")
    #: ``gamma`` needs a world on one node: across hosts MPICH replaces it with beta.
    searched_compositions = ("auto", "alpha", "beta", "delta")
    #: Beat MPICH's own default across hosts by 1.3-1.5x at >= 4 MiB on the emulated 2x2
    #: (BENCHMARKS.md), yet is one of ~44 native configurations there.
    flat_composition = "beta"

    def unavailable_reason(self) -> str:
        return unavailable_reason()

    def algorithms(self) -> list[str]:
        return native_algorithms()

    def check_impl(self, impl: str) -> None:
        if impl == DEFAULT:
            return
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
        self.check_impl(impl)
        return ctx, ([Selector(impl)] if impl != DEFAULT and ctx.size > 1 else [])

    # -- compositions -----------------------------------------------------------------

    def check_composition(self, name: str) -> None:
        super().check_composition(name)
        if name != DEFAULT and not unavailable_reason():
            from ..mpi.mpit import MpitError

            try:
                composition_value(name)  # ValueError naming this MPICH's compositions
            except MpitError:
                pass  # no such variable here: runs the default, warned at run time

    def compositions_searchable(self) -> bool:
        from ..mpi.mpit import MpitError

        if unavailable_reason():
            return False
        try:
            return len(compositions()) > 1
        except MpitError:
            return False

    def composition_selector(self, name: str) -> tuple[Any, str]:
        from ..mpi.mpit import MpitError

        why = unavailable_reason()
        if why:
            return None, why
        try:
            return Selector(name, COMPOSITION_CVAR, composition_value(name)), ""
        except MpitError as exc:
            return None, str(exc)

    # -- the cost model -----------------------------------------------------------------

    def default_cost(self, model: Any, stride: int, d: int, region: Any) -> Any:
        """MPICH's own selection (``MPIR_Allreduce_intra_recursive_doubling`` /
        ``_reduce_scatter_allgather``): recursive doubling up to
        MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 bytes), Rabenseifner above, at MPICH's
        per-message cost and reduction rate. Both malloc a temporary buffer of the whole
        message per call and receive into it: a slowest rank touches all of it (doubling,
        or a folded world) or 1 - 1/p of it (``Model.fresh_pages_time``)."""
        if d <= 1:
            return region * 0.0
        p = 1 << (d.bit_length() - 1)
        halving = halving_cost(model, stride, d, region)
        doubling = doubling_cost(model, stride, d, region)
        short = region <= SHORT_BYTES
        touched = np.where(short, region, region if d > p else region * (1.0 - 1.0 / p))
        return np.where(short, doubling, halving) + model.fresh_pages_time(region, touched)

    def impl_cost(self, model: Any, impl: str, stride: int, d: int, region: Any) -> Any:
        """MPICH's algorithms by their shape: recursive doubling (``recexch`` and
        ``recursive_multiplying`` at their default radix 2 are the same exchange),
        Rabenseifner (``reduce_scatter_allgather``, ``k_reduce_scatter_allgather`` at k=2),
        one ring, a binomial ``tree`` (reduce then bcast); each with the temporary buffer
        of the whole message. ``smp`` is the node-aware composition; ``nb`` (the
        non-blocking schedule, the same selection) and any other: the default."""
        if d <= 1:
            return region * 0.0
        fresh = model.fresh_pages_time(region, region)
        if impl in ("recursive_doubling", "recexch", "recursive_multiplying"):
            return doubling_cost(model, stride, d, region) + fresh
        if impl in ("reduce_scatter_allgather", "k_reduce_scatter_allgather"):
            return halving_cost(model, stride, d, region) + fresh
        if impl == "ring":
            return ring_cost(model, stride, d, region) + fresh
        if impl == "tree":
            return reduce_bcast_cost(model, stride, d, region) + fresh
        return self.default_cost(model, stride, d, region)

    def node_aware(self, model: Any) -> bool:
        """Whether MPICH's allreduce runs its node-aware composition here: more than one
        host and more than one rank per host.

        MPICH 5.0.2's ch4 selection (the JSON compiled into libmpi; older sources'
        ``maint/tuning/coll/ch4/generic.json`` took it only up to 32 KiB) takes, for a
        commutative op on a communicator that spans nodes,
        ``MPIDI_Allreduce_intra_composition_alpha`` at every size:
        intra-node reduce to the node's first rank, allreduce among those node leaders,
        intra-node bcast. Measured on 2 emulated hosts x 2 ranks, the default ran within
        0.95-1.08x of ``MPIR_CVAR_ALLREDUCE_COMPOSITION=1`` (alpha) at 1-64 MiB and
        1.37-1.68x slower than ``=2`` (the flat halving/doubling), BENCHMARKS.md."""
        c = model.cluster
        return c.host_levels == 1 and c.hosts > 1 and c.ranks_per_host > 1

    def node_aware_cost(self, model: Any, impl: str, sizes: Any) -> Any:
        """Composition alpha: the intra-node reduce, the node leaders' allreduce (``impl``
        applies to it), the intra-node bcast."""
        leaders = model.node_leaders()
        return (shm_cells_phase(model, sizes, True)
                + self.world_cost(leaders, impl, sizes)
                + shm_cells_phase(model, sizes, False))

    def composition_cost(self, model: Any, composition: str, impl: str, sizes: Any) -> Any:
        """``beta`` (and every composition where MPICH falls back to it: one host, one rank
        per host) flat over every rank; ``delta`` several leaders per host; ``alpha`` (and
        ``gamma``, MPICH's shared-memory-only composition) the node-aware one."""
        if composition == "beta" or not self.node_aware(model):
            return self.world_cost(model, impl, sizes)
        if composition == "delta":
            return _multi_leader_cost(self, model, impl, sizes)
        return self.node_aware_cost(model, impl, sizes)


def shm_cells_phase(model: Any, region: Any, reduce: bool) -> Any:
    """MPICH's intra-node reduce to the host's first rank (``reduce``) or bcast from it
    (POSIX ``release_gather``): the message crosses the host level in ``SHM_CELL_BYTES``
    cells. Each cell costs its bytes from every other rank of the host at the level's
    bandwidth, for the reduce the leader's reduction of what it received, and one hand-off
    between two processes through shared flags: the library's per-message software cost
    (``native_over``; a calibration from the probe takes half the small-message round trip
    on the fastest tier, ``autotune.calibrate``), not the level's wire latency, which the
    cells in flight (``SHM_CELLS``) overlap. Thousands of hand-offs are what make this
    slower than one large message (a 64 MiB bcast: 8192 cells)."""
    k = model.cluster.ranks_per_host
    if k <= 1 or model.cluster.host_levels != 1:  # no host level of its own to cross
        return np.zeros_like(region)
    terms = model.host_gather_terms()
    cells = np.maximum(1.0, np.ceil(region / SHM_CELL_BYTES))
    cell = region / cells
    latency = float(np.max(terms[:, 0]))
    t = model.step(terms, cell) - latency + model.native_over
    if reduce:
        t = t + model.reduce_time(cell * (k - 1), True)
    return cells * t


def _multi_leader_cost(lib: Mpich, model: Any, impl: str, sizes: Any) -> Any:
    """MPICH's composition delta (``MPIDI_Allreduce_intra_composition_delta``) with every
    rank of a host a leader: each of the host's k ranks leads 1/k of the message, so the
    host's data crosses the uplink once, in k concurrent leaders' allreduces of S/k that
    share it (modelled as the leaders' allreduce of S, the uplink's whole bandwidth),
    framed by an intra-host reduce to each part's leader and a bcast back, the k parts'
    cell phases concurrent (a phase of S/k each)."""
    leaders = model.node_leaders()
    k = max(1, model.n // max(1, leaders.n))
    return (shm_cells_phase(model, sizes / k, True)
            + lib.world_cost(leaders, impl, sizes)
            + shm_cells_phase(model, sizes / k, False))


@functools.lru_cache(maxsize=1)
def _mpit() -> tuple[Any, str]:
    """The bound MPI_T of MPICH, or (None, why not: another library, no MPI_T)."""
    try:
        from mpi4py import MPI  # noqa: F401 - the library is loaded (and initialised) here
    except ImportError as exc:
        return None, f"mpi4py is not importable ({exc})"
    from .base import binding, library

    name, version = library()
    if name != Mpich.name:
        return None, (f"{name} {version}".strip() + " is not MPICH: MPICH's allreduce "
                      "algorithms and compositions do not apply")
    return binding()


def unavailable_reason() -> str:
    """Empty when MPICH's algorithms can be selected per call; otherwise why not."""
    mpit, why = _mpit()
    if mpit is None:
        return why
    from ..mpi.mpit import MpitError

    try:
        _table()
    except MpitError as exc:
        return str(exc)
    return ""


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, int]:
    """Choice name → value of ``MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM`` in the installed MPICH.

    MPICH's generated cvar code numbers an enum cvar's choices in the order of its
    description (``auto`` first, value 0), one ``name - text`` line each; the test suite
    checks the numbering against the value MPICH itself reads from the environment."""
    from ..mpi.mpit import MpitError

    mpit, why = _mpit()
    if mpit is None:
        raise MpitError(why)
    desc, scope, writable, _ = mpit.info(ALGORITHM_CVAR)
    if not writable:
        raise MpitError(f"{ALGORITHM_CVAR} has scope {scope}: not writable at run time")
    names = [m.group(1) for m in map(_CHOICE_RE.match, desc.splitlines()) if m]
    if not names or names[0] != DEFAULT:
        raise MpitError(f"{ALGORITHM_CVAR}: cannot read its choices from the description "
                        f"(expected 'auto - ...' first, got {desc[:80]!r})")
    return {n: i for i, n in enumerate(names)}


def native_algorithms() -> list[str]:
    """The installed MPICH's allreduce algorithms worth searching (without ``auto``), in
    the library's order; empty without MPICH (see ``unavailable_reason``)."""
    if unavailable_reason():
        return []
    return [n for n in _table() if n not in _NOT_CANDIDATES]


def choice_value(name: str) -> int:
    """The cvar value of algorithm ``name``; ``ValueError`` naming the installed ones."""
    table = _table()
    if name not in table:
        raise ValueError(f"impl: {name!r} is not an allreduce algorithm of this MPICH "
                         f"(it has {', '.join(table)})")
    return table[name]


def current_algorithm() -> str:
    """The name of the algorithm MPICH would use now (``auto`` unless forced)."""
    value = _require().read_int(ALGORITHM_CVAR)
    for name, v in _table().items():
        if v == value:
            return name
    return str(value)


def _require() -> Any:
    mpit, why = _mpit()
    if mpit is None:
        from ..mpi.mpit import MpitError

        raise MpitError(why)
    return mpit


def Selector(name: str, cvar: str = ALGORITHM_CVAR, value: int | None = None) -> Any:
    """``collectives.mpi.mpit.Selector`` of MPICH algorithm ``name`` (or of ``value`` for another
    integer control variable ``cvar``): sets it around one call."""
    from ..mpi.mpit import Selector as CvarSelector

    return CvarSelector(name, cvar, choice_value(name) if value is None else value,
                        _require())


@contextmanager
def selected(name: str) -> Iterator[None]:
    """``with selected("ring"): comm.Allreduce(...)``: that call uses MPICH's ring."""
    if name == DEFAULT:
        yield
        return
    sel = Selector(name)
    sel.enter()
    try:
        yield
    finally:
        sel.exit()


#: MPICH ch4's choice of how an allreduce is composed of intra- and inter-node parts.
COMPOSITION_CVAR = "MPIR_CVAR_ALLREDUCE_COMPOSITION"
#: ``MPIR_CVAR_ALLREDUCE_COMPOSITION`` values by name, as MPICH's ``MPID_Allreduce``
#: (``src/mpid/ch4/src/ch4_coll.h``) switches on them: 0 its JSON selection; 1 alpha, the
#: intra-node reduce, the node leaders' allreduce, the intra-node bcast; 2 beta, the network
#: module's allreduce over every rank (a flat algorithm); 3 gamma, shared memory only (one
#: node); 4 delta, several leaders per node, each the leader of a part of the message. A
#: composition whose conditions fail (alpha on one node, gamma across nodes, delta on
#: unbalanced nodes) falls back to beta, silently under the default
#: ``MPIR_CVAR_COLLECTIVE_FALLBACK=silent``.
COMPOSITIONS = {"auto": 0, "alpha": 1, "beta": 2, "gamma": 3, "delta": 4}
assert tuple(COMPOSITIONS) == Mpich.compositions
#: The words of each value's line in the installed library's description (its check).
_COMPOSITION_WORDS = {1: "NM + SHM", 2: "NM only", 3: "SHM only", 4: "Multi leaders"}


@functools.lru_cache(maxsize=1)
def compositions() -> dict[str, int]:
    """The compositions this MPICH offers (``COMPOSITIONS``, checked against the installed
    library's description of the variable, which numbers them the same way);
    ``MpitError`` where MPI_T, the variable or a value is missing or not writable."""
    from ..mpi.mpit import MpitError

    desc, scope, writable, _ = _require().info(COMPOSITION_CVAR)
    if not writable:
        raise MpitError(f"{COMPOSITION_CVAR} has scope {scope}: not writable at run time")
    text = " ".join(desc.split())
    out = {"auto": 0}
    for name, value in COMPOSITIONS.items():
        if value and f"{value} {_COMPOSITION_WORDS[value]}" in text:
            out[name] = value
    if len(out) == 1:
        raise MpitError(f"{COMPOSITION_CVAR}: cannot read its values from the description "
                        f"({text[:80]!r})")
    return out


def composition_value(name: str) -> int:
    """The ``MPIR_CVAR_ALLREDUCE_COMPOSITION`` value of ``name``; ``ValueError`` naming the
    ones this MPICH has."""
    table = compositions()
    if name not in table:
        raise ValueError(f"composition: {name!r} is not an allreduce composition of this "
                         f"MPICH (it has {', '.join(table)})")
    return table[name]


def read_cvar(name: str) -> int | str:
    """The current value of an MPICH control variable (int or string), for the export."""
    from ..mpi.mpit import read_cvar as read

    return read(_require(), name)


def write_int_cvar(name: str, value: int) -> int:
    """Write an integer control variable; returns the previous value (tests restore it)."""
    mpit = _require()
    old = mpit.read_int(name)
    mpit.write_int(name, value)
    return old


