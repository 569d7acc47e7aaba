"""``hierarchical``: PowerAI DDL's multi-dimensional allreduce over a grid of ranks.

Use it on machines with tiers (GPUs in a host, hosts in a rack, racks): the ranks form a
grid ``dims`` (innermost first — dimension 0 is the ranks that share a host), the buffer
is reduce-scattered along dimension 0, then along dimension 1 on the shard each rank then
owns, and so on; the all-gathers run back in reverse order. Each tier's links carry only
the data that must cross that tier: the outer (slow) dimensions move 1/d₀ of the buffer.

Along each dimension an ``inner`` algorithm runs on a sub-communicator (``comm.Split``,
cached per context):

- ``multiring`` (default): ``rings`` concurrent chunk-pipelined rings
  (``multiring.RingSchedule``); after its reduce-scatter rank *c* of the dimension owns
  block *c* of the region.
- ``rhd``: recursive halving then, on the way back, recursive doubling. A dimension that is
  not a power of two folds its extra ranks in first: a folded rank owns an empty shard (its
  outer dimensions have nothing to do) and gets the region back at the end.
- ``native``: the library's own allreduce on the sub-communicator (DDL's ``n:`` mode) over
  the region, after which rank *c* keeps block *c* as its shard; the all-gather back is a
  ring all-gather (a transport offers no native all-gather). A full sub-allreduce moves
  more bytes than a reduce-scatter but uses the library's tuned code on that tier.

Every element is reduced exactly once, in a fixed order, on the rank that owns it after
the last reduce-scatter, and then only copied: results are bitwise identical on all ranks.
(With ``native``, ranks of a dimension may hold differently rounded sums of the region, but
only the owner's block travels on, and the all-gather overwrites the others.)

``dims`` may be ``"auto"`` (the default): ``[ranks per host, hosts]`` when every host holds
the same number of ranks and there are several hosts, else ``[world size]``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from ..orders import host_grouped_order
from .base import Algorithm, Context
from .multiring import RingSchedule, check_chunk_bytes, check_rings, chunk_choices
from .registry import register
from .rhd import RhdSchedule

#: Algorithms that can run along one dimension of the grid.
INNER: tuple[str, ...] = ("multiring", "rhd", "native")
#: Most grid dimensions (a world of 2^22 ranks, the most a profile allows, has 22 of size 2).
MAX_DIMS = 24


def check_dims(value: Any, world_size: int) -> list[int] | str:
    """``dims`` parameter: ``"auto"`` or a list of positive integers whose product is the
    world size. ``ValueError`` naming the value and the fix otherwise."""
    if value == "auto":
        return "auto"
    if (
        not isinstance(value, (list, tuple))
        or not value
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value)
    ):
        raise ValueError(
            f"dims: expected 'auto' or a list of positive integers (innermost first, e.g. "
            f"[4, 16, 4]), got {value!r}"
        )
    if len(value) > MAX_DIMS:
        raise ValueError(f"dims: {len(value)} dimensions; at most {MAX_DIMS} (a dimension of "
                         "size 1 does nothing: leave it out)")
    if prod(value) != world_size:
        raise ValueError(
            f"dims: {list(value)!r} has product {prod(value)}, but the world has {world_size} "
            f"ranks; give dims whose product is {world_size} (invalid dim size)"
        )
    return list(value)


def check_inner(value: Any, ndims: int | None) -> Any:
    """``inner`` parameter: ``None`` (``multiring`` everywhere), one name from ``INNER`` for
    every dimension, or a list of one name per dimension. With ``ndims`` known, the result
    is ``None`` or a list of ``ndims`` names."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in INNER:
            raise ValueError(f"inner: {value!r} cannot run along a dimension; use one of "
                             f"{', '.join(INNER)}")
        return value if ndims is None else [value] * ndims
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"inner: expected a list of algorithm names, got {value!r}")
    for x in value:
        check_inner(x, None)
    if ndims is not None and len(value) != ndims:
        raise ValueError(f"inner: {len(value)} names given for {ndims} dimensions; give one "
                         f"per dimension of dims")
    return list(value)


