"""``multiring``: several rings at once, each a reduce-scatter then an all-gather.

The buffer is cut into one block per rank, each block into ``rings`` pieces; ring *k*
reduces piece *k* of every block over its own rank order, so concurrent rings load
different links (PowerAI DDL's multi-ring). Every step's piece is cut into chunks of
``chunk_bytes``, and the loop is a chunk-level pipeline: as soon as chunk *c* of a step has
arrived and been reduced, it is sent on for the next step, while later chunks are still in
flight — so reduction overlaps transfer and no rank waits for a whole segment.

Block *b* always ends on rank *b*, whatever the ring order: after the reduce-scatter each
rank owns one contiguous block (what ``hierarchical`` builds its grid on). Each element
is reduced once along the ring and then copied, so results are bitwise identical on all
ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ops import itemsize as dtype_itemsize
from ..orders import ring_orders, validate_order
from .base import Algorithm, Context
from .registry import register
from .steps import TAG_STRIDE, Steps, run_blocking

MAX_RINGS = 16
#: ``chunk_bytes`` range: 0 (whole segment) or a power of two up to 1 TiB (larger behaves as
#: 0 on any real buffer; the bound keeps sizes within what NumPy and the plans handle).
MAX_CHUNK_BYTES = 1 << 40
#: Most chunks one rank's block is cut into per step, all rings together. A chunk is at
#: least ``block / MAX_BLOCK_CHUNKS`` (and one element), whatever ``chunk_bytes`` says:
#: each chunk costs a send, a receive and bookkeeping, so this keeps an allreduce's time and
#: memory proportional to its message (``chunk_bytes: 1`` on 300,000 float32 once made 10⁶
#: messages, 11-56 s and 800 MB) while tiny chunks still pipeline small messages.
MAX_BLOCK_CHUNKS = 1024
#: Ring counts and chunk sizes the cost model ranks (``model_space``): a coarse subset of
#: the searched ones (``chunk_choices``; 0 = whole segment), since the model ranks whole
#: families of configurations one array of sizes at a time.
MODEL_RINGS: tuple[int, ...] = (1, 2, 4, 8)
MODEL_CHUNKS: tuple[int, ...] = (0, 1 << 18, 1 << 20, 1 << 22)

#: JSON Schema fragments of the parameters (``hierarchical`` shares them).
RINGS_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_RINGS}
CHUNK_BYTES_SCHEMA: dict[str, Any] = {
    "description": "0 (whole segment) or a power of two up to 2^40; a chunk is at least "
                   f"one element and 1/{MAX_BLOCK_CHUNKS} of a rank's block (all rings "
                   "together), so a small value costs at most that many messages per step",
    "enum": [0] + [1 << k for k in range(MAX_CHUNK_BYTES.bit_length())]}
ORDER_SCHEMA: dict[str, Any] = {"anyOf": [
    {"enum": ["topology", "identity"]},
    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    {"type": "array", "minItems": 1,
     "items": {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}},
]}


def balanced(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` (offset, length) pieces of ``count`` elements, lengths differing by ≤ 1."""
    base, rem = divmod(count, parts)
    out, off = [], 0
    for i in range(parts):
        ln = base + (1 if i < rem else 0)
        out.append((off, ln))
        off += ln
    return out


def _chunks(off: int, length: int, chunk: int) -> list[tuple[int, int]]:
    """[start, stop) element ranges of ``chunk`` elements covering the piece."""
    return [(a, min(a + chunk, off + length)) for a in range(off, off + length, chunk)]


