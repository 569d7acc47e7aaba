"""``hierarchical``: PowerAI DDL's multi-dimensional allreduce over a grid of ranks.

Use it on machines with tiers (GPUs in a host, hosts in a rack, racks): the ranks form a
grid ``dims`` (innermost first — dimension 0 is the ranks that share a host), the buffer
is reduce-scattered along dimension 0, then along dimension 1 on the shard each rank then
owns, and so on; the all-gathers run back in reverse order. Each tier's links carry only
the data that must cross that tier: the outer (slow) dimensions move 1/d₀ of the buffer.

Along each dimension an ``inner`` algorithm runs on a sub-communicator (``comm.Split``,
cached per context): any registered algorithm with a ``grid_dimension`` (its
``grid_phase`` is the schedule, its ``grid_cost`` the model's time); today:

- ``multiring`` (default): ``rings`` concurrent chunk-pipelined rings
  (``multiring.RingSchedule``); after its reduce-scatter rank *c* of the dimension owns
  block *c* of the region.
- ``rhd``: recursive halving then, on the way back, recursive doubling. A dimension that is
  not a power of two folds its extra ranks in first: a folded rank owns an empty shard (its
  outer dimensions have nothing to do) and gets the region back at the end.
- ``native`` (``native.NativePhase``): the library's own allreduce on the sub-communicator
  (DDL's ``n:`` mode) over the region, after which rank *c* keeps block *c* as its shard;
  the all-gather back is a ring all-gather (a transport offers no native all-gather). A
  full sub-allreduce moves more bytes than a reduce-scatter but uses the library's tuned
  code on that tier.

Every element is reduced exactly once, in a fixed order, on the rank that owns it after
the last reduce-scatter, and then only copied: results are bitwise identical on all ranks.
(With ``native``, ranks of a dimension may hold differently rounded sums of the region, but
only the owner's block travels on, and the all-gather overwrites the others.)

``dims`` may be ``"auto"`` (the default): ``[ranks per host, hosts]`` when every host holds
the same number of ranks and there are several hosts, else ``[world size]``.

``pipeline: P`` (default 1: the phases one after the other) cuts the buffer into P pieces,
each its own grid schedule with tags of its own, and runs them interleaved
(``steps.interleave``): piece k+1 starts its first reduce-scatter when piece k has finished
its own, and every piece is resumed as soon as its data arrives. So piece k's inter-host
transfer is in flight — the kernel's socket buffers keep the link busy, MPI progresses it
inside every call — while piece k+1 reduces inside the host and piece k−1 gathers there:
the tiers' phases overlap, and the time tends to the slowest tier's rather than the sum
(plus the pipeline's fill and drain, and P times the per-step costs). Use it where the
slow tier leaves the fast one idle (hosts over a network) and messages are large enough
that a piece is still bandwidth-bound; every ``inner`` must be one that pipelines
(``grid_pipelines``: multiring, rhd — not ``native``, whose collective calls could not
be interleaved in a different order on different ranks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from ..orders import host_grouped_order
from .base import Context, HostAwareAlgorithm
from .multiring import (
    CHUNK_BYTES_SCHEMA,
    MODEL_CHUNKS,
    RINGS_SCHEMA,
    balanced,
    check_chunk_bytes,
    check_rings,
    chunk_choices,
)
from .registry import get_algorithm, grid_algorithm_names, register
from .steps import Steps, interleave

#: Ring counts the cost model ranks for a grid (``model_space``; chunks as multiring's).
MODEL_RINGS: tuple[int, ...] = (1, 2, 4)
#: Most dimensions of the grids the cost model ranks.
MODEL_MAX_DIMS = 3
#: Most grid dimensions (a world of 2^22 ranks, the most a profile allows, has 22 of size 2).
MAX_DIMS = 24
#: Most pieces of a pipelined grid (tags: ``steps.TAG_STRIDE`` per piece stays far below
#: the 32767 every MPI allows).
MAX_PIPELINE = 64
#: Piece counts the tuner tries and the cost model ranks.
PIPELINE_CHOICES: tuple[int, ...] = (1, 2, 4, 8, 16, 32)


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


def check_pipeline(value: Any, inner: Any) -> int:
    """``pipeline`` parameter: pieces, 1..``MAX_PIPELINE``; above 1 every ``inner`` (a name,
    a list of names, or ``None`` = multiring) must be an algorithm that pipelines."""
    if (not isinstance(value, int) or isinstance(value, bool)
            or not 1 <= value <= MAX_PIPELINE):
        raise ValueError(f"pipeline: expected an integer 1..{MAX_PIPELINE} (pieces; 1 = no "
                         f"pipeline), got {value!r}")
    if value > 1 and inner is not None:
        names = [inner] if isinstance(inner, str) else list(inner)
        bad = [x for x in names if not get_algorithm(x).grid_pipelines]
        if bad:
            ok = [x for x in grid_algorithm_names() if get_algorithm(x).grid_pipelines]
            raise ValueError(f"pipeline: {value} pieces, but inner {bad[0]!r} cannot run "
                             f"pipelined; use pipeline: 1, or inner among {', '.join(ok)}")
    return value


def pipelined_cost(per_dim: Sequence[Any], pieces: int) -> Any:
    """Time of ``pieces`` pieces through the grid's dimensions, each dimension's links a
    stage (its reduce-scatter and all-gather of one piece, ``per_dim[j]``): one piece
    through every stage (fill and drain), then one piece per slowest stage."""
    total = sum(per_dim[1:], per_dim[0])
    if pieces == 1:
        return total
    import numpy as np

    return total + (pieces - 1) * np.max(np.stack(per_dim), axis=0)


def check_inner(value: Any, ndims: int | None) -> Any:
    """``inner`` parameter: ``None`` (``multiring`` everywhere), one name of
    ``grid_algorithm_names()`` for every dimension, or a list of one name per dimension.
    With ``ndims`` known, the result is ``None`` or a list of ``ndims`` names."""
    if value is None:
        return None
    if isinstance(value, str):
        inner = grid_algorithm_names()
        if value not in inner:
            raise ValueError(f"inner: {value!r} cannot run along a dimension; use one of "
                             f"{', '.join(inner)}")
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


@register
class Hierarchical(HostAwareAlgorithm):
    """Reduce-scatter along each grid dimension, then all-gather back; see the module
    docstring."""

    name = "hierarchical"
    param_names = ("dims", "rings", "chunk_bytes", "inner", "pipeline")
    display_order = 3
    model_order = 3
    fuses_average = True

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        inner = {"enum": grid_algorithm_names()}
        return {"type": "object", "additionalProperties": False, "properties": {
            "dims": {"anyOf": [{"const": "auto"},
                               {"type": "array", "minItems": 1, "maxItems": MAX_DIMS,
                                "items": {"type": "integer", "minimum": 1}}]},
            "rings": RINGS_SCHEMA,
            "chunk_bytes": CHUNK_BYTES_SCHEMA,
            "inner": {"anyOf": [{"type": "null"}, inner, {"type": "array", "items": inner}]},
            "pipeline": {"description": "pieces interleaved across the grid's dimensions "
                                        "(1: none; inner must pipeline)",
                         "type": "integer", "minimum": 1, "maximum": MAX_PIPELINE},
        }}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """The sum over the grid's dimensions of each one's ``inner`` ``grid_cost``
        (dimension j works on 1/(d0·…·dj−1) of the buffer); pipelined, the same on one
        piece plus, per further piece, the slowest dimension's (``pipelined_cost``)."""
        import numpy as np

        n = model.n
        dims = list(params.get("dims") or [n])
        if prod(dims) != n:
            raise ValueError(f"dims {dims}: product is not {n}")
        inner = params.get("inner") or ["multiring"] * len(dims)
        if isinstance(inner, str):
            inner = [inner] * len(dims)
        own = {"rings": int(params.get("rings", 1)),
               "chunk_bytes": int(params.get("chunk_bytes", 0))}
        pieces = int(params.get("pipeline", 1))
        per_dim = [get_algorithm(inner[j]).grid_cost(model, s, d, r, own)
                   for j, (s, d, r) in enumerate(dim_regions(dims, sizes / pieces))]
        return pipelined_cost(per_dim, pieces) + np.zeros_like(sizes)

    @classmethod
    def model_space(cls, model: Any, sizes: Any) -> Any:
        """Every grid of ``model_grids`` (more than one dimension: a flat grid is the flat
        algorithms), ``MODEL_RINGS`` × multiring's ``MODEL_CHUNKS`` × ``PIPELINE_CHOICES``;
        for each, the best ``inner`` per dimension, chosen per size and independently (the
        sum and the slowest of the dimensions' times both fall with each one's), as DDL's
        exploration mode did — among the inners that pipeline, when pipelined."""
        import numpy as np

        if model.n <= 1:
            return
        every = grid_algorithm_names()
        piped = [k for k in every if get_algorithm(k).grid_pipelines]
        dim_cache: dict[tuple[int, int, int, int, int], Any] = {}
        for dims in model_grids(model):
            if len(dims) == 1:
                continue
            for pieces in PIPELINE_CHOICES:
                inner = every if pieces == 1 else piped
                if not inner:
                    continue
                regions = dim_regions(dims, sizes / pieces)
                for rings in MODEL_RINGS:
                    for cb in MODEL_CHUNKS:
                        own = {"rings": rings, "chunk_bytes": cb}
                        per_dim = []
                        for s, d, r in regions:
                            # Grids share dimensions (same stride and size): compute once.
                            key = (s, d, rings, cb, pieces)
                            opts = dim_cache.get(key)
                            if opts is None:
                                opts = np.stack([get_algorithm(k).grid_cost(model, s, d, r,
                                                                            own)
                                                 for k in inner])
                                dim_cache[key] = opts
                            per_dim.append(opts)
                        total = pipelined_cost([o.min(axis=0) for o in per_dim], pieces)
                        params: dict[str, Any] = {"dims": dims, "rings": rings,
                                                  "chunk_bytes": cb}
                        if pieces > 1:
                            params["pipeline"] = pieces
                        yield {**params, "_per_dim": per_dim, "_inner": inner}, total

    @classmethod
    def concrete(cls, params: Mapping[str, Any], index: int) -> dict[str, Any]:
        """The grid's parameters with, per dimension, the ``inner`` fastest at this size."""
        import numpy as np

        out = super().concrete(params, index)
        per_dim = params.get("_per_dim")
        if per_dim is not None:
            names = params["_inner"]
            out["dims"] = list(out["dims"])
            out["inner"] = [names[int(np.argmin(opts[:, index]))] for opts in per_dim]
        return out

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
        inner = check_inner(p.get("inner"), ndims)
        out = {
            "dims": dims,
            "rings": check_rings(p.get("rings", 1)),
            "chunk_bytes": check_chunk_bytes(p.get("chunk_bytes", 0)),
            "inner": inner,
        }
        # Left out when 1, so that the profiles and trial keys of unpipelined grids stay
        # what they were.
        pieces = check_pipeline(p.get("pipeline", 1), inner)
        if pieces > 1:
            out["pipeline"] = pieces
        return out

    @classmethod
    def search_space_on(cls, trial: Any, world_size: int, nbytes: int,
                        hosts: int) -> dict[str, Any]:
        grids = ["x".join(map(str, g)) for g in factorisations(world_size)]
        dims = [int(d) for d in trial.suggest_categorical("hierarchical.dims", grids).split("x")]
        rings = trial.suggest_int("hierarchical.rings", 1, 4)
        seg = max(1, nbytes // max(1, world_size * rings))
        chunk = trial.suggest_categorical("hierarchical.chunk_bytes", chunk_choices(seg))
        every = grid_algorithm_names()
        # An inner that needs one host (shm) is offered only along a dimension whose
        # groups lie inside one host: the first dimensions, while the ranks they span so far
        # divide a host's ranks (all of them when the world is one host).
        outer = [k for k in every if not get_algorithm(k).intra_host_only]
        per_host = world_size // hosts if hosts > 1 and world_size % hosts == 0 else (
            world_size if hosts <= 1 else 1)
        inner, span = [], 1
        for j, d in enumerate(dims):
            span *= d
            inside = per_host % span == 0
            inner.append(trial.suggest_categorical(f"hierarchical.inner{j}",
                                                   every if inside else outer))
        out: dict[str, Any] = {"dims": dims, "rings": rings, "chunk_bytes": chunk,
                               "inner": inner}
        # Pipelining overlaps dimensions: searched on grids of several, when every inner
        # can be interleaved.
        if len(dims) > 1 and all(get_algorithm(k).grid_pipelines for k in inner):
            pieces = trial.suggest_categorical("hierarchical.pipeline", list(PIPELINE_CHOICES))
            if pieces > 1:
                out["pipeline"] = pieces
        return out

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        # ``avg`` (``fuses_average``): the phases sum; ``run`` divides what this rank owns.
        self.average = op == "avg"
        op = "sum" if self.average else op
        super().__init__(ctx, count, dtype, op, params)
        n = ctx.size
        hosts = ctx.hosts if len(ctx.hosts) == n else tuple(range(n))
        dims = self.params.get("dims", "auto")
        dims = auto_dims(hosts, n) if dims == "auto" else list(dims)
        check_dims(dims, n)
        inner = check_inner(self.params.get("inner"), len(dims)) or ["multiring"] * len(dims)
        # Validated before any communication, identically on every rank (hosts are shared).
        check_grid_fits_hosts(dims, hosts)
        pieces = check_pipeline(int(self.params.get("pipeline", 1)), inner)
        self.dims, self.inner = dims, inner
        self.trivial = n == 1 or count == 0
        #: Per piece, its phases (one per dimension); one piece unless pipelined. Pieces
        #: are contiguous and balanced; a buffer of fewer elements than pieces has fewer.
        self.pieces: list[list[Any]] = []
        if self.trivial:
            return
        subs = _sub_contexts(ctx, hosts, dims)
        for k, (offset, length) in enumerate(balanced(count, min(pieces, count))):
            params = {**self.params, "_piece": k} if pieces > 1 else self.params
            phases = []
            for j, sub in enumerate(subs):
                phase = get_algorithm(inner[j]).grid_phase(sub, offset, length, dtype, op,
                                                           params)
                phases.append(phase)
                offset, length = phase.owned
            self.pieces.append(phases)
        # Interleaved only over a transport that matches messages by tag and can poll;
        # elsewhere (nccl, staged) the pieces run one after another: correct, no overlap.
        self.pipelined = pieces > 1 and all(s.transport.interleaves for s in subs)

    def run(self, buf: Any) -> None:
        if self.trivial:
            return
        finish = self._divide_owned if self.average else None
        if not self.pipelined:
            for phases in self.pieces:
                for phase in phases:
                    phase.reduce_scatter(buf)
                if finish is not None:
                    finish(phases[-1], buf)
                for phase in reversed(phases):
                    phase.all_gather(buf)
            return
        interleave([_piece_steps(phases, buf, finish) for phases in self.pieces])

    def _divide_owned(self, last: Any, buf: Any) -> None:
        """``avg``: divide the block this rank owns after the last reduce-scatter — the sum
        over every rank — by the world size, before the all-gathers copy it out. The
        owned blocks partition the buffer (every inner's all-gather copies each owner's
        block to the others), so each element is divided once, on one rank, from the same
        sum: the bits of dividing the whole result afterwards, with 1/n of the work, and
        in a pipelined grid while other pieces are on the link."""
        o, length = last.owned
        if length:
            self.ctx.backend.divide(buf[o:o + length], self.ctx.size)