def auto_dims(hosts: Sequence[int], world_size: int) -> list[int]:
    """The default grid: ``[ranks per host, hosts]`` for a uniform multi-host layout, else
    one flat dimension."""
    if len(hosts) != world_size or world_size <= 1:
        return [max(1, world_size)]
    counts: dict[int, int] = {}
    for h in hosts:
        counts[h] = counts.get(h, 0) + 1
    per = set(counts.values())
    if len(counts) > 1 and len(per) == 1 and next(iter(per)) > 1:
        return [next(iter(per)), len(counts)]
    return [world_size]


def check_grid_fits_hosts(dims: Sequence[int], hosts: Sequence[int]) -> None:
    """``ValueError`` when the grid splits a host: for every dimension j, each group of
    ``dims[0] · … · dims[j]`` consecutive ranks (in host order) must lie inside one host or
    consist of whole hosts. Ranks of one host are placed together whatever their numbers."""
    n = len(hosts)
    if n == 0:
        return
    order = host_grouped_order(hosts)
    host_of_pos = [hosts[r] for r in order]
    size_of = Counter(hosts)
    block = 1
    for j, d in enumerate(dims):
        block *= d
        for start in range(0, n, block):
            members = host_of_pos[start:start + block]
            # Positions are grouped by host: equal ends mean the block lies inside one host.
            if members[0] == members[-1]:
                continue
            counts = Counter(members)
            partial = [h for h in counts if counts[h] != size_of[h]]
            if partial:
                first = partial[0]
                raise ValueError(
                    f"dims: {list(dims)!r} splits a host: the {block} ranks of grid "
                    f"dimensions 0..{j} starting at rank {order[start]} hold "
                    f"{counts[first]} of the {size_of[first]} ranks of host "
                    f"{first} together with other hosts' ranks; make dims[0] (times "
                    f"following dims) match the ranks per host "
                    f"({sorted(set(size_of.values()))})"
                )


class _NativePhase:
    """The library's allreduce of the region on the sub-communicator, then this rank keeps
    block *rank* of the region; the all-gather is a one-ring all-gather."""

    def __init__(self, ctx: Context, offset: int, count: int, dtype: str, op: str) -> None:
        self.ctx = ctx
        self.op = op
        self.offset, self.count = offset, count
        self.ring = RingSchedule(ctx, offset, count, dtype, op, 1, 0, "topology")
        self.owned = self.ring.owned
        self.trivial = ctx.size == 1 or count == 0

    def reduce_scatter(self, buf: Any) -> None:
        if not self.trivial:
            o = self.offset
            self.ctx.transport.native_allreduce(buf[o:o + self.count], self.op)

    def all_gather(self, buf: Any) -> None:
        self.ring.all_gather(buf)