def check_rings(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RINGS:
        raise ValueError(f"rings: expected an integer 1..{MAX_RINGS}, got {value!r}")
    return value


def chunk_choices(segment_bytes: int, block_bytes: int | None = None) -> list[int]:
    """The ``chunk_bytes`` values worth searching for a segment of ``segment_bytes``: 0
    (the whole segment) and the powers of two from 16 KiB up to 64 MiB that are smaller than
    the segment (a larger chunk behaves as 0) and not below the smallest chunk a block of
    ``block_bytes`` (default: the segment) is cut into (``min_chunk_bytes``: a smaller one
    behaves as that one)."""
    floor = min_chunk_bytes(segment_bytes if block_bytes is None else block_bytes, 1)
    return [0] + [1 << k for k in range(14, 27)
                  if floor <= (1 << k) < segment_bytes]


def min_chunk_bytes(block_bytes: int, itemsize: int) -> int:
    """The smallest chunk a block of ``block_bytes`` is cut into: one element, and
    ``1/MAX_BLOCK_CHUNKS`` of the block."""
    return max(itemsize, -(-block_bytes // MAX_BLOCK_CHUNKS))


def chunk_elements(chunk_bytes: int, itemsize: int, block: int, rings: int) -> int:
    """Elements per chunk of a ring's piece: ``chunk_bytes`` (0: the whole piece), at least
    one element and ``block / MAX_BLOCK_CHUNKS`` elements (``block``: the largest rank's
    block in elements, all ``rings`` together)."""
    piece = -(-block // rings)
    if not chunk_bytes:
        return max(1, piece)
    return max(1, chunk_bytes // itemsize, -(-block // MAX_BLOCK_CHUNKS))


def check_chunk_bytes(value: Any) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not 0 <= value <= MAX_CHUNK_BYTES
        or (value and value & (value - 1))
    ):
        raise ValueError(
            f"chunk_bytes: expected 0 (whole segment) or a power of two up to 2^40, got "
            f"{value!r}"
        )
    return value


class _Ring:
    """One ring's precomputed schedule: peers, tag, and per step the chunk ranges."""

    __slots__ = ("nxt", "prv", "tag", "recv", "send", "scratch", "slot")

    def __init__(self, perm: list[int], rank: int, k: int, pieces: list[tuple[int, int]],
                 chunk: int, steps: int) -> None:
        n = len(perm)
        pos = perm.index(rank)
        self.nxt = perm[(pos + 1) % n]
        self.prv = perm[(pos - 1) % n]
        self.tag = 100 + k  # k: ring index, plus TAG_STRIDE per piece of a pipelined grid
        # Step t receives block perm[pos-t-2] and sends block perm[pos-t-1] (indices mod n):
        # the same formula holds through the reduce-scatter (t < n-1) and the all-gather.
        self.recv = [_chunks(*pieces[perm[(pos - t - 2) % n]], chunk) for t in range(steps)]
        self.send = [_chunks(*pieces[perm[(pos - t - 1) % n]], chunk) for t in range(steps)]
        self.scratch: Any = None
        self.slot = chunk


class RingSchedule:
    """The chunk-pipelined multi-ring schedule on one region ``[offset, offset + count)`` of
    the buffer, over the ranks of ``ctx``; built once, run many times.

    Steps ``0 .. n-2`` are the reduce-scatter, ``n-1 .. 2n-3`` the all-gather. ``run(buf)``
    runs them all (``multiring``); ``reduce_scatter(buf)`` and ``all_gather(buf)`` run one
    phase each, so that ``hierarchical`` can reduce-scatter along one grid dimension, work on
    the shard this rank then owns (``owned``: block *rank* of the region, whatever the ring
    order), and all-gather later. ``reduce_scatter_steps`` / ``all_gather_steps`` are the
    same phases as generators of waits (``steps``), for a pipelined grid that interleaves
    pieces; ``piece`` gives such a piece tags of its own.
    """

    def __init__(self, ctx: Context, offset: int, count: int, dtype: str, op: str,
                 rings: int, chunk_bytes: int, order: Any, piece: int = 0) -> None:
        self.ctx = ctx
        self.op = op
        n = ctx.size
        blocks = [(offset + o, ln) for o, ln in balanced(count, n)]
        self.owned: tuple[int, int] = blocks[ctx.rank]
        self.trivial = n == 1 or count == 0
        self.steps = 2 * (n - 1)
        self.rings: list[_Ring] = []
        if self.trivial:
            return
        itemsize = dtype_itemsize(dtype)
        maxblock = max(ln for _, ln in blocks)
        maxpiece = -(-maxblock // rings)
        chunk = chunk_elements(chunk_bytes, itemsize, maxblock, rings)
        perms = ring_orders(order, rings, n, ctx.hosts, ctx.topology, ctx.world_ranks)
        for k, perm in enumerate(perms):
            pieces = [(off + o, ln) for off, blen in blocks
                      for o, ln in [balanced(blen, rings)[k]]]
            ring = _Ring(perm, ctx.rank, TAG_STRIDE * piece + k, pieces, chunk, self.steps)
            ring.scratch = ctx.backend.empty(maxpiece, dtype)
            self.rings.append(ring)
        self.maxc = [max(len(r.recv[t]) for r in self.rings) for t in range(self.steps)]

    def reduce_scatter(self, buf: Any) -> None:
        """Steps 0..n-2: afterwards ``buf[owned]`` holds the reduction over these ranks."""
        self.run(buf, 0, self.steps // 2)

    def all_gather(self, buf: Any) -> None:
        """Steps n-1..2n-3: every rank's ``owned`` block is copied to all ranks."""
        self.run(buf, self.steps // 2, self.steps)

    def reduce_scatter_steps(self, buf: Any) -> Steps:
        """``reduce_scatter`` as a generator of waits."""
        return self.run_steps(buf, 0, self.steps // 2)

    def all_gather_steps(self, buf: Any) -> Steps:
        """``all_gather`` as a generator of waits."""
        return self.run_steps(buf, self.steps // 2, self.steps)

    def _post(self, ring: _Ring, t: int, c: int, buf: Any) -> Any:
        """Post batch (t, c): send chunk c of step t's send block, receive chunk c of step t's
        receive block (into scratch during the reduce-scatter, into ``buf`` after)."""
        sends, recvs = [], []
        if c < len(ring.send[t]):
            a, b = ring.send[t][c]
            sends.append((buf[a:b], ring.nxt, ring.tag))
        if c < len(ring.recv[t]):
            a, b = ring.recv[t][c]
            if t < self.steps // 2:
                s = c * ring.slot
                recvs.append((ring.scratch[s:s + b - a], ring.prv, ring.tag))
            else:
                recvs.append((buf[a:b], ring.prv, ring.tag))
        return self.ctx.transport.start(sends, recvs)

    def run(self, buf: Any, first: int = 0, stop: int | None = None) -> None:
        """Run steps ``first .. stop-1`` (default: all) on ``buf``."""
        run_blocking(self.run_steps(buf, first, stop))

    def run_steps(self, buf: Any, first: int = 0, stop: int | None = None) -> Steps:
        """Steps ``first .. stop-1`` as a generator that yields where ``run`` waits."""
        stop = self.steps if stop is None else stop
        if self.trivial or first >= stop:
            return
        reduce_into = self.ctx.backend.reduce_into
        op = self.op
        rs_steps = self.steps // 2
        rings = self.rings
        posted: list[Any] = []
        # Batches of the reduce-scatter by (ring, chunk): before the all-gather writes into a
        # block, the reduce-scatter's sends from that block must be complete.
        rs_by_chunk: list[dict[int, list[Any]]] = [{} for _ in rings]
        cur: list[dict[int, Any]] = [{} for _ in rings]

        def post(i: int, t: int, c: int) -> Steps:
            ring = rings[i]
            if t >= rs_steps:
                for p in rs_by_chunk[i].pop(c, ()):
                    yield p, False
            p = self._post(ring, t, c, buf)
            cur[i][c] = p
            posted.append(p)
            if t < rs_steps:
                rs_by_chunk[i].setdefault(c, []).append(p)

        for i, ring in enumerate(rings):
            for c in range(max(len(ring.send[first]), len(ring.recv[first]))):
                yield from post(i, first, c)
        for t in range(first, stop):
            reducing = t < rs_steps
            last = t + 1 == stop
            for c in range(self.maxc[t]):
                for i, ring in enumerate(rings):
                    chunks = ring.recv[t]
                    if c >= len(chunks):
                        continue
                    yield cur[i][c], True
                    if reducing:
                        a, b = chunks[c]
                        s = c * ring.slot
                        reduce_into(buf[a:b], ring.scratch[s:s + b - a], op)
                    if not last:
                        yield from post(i, t + 1, c)
            if not last:
                # Chunks of the next step beyond this step's count (pieces differ by one
                # element, so a block can have one chunk more than the previous).
                for i, ring in enumerate(rings):
                    for c in range(len(ring.recv[t]), len(ring.recv[t + 1])):
                        yield from post(i, t + 1, c)
        for p in posted:
            yield p, False


@register
class Multiring(Algorithm):
    """Concurrent, chunk-pipelined rings; see the module docstring."""

    name = "multiring"
    param_names = ("rings", "chunk_bytes", "order")
    display_order = 1
    model_order = 2
    grid_dimension = 0
    grid_pipelines = True

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False,
                "properties": {"rings": RINGS_SCHEMA, "chunk_bytes": CHUNK_BYTES_SCHEMA,
                               "order": ORDER_SCHEMA}}

    @classmethod
    def grid_cost(cls, model: Any, stride: int, d: int, region: Any,
                  params: Mapping[str, Any]) -> Any:
        """``rings`` concurrent chunk-pipelined rings: reduce-scatter plus all-gather."""
        rings, cb = int(params.get("rings", 1)), int(params.get("chunk_bytes", 0))
        return (model.ring_phase(stride, d, region, rings, cb, True)
                + model.ring_phase(stride, d, region, rings, cb, False))

    @classmethod
    def model_space(cls, model: Any, sizes: Any) -> Any:
        for rings in MODEL_RINGS:
            for cb in MODEL_CHUNKS:
                params = {"rings": rings, "chunk_bytes": cb, "order": "topology"}
                yield params, cls.cost(model, params, sizes)

    @classmethod
    def grid_phase(cls, ctx: Context, offset: int, count: int, dtype: str, op: str,
                   params: Mapping[str, Any]) -> RingSchedule:
        return RingSchedule(ctx, offset, count, dtype, op, params.get("rings", 1),
                            params.get("chunk_bytes", 0), "topology",
                            int(params.get("_piece", 0)))

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        p = super().check_params(params, world_size)
        rings = check_rings(p.get("rings", 1))
        return {
            "rings": rings,
            "chunk_bytes": check_chunk_bytes(p.get("chunk_bytes", 0)),
            "order": validate_order(p.get("order", "topology"), rings, world_size),
        }

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        rings = trial.suggest_int("multiring.rings", 1, 8)
        # Chunks from 16 KiB up to the size of one rank's block; 0 = whole segment. The list
        # does not depend on ``rings`` so that the sampler learns one chunk_bytes across ring
        # counts (a chunk larger than a ring's segment behaves as 0).
        seg = max(1, nbytes // max(1, world_size))
        chunk = trial.suggest_categorical("multiring.chunk_bytes", chunk_choices(seg))
        # On up to 3 ranks every ring order is the same cycle (up to direction), so the
        # order is only searched where it can change which links a ring uses.
        orders = ["topology", "identity"] if world_size > 3 else ["topology"]
        order = trial.suggest_categorical("multiring.order", orders)
        return {"rings": rings, "chunk_bytes": chunk, "order": order}

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        super().__init__(ctx, count, dtype, op, params)
        self.schedule = RingSchedule(ctx, 0, count, dtype, op, self.params["rings"],
                                     self.params["chunk_bytes"], self.params["order"])
        self.trivial = self.schedule.trivial

    def run(self, buf: Any) -> None:
        if self.trivial:
            return
        self.schedule.run(buf)