def _piece_steps(phases: Sequence[Any], buf: Any, finish: Any = None) -> Steps:
    """One piece of a pipelined grid: its reduce-scatters, innermost first, then
    ``finish(last phase, buf)`` if given (``avg``), then its all-gathers back. After the
    first reduce-scatter (the intra-host one) the next piece may start: piece k's outer
    phases then run while piece k+1 reduces inside the host."""
    for j, phase in enumerate(phases):
        yield from phase.reduce_scatter_steps(buf)
        if j == 0:
            yield None
    if finish is not None:
        finish(phases[-1], buf)
    for phase in reversed(phases):
        yield from phase.all_gather_steps(buf)


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


def dim_regions(dims: Sequence[int], sizes: Any) -> list[tuple[int, int, Any]]:
    """(stride, size, region bytes) per grid dimension: dimension j works on 1/(d0·…·dj−1)
    of the buffer, over ranks ``stride`` = d0·…·dj−1 apart."""
    out, stride = [], 1
    for d in dims:
        out.append((stride, d, sizes / stride))
        stride *= d
    return out


def model_grids(model: Any, max_dims: int = MODEL_MAX_DIMS) -> list[list[int]]:
    """The grids of ``model.n`` ranks the cost model ranks: at most ``max_dims``
    dimensions, none splitting a host of ``model.hosts``."""
    out = []
    for g in factorisations(model.n):
        if len(g) > max_dims:
            continue
        try:
            check_grid_fits_hosts(g, model.hosts)
        except ValueError:
            continue
        out.append(g)
    return out


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