@register
class Hierarchical(Algorithm):
    """Reduce-scatter along each grid dimension, then all-gather back; see the module
    docstring."""

    name = "hierarchical"
    param_names = ("dims", "rings", "chunk_bytes", "inner")

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        p = super().check_params(params, world_size)
        dims = check_dims(p.get("dims", "auto"), world_size)
        ndims = None if dims == "auto" else len(dims)
        if ndims is None and isinstance(p.get("inner"), (list, tuple)):
            # With dims 'auto' the number of dimensions is known only at run time (from the
            # hosts); a list of names could not be checked against it until every call.
            raise ValueError("inner: a list of names (one per dimension) needs dims; give "
                             "dims, or one name for every dimension (e.g. inner: rhd)")
        return {
            "dims": dims,
            "rings": check_rings(p.get("rings", 1)),
            "chunk_bytes": check_chunk_bytes(p.get("chunk_bytes", 0)),
            "inner": check_inner(p.get("inner"), ndims),
        }

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        grids = ["x".join(map(str, g)) for g in factorisations(world_size)]
        dims = [int(d) for d in trial.suggest_categorical("hierarchical.dims", grids).split("x")]
        rings = trial.suggest_int("hierarchical.rings", 1, 4)
        seg = max(1, nbytes // max(1, world_size * rings))
        chunk = trial.suggest_categorical("hierarchical.chunk_bytes", chunk_choices(seg))
        inner = [trial.suggest_categorical(f"hierarchical.inner{j}", list(INNER))
                 for j in range(len(dims))]
        return {"dims": dims, "rings": rings, "chunk_bytes": chunk, "inner": inner}

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        super().__init__(ctx, count, dtype, op, params)
        n = ctx.size
        hosts = ctx.hosts if len(ctx.hosts) == n else tuple(range(n))
        dims = self.params.get("dims", "auto")
        dims = auto_dims(hosts, n) if dims == "auto" else list(dims)
        check_dims(dims, n)
        inner = check_inner(self.params.get("inner"), len(dims)) or ["multiring"] * len(dims)
        # Validated before any communication, identically on every rank (hosts are shared).
        check_grid_fits_hosts(dims, hosts)
        self.dims, self.inner = dims, inner
        self.trivial = n == 1 or count == 0
        self.phases: list[Any] = []
        if self.trivial:
            return
        subs = _sub_contexts(ctx, hosts, dims)
        offset, length = 0, count
        for j, sub in enumerate(subs):
            kind = inner[j]
            if kind == "multiring":
                phase: Any = RingSchedule(sub, offset, length, dtype, op,
                                          self.params.get("rings", 1),
                                          self.params.get("chunk_bytes", 0), "topology")
            elif kind == "rhd":
                phase = RhdSchedule(sub, offset, length, dtype, op)
            else:
                phase = _NativePhase(sub, offset, length, dtype, op)
            self.phases.append(phase)
            offset, length = phase.owned

    def run(self, buf: Any) -> None:
        if self.trivial:
            return
        for phase in self.phases:
            phase.reduce_scatter(buf)
        for phase in reversed(self.phases):
            phase.all_gather(buf)


def factorisations(n: int) -> list[list[int]]:
    """Ordered factorisations of ``n`` into factors ≥ 2 (``[[1]]`` for n = 1), flat first:
    the grids the tuner tries."""
    if n <= 1:
        return [[1]]
    out: list[list[int]] = []

    def walk(rest: int, acc: list[int]) -> None:
        if rest == 1:
            out.append(list(acc))
            return
        for d in range(2, rest + 1):
            if rest % d == 0:
                walk(rest // d, acc + [d])

    walk(n, [])
    return sorted(out, key=len)


def _sub_contexts(ctx: Context, hosts: Sequence[int], dims: Sequence[int]) -> list[Context]:
    """One context per grid dimension: the sub-communicator of the ranks that differ from
    this rank only in that coordinate, ranked by the coordinate. Cached on ``ctx`` (a Split
    is collective and not free)."""
    key = f"hierarchical.sub:{tuple(dims)}"
    cached = ctx.cache.get(key)
    if cached is not None:
        return list(cached)
    order = host_grouped_order(hosts)  # grid position -> rank
    pos = order.index(ctx.rank)
    world = ctx.world_ranks if len(ctx.world_ranks) == ctx.size else tuple(range(ctx.size))
    subs: list[Context] = []
    stride = 1
    for d in dims:
        coord = (pos // stride) % d
        base = pos - coord * stride
        members = [order[base + c * stride] for c in range(d)]
        comm = ctx.comm.Split(base, coord)
        subs.append(Context(
            comm=comm, backend=ctx.backend, transport=ctx.transport.sub(comm),
            hosts=tuple(hosts[r] for r in members), topology=ctx.topology,
            world_ranks=tuple(world[r] for r in members)))
        stride *= d
    ctx.cache[key] = tuple(subs)
    return subs
