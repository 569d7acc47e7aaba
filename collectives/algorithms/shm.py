"""``shm``: the ranks of one host reduce through one shared segment, by direct reads.

Use it for host (CPU) buffers when ranks share a host — every multi-rank job has such
ranks. It moves no byte through MPI or gloo: each rank copies its input into its own slot
of a shared segment (``collectives.shm``), reduces *its* 1/P slice straight from every
rank's slot, publishes the reduced slice, and copies every other rank's reduced slice out
(a reduce-scatter by direct reads, then an all-gather by direct reads). The ranks
synchronise through per-rank counters in the segment, never a library barrier.

The message is cut into steps of ``chunk_bytes`` per rank, so the working set of a step
(P slots of one chunk) stays in cache; two sets of slots alternate, so step g+1's copy-in
overlaps the peers' copy-out of step g, and a slot is reused only when every rank has
finished with it (step g waits for step g−2's copy-out, not g−1's).

Single copy: where the kernel lets every rank read and write its peers' memory (Linux
CMA, ``collectives.shm.cma``; probed once per segment, on every rank alike, the reason
logged where refused), the fused allreduce skips the segment: each rank reduces its block
of the whole message a chunk of ``chunk_bytes`` at a time, reading each peer's part with
``process_vm_readv`` into a scratch chunk (in cache) and adding it into its own buffer,
then writes the reduced chunk, still in cache, into every peer's buffer with
``process_vm_writev``. Per rank that is one read and one write of the message from
memory — a memcpy's traffic — against about 4.5 passes for the segment's copy in, reduce,
copy of the result and copy out (2 ranks), and two synchronisations per call instead of
three per step. A buffer that comes back is first given huge pages
(``collectives.shm.pages``): on a torch tensor's 4 KiB pages those copies were slower.

Each element is reduced on one rank — its owner r, in the order ((x_r+x_{r+1})+…)+x_{r−1},
reading its own input in place — and then copied: results are bitwise identical on every
rank and from call to call. The owner is a block's of the whole message on the single-copy
path and a step slice's on the segment's: a plan uses one path for every call, chosen alike
on every rank (at 2 ranks both give the same bits).

Across hosts (a profile that chose ``shm`` on a bigger job) it runs as the inner tier of
``hierarchical`` — shared memory inside each host, the transport (MPI, gloo) between hosts:
DDL's grid with the fastest path on each tier. Where it cannot run at all (GPU buffers,
hosts holding different numbers of ranks, no usable ``/dev/shm``) it says so once and runs
``multiring`` instead, on every rank alike.

Along one dimension of a ``hierarchical`` grid (``inner: shm``) the same segment serves a
reduce-scatter of the region (each rank ends owning block *c*, as multiring's) and the
all-gather back.
"""

from __future__ import annotations

import errno
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ops import itemsize as dtype_itemsize
from ..plumbing.logs import log
from ..shm import Segment, ShmUnavailable, attach_segment
from ..shm.cma import CmaError, CmaReader
from ..shm.pages import HugePages
from ..shm.sync import PeerGone, process_alive
from .base import Algorithm, Context
from .multiring import balanced
from .registry import get_algorithm, register

#: Default bytes per rank per step: 1 MiB was the fastest of 64 KiB, 256 KiB and 1 MiB at
#: 256 KiB–64 MiB on 2 ranks (benchmarks/bench_shm.py); a 2-rank step (2 MiB) stays in L3.
DEFAULT_CHUNK_BYTES = 1 << 20
#: Smallest and largest ``chunk_bytes``: a smaller chunk is all synchronisation; a larger
#: one gains nothing once steps are bandwidth-bound and makes the segment big (two slots
#: per rank: 64 MiB at 8 ranks with 4 MiB chunks, the whole of Docker's default /dev/shm).
MIN_CHUNK_BYTES = 64
MAX_CHUNK_BYTES = 1 << 22
#: ``chunk_bytes`` values the tuner tries.
SEARCH_CHUNKS: tuple[int, ...] = tuple(1 << k for k in range(15, 23))
#: Cache key of a context's segment.
SEGMENT_KEY = "shm.segment"

_UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}
_warned: set[str] = set()


def check_chunk_bytes(value: Any) -> int:
    """``chunk_bytes``: a power of two from 64 B to 4 MiB."""
    if (not isinstance(value, int) or isinstance(value, bool)
            or not MIN_CHUNK_BYTES <= value <= MAX_CHUNK_BYTES or value & (value - 1)):
        raise ValueError(f"chunk_bytes: expected a power of two from {MIN_CHUNK_BYTES} to "
                         f"{MAX_CHUNK_BYTES} (bytes per rank per step), got {value!r}")
    return value


#: Smallest message (bytes) for single copy where the host allows it. Measured on 2 vCPUs
#: (2 ranks, interleaved in one job, loads 1.5-10): below 4 MiB the segment's path was
#: faster in most runs (0.3-0.8x of its time for single copy at 256 KiB-1 MiB under MPI,
#: 0.5-0.6x at 64 KiB-1 MiB under torchrun: the per-call system calls and page pinning
#: outweigh the copies saved); at 16-64 MiB single copy took 0.23-0.7x the segment's time
#: under MPI, 1.04-1.14x under torchrun at load 1.6. 4 MiB straddled both.
SINGLE_COPY_MIN_BYTES = 4 << 20


def peer_ended(exc: CmaError, pid: int) -> bool:
    """Whether a failed single-copy access met a peer that has ended. ESRCH is the
    kernel saying so itself: a process being killed loses its memory before
    ``/proc`` shows it dead, so ``process_alive`` alone would still call it alive and
    the job would end with the system call's error instead of the dead rank's name.
    Any other error waits up to 0.2 s (a wait's own bound for naming a dead peer) for
    the process to show as ended before it is taken as the call's own failure."""
    if exc.errno == errno.ESRCH:
        return True
    deadline = time.monotonic() + 0.2
    while process_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def single_copy_ok(nbytes: int) -> bool:
    """Whether a fused allreduce of ``nbytes`` uses single-copy reads (where allowed)."""
    return nbytes >= SINGLE_COPY_MIN_BYTES


def segment_for(ctx: Context, slot_bytes: int) -> Segment:
    """The context's segment, with slots of at least ``slot_bytes`` (collective: made, or
    remade larger, on every rank alike — plans are built in the same order everywhere).
    A segment too small for a new plan is replaced; plans built on the old one keep it."""
    seg: Segment | None = ctx.cache.get(SEGMENT_KEY)
    if seg is not None and seg.nbytes >= 2 * ctx.size * slot_bytes:
        return seg
    names = ctx.world_ranks if len(ctx.world_ranks) == ctx.size else None
    seg = attach_segment(ctx.comm, 2 * ctx.size * slot_bytes, names, slot_bytes)
    why = seg.probe_cma(ctx.comm)
    if why and ctx.rank == 0:
        log.info("shm: single-copy reads are off on this host (%s); the segment's copies "
                 "are used instead", why)
    ctx.cache[SEGMENT_KEY] = seg
    return seg


def one_host(ctx: Context) -> bool:
    """Whether every rank of ``ctx`` is known to share this rank's host."""
    return len(ctx.hosts) == ctx.size and len(set(ctx.hosts)) == 1


class _Slots:
    """Typed views of a segment's two sets of per-rank slots."""

    def __init__(self, seg: Segment, dtype: str, slot_elems: int) -> None:
        slot_bytes = seg.slot_bytes
        self.views = [[seg.view(dtype, (half * seg.size + q) * slot_bytes, slot_elems)
                       for q in range(seg.size)] for half in (0, 1)]


class ShmSchedule:
    """The shared-memory reduce-scatter and all-gather of the region ``[offset, offset +
    count)`` over the ranks of ``ctx`` (one host), built once, run many times.

    ``run(buf)`` is the fused allreduce (the flat algorithm; ``fused``: built for it, so
    single copy may serve it); ``reduce_scatter(buf)`` then ``all_gather(buf)`` are its two
    halves for a ``hierarchical`` grid: after the first, this rank's block ``owned`` holds
    the sum over every rank."""

    def __init__(self, ctx: Context, offset: int, count: int, dtype: str, op: str,
                 chunk_bytes: int, divide_by: int = 0, fused: bool = False) -> None:
        self.op, self.divide_by = op, divide_by
        self.backend = ctx.backend
        n, me = ctx.size, ctx.rank
        self.n, self.me = n, me
        self.offset, self.count = offset, count
        blocks = balanced(count, n) if n else []
        self.owned = (offset + blocks[me][0], blocks[me][1]) if n else (offset, count)
        self.trivial = n == 1 or count == 0
        if self.trivial:
            return
        size = dtype_itemsize(dtype)
        # Elements of one step: a multiple of n no larger than a slot, at least n.
        step = max(n, (chunk_bytes // size) // n * n)
        slot_elems = step
        self.seg = segment_for(ctx, -(-slot_elems * size // 64) * 64)
        self.slots = _Slots(self.seg, dtype, slot_elems).views
        self.ufunc = _UFUNCS[op]
        # The fused run's steps: consecutive ranges of the region, each cut into n slices.
        self.steps = [(a, min(a + step, offset + count))
                      for a in range(offset, offset + count, step)]
        self.slices: dict[int, list[tuple[int, int]]] = {}
        for a, b in self.steps:
            self.slices.setdefault(b - a, balanced(b - a, n))
        # The grid halves' steps: piece j of every block, each at most step/n elements,
        # laid out in a slot one block's piece after another.
        per = step // n
        self.blocks = [(offset + o, ln) for o, ln in blocks]
        longest = max(ln for _, ln in self.blocks)
        self.grid_steps = max(1, -(-longest // per))
        self.per = per
        # Single copy (the fused run only): where every rank may read its peers' memory,
        # this rank reduces its block reading the peers' inputs where they lie, a chunk of
        # ``chunk_bytes`` at a time through a scratch chunk that stays in cache.
        self.reader: CmaReader | None = None
        if fused and not self.seg.cma_refused and single_copy_ok(count * size):
            self.reader = CmaReader()
            self.itemsize = size
            self.pids = [int(p) for p in self.seg.flags.pids]
            self.others = [(me + k) % n for k in range(1, n)]
            self.scratch = np.empty(max(1, min(blocks[me][1], chunk_bytes // size)),
                                    dtype=dtype)
            # A buffer that comes back gets huge pages: on 4 KiB pages (a torch tensor's)
            # the peers' reads and writes of it took up to 1.4x longer.
            self.pages = HugePages()

    # -- the fused allreduce ---------------------------------------------------------------

    def run(self, buf: Any) -> None:
        if self.trivial:
            return
        if self.reader is not None and type(buf) is np.ndarray:
            self._run_single_copy(buf)
            return
        flags, me, n = self.seg.flags, self.me, self.n
        for a, b in self.steps:
            g, slots = self._begin_step()
            mine = slots[me]
            slices = self.slices[b - a]
            o, ln = slices[me]
            # Every slice but this rank's own goes in: only this rank reads its own, and
            # it reads it where it lies. Those are two contiguous ranges.
            if o:
                np.copyto(mine[:o], buf[a:a + o])
            if a + o + ln < b:
                np.copyto(mine[o + ln:b - a], buf[a + o + ln:b])
            flags.publish(3 * g + 1)
            flags.wait_all(3 * g + 1)
            if ln:
                out = buf[a + o:a + o + ln]
                self._reduce(out, [s[o:o + ln] for s in self._others(slots)])
                np.copyto(mine[o:o + ln], out)
            flags.publish(3 * g + 2)
            flags.wait_all(3 * g + 2)
            for q in range(n):
                if q != me:
                    o, ln = slices[q]
                    if ln:
                        np.copyto(buf[a + o:a + o + ln], slots[q][o:o + ln])
            flags.publish(3 * g + 3)

    def _run_single_copy(self, buf: np.ndarray) -> None:
        """The fused allreduce by single-copy reads and writes (``collectives.shm.cma``):
        publish this buffer's address and length; reduce this rank's block chunk by chunk,
        each peer's part read into the scratch chunk and added in the fixed order, and
        write each reduced chunk, still in cache, into every peer's buffer (only this rank,
        the block's owner, reads or writes that block there); publish, and return once
        every peer has written its block here. Two synchronisations per call, whatever the
        size, and per rank one read and one write of the message."""
        seg = self.seg
        flags, isz = seg.flags, self.itemsize
        # One step of the segment's counters (values 3g+1 and 3g+2). A slot step before it
        # may still be copying out of slots, which this one never touches; one after it
        # waits for this step's end as for any step's.
        g = seg.steps
        seg.steps = g + 1
        # Before the address is published: no peer touches the buffer during a collapse.
        self.pages.offer(int(buf.ctypes.data), buf.nbytes)
        flags.addresses[self.me] = int(buf.ctypes.data)
        flags.lengths[self.me] = buf.nbytes
        flags.publish(3 * g + 1)
        others, nbytes = self.others, buf.nbytes
        remote = []
        for q in others:
            self._wait_peer(q, 3 * g + 1)
            if int(flags.lengths[q]) != nbytes:
                raise ValueError(
                    f"shm: rank {flags.names[q]}'s buffer has {int(flags.lengths[q])} "
                    f"bytes, this rank's {nbytes}: every rank must pass the same size")
            remote.append(int(flags.addresses[q]))
        start, ln = self.owned
        if ln:
            scratch = self.scratch
            per = scratch.size
            tmp_addr = int(scratch.ctypes.data)
            mine = int(buf.ctypes.data)
            ufunc, divide_by = self.ufunc, self.divide_by
            for lo in range(start, start + ln, per):
                m = min(per, start + ln - lo)
                out = buf[lo:lo + m]
                tmp = scratch[:m]
                at, size = lo * isz, m * isz
                for q, addr in zip(others, remote):
                    self._copy(False, q, tmp_addr, addr + at, size, 3 * g + 1)
                    ufunc(out, tmp, out=out)
                if divide_by:
                    self.backend.divide(out, divide_by)
                for q, addr in zip(others, remote):
                    self._copy(True, q, mine + at, addr + at, size, 3 * g + 1)
        flags.publish(3 * g + 2)
        flags.wait_all(3 * g + 2)
        # The next step starts at 3(g+1)+1: a peer waiting for this step's end is done
        # with this buffer (it wrote its block before publishing).
        flags.publish(3 * g + 3)

    def _wait_peer(self, q: int, value: int) -> None:
        self.seg.flags.wait(q, value)

    def _copy(self, write: bool, q: int, local: int, remote: int, nbytes: int,
              value: int) -> None:
        """One single-copy read from (or write to) rank ``q``; its end (killed) is named as
        a wait's is."""
        assert self.reader is not None
        try:
            if write:
                self.reader.write(self.pids[q], local, remote, nbytes)
            else:
                self.reader.read(self.pids[q], local, remote, nbytes)
        except CmaError as exc:
            if peer_ended(exc, int(self.pids[q])):
                self.seg.flags.report(PeerGone, [q], value, 0.0)
            raise

    def _others(self, slots: list[np.ndarray]) -> list[np.ndarray]:
        """The other ranks' slots, from the next rank round to the previous one."""
        me = self.me
        return slots[me + 1:] + slots[:me]

    def _reduce(self, out: np.ndarray, parts: list[np.ndarray]) -> None:
        """``out = ((out op parts[0]) op parts[1]) …`` in place — ``out`` holds this rank's
        own input, ``parts`` are the others' from the next rank round — then the division
        of ``avg`` where this schedule fuses it. Each element is reduced by one rank (its
        slice's owner) in the same order on every call: the result is bitwise the same on
        every rank and every call."""
        ufunc = self.ufunc
        for part in parts:
            ufunc(out, part, out=out)
        if self.divide_by:
            self.backend.divide(out, self.divide_by)

    # -- the two halves, for a grid ----------------------------------------------------------

    def _pieces(self, j: int) -> list[tuple[int, int]]:
        """(start, length) in the buffer of piece ``j`` of every block."""
        per = self.per
        out = []
        for o, ln in self.blocks:
            lo = min(j * per, ln)
            out.append((o + lo, min(per, ln - lo)))
        return out

    def _begin_step(self) -> tuple[int, list[np.ndarray]]:
        """Count the next step on the segment and give its set of slots, once every rank
        has copied step g-2 out of them (the two sets alternate)."""
        seg = self.seg
        g = seg.steps
        seg.steps = g + 1
        if g >= 2:
            seg.flags.wait_all(3 * g - 3)
        return g, self.slots[g & 1]

    def reduce_scatter(self, buf: Any) -> None:
        if self.trivial:
            return
        flags, me, per = self.seg.flags, self.me, self.per
        for j in range(self.grid_steps):
            g, slots = self._begin_step()
            pieces = self._pieces(j)
            mine = slots[me]
            for q, (start, ln) in enumerate(pieces):
                if ln and q != me:  # this rank reads its own piece where it lies
                    np.copyto(mine[q * per:q * per + ln], buf[start:start + ln])
            flags.publish(3 * g + 1)
            flags.wait_all(3 * g + 1)
            start, ln = pieces[me]
            if ln:
                base = me * per
                self._reduce(buf[start:start + ln],
                             [s[base:base + ln] for s in self._others(slots)])
            flags.publish(3 * g + 3)

    def all_gather(self, buf: Any) -> None:
        if self.trivial:
            return
        flags, me, n = self.seg.flags, self.me, self.n
        for j in range(self.grid_steps):
            g, slots = self._begin_step()
            pieces = self._pieces(j)
            start, ln = pieces[me]
            if ln:
                np.copyto(slots[me][:ln], buf[start:start + ln])
            flags.publish(3 * g + 1)
            flags.wait_all(3 * g + 1)
            for q in range(n):
                start, ln = pieces[q]
                if q != me and ln:
                    np.copyto(buf[start:start + ln], slots[q][:ln])
            flags.publish(3 * g + 3)


def _fallback(ctx: Context, why: str) -> str:
    """Warn once per reason (rank 0 of the context) and name the algorithm used instead."""
    if ctx.rank == 0 and why not in _warned:
        _warned.add(why)
        warnings.warn(f"shm: {why}; using multiring instead", RuntimeWarning, stacklevel=4)
    return "multiring"


@register
class Shm(Algorithm):
    """Reduce through one shared-memory segment per host (see the module docstring)."""

    name = "shm"
    param_names = ("chunk_bytes",)
    display_order = 5
    model_order = 5
    grid_dimension = 3
    fuses_average = True
    intra_host_only = True

    @classmethod
    def check_params(cls, params: Mapping[str, Any], world_size: int) -> dict[str, Any]:
        p = super().check_params(params, world_size)
        return {"chunk_bytes": check_chunk_bytes(p.get("chunk_bytes", DEFAULT_CHUNK_BYTES))}

    @classmethod
    def params_schema(cls) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "properties": {
            "chunk_bytes": {
                "description": "bytes per rank per step: a power of two from "
                               f"{MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES}",
                "enum": [1 << k for k in range(MIN_CHUNK_BYTES.bit_length() - 1,
                                               MAX_CHUNK_BYTES.bit_length())]}}}

    @classmethod
    def search_space(cls, trial: Any, world_size: int, nbytes: int) -> dict[str, Any]:
        per_rank = max(1, nbytes // max(1, world_size))
        choices = [c for c in SEARCH_CHUNKS if c < 2 * per_rank * world_size] or [
            SEARCH_CHUNKS[0]]
        return {"chunk_bytes": trial.suggest_categorical("shm.chunk_bytes", choices)}

    @classmethod
    def cost(cls, model: Any, params: Mapping[str, Any], sizes: Any) -> Any:
        """One host: what the fused run does — from ``SINGLE_COPY_MIN_BYTES`` single copy
        (a memcpy's traffic per rank, two synchronisations; the model assumes the kernel
        allows it, as it does between one user's processes unless ptrace is restricted:
        the run probes it and falls back to the segment, which the tuner then measures),
        below it the segment's passes over every rank. Several hosts: what ``run`` does
        there — the two-tier grid (shm inside hosts, multiring between), or multiring where
        the hosts hold different numbers of ranks."""
        from .hierarchical import auto_dims

        dims = auto_dims(tuple(int(h) for h in model.hosts), model.n)
        if len(dims) == 1 and len(set(int(h) for h in model.hosts)) == 1:
            region = np.asarray(sizes, dtype=float)
            # Single copy reads S and writes S per rank (reduce_time charges 3 bytes of
            # traffic per byte, hence 2/3).
            single = model.reduce_time(region * 2.0 / 3.0) + 2 * model.over
            return np.where(region >= SINGLE_COPY_MIN_BYTES, single,
                            cls.grid_cost(model, 1, model.n, region, params))
        if len(dims) == 2:
            grid = {"dims": dims, "inner": ["shm", "multiring"], "rings": 1,
                    "chunk_bytes": 0}
            return get_algorithm("hierarchical").cost(model, grid, sizes)
        return get_algorithm("multiring").cost(model, {}, sizes)

    @classmethod
    def grid_cost(cls, model: Any, stride: int, d: int, region: Any,
                  params: Mapping[str, Any]) -> Any:
        """Copy in, reduce 1/d, copy out, at the host's memory rate, plus three
        synchronisations per step; infinite for a dimension that crosses hosts."""
        region = np.asarray(region, dtype=float)
        hosts = np.asarray(model.hosts)
        pos = np.arange(model.n)
        bases = pos[(pos // stride) % d == 0]
        members = bases[:, None] + np.arange(d)[None, :] * stride
        if np.any(hosts[members] != hosts[members[:, :1]]):
            return np.full(region.shape, np.inf)
        chunk = float(params.get("chunk_bytes") or DEFAULT_CHUNK_BYTES)
        steps = np.maximum(1.0, np.ceil(region / (chunk * d)))
        # Bytes read and written per rank: the copy in (2), the reduce (d+1)/d and the
        # copy out 2(d-1)/d; reduce_time charges 3 bytes of traffic per byte.
        traffic = region * (2.0 + (d + 1) / d + 2.0 * (d - 1) / d) / 3.0
        return model.reduce_time(traffic) + steps * 3 * model.over

    @classmethod
    def grid_phase(cls, ctx: Context, offset: int, count: int, dtype: str, op: str,
                   params: Mapping[str, Any]) -> Any:
        if ctx.backend.on_gpu:
            raise ValueError("inner: shm moves host buffers only; for GPU buffers use "
                             "multiring, rhd or native along that dimension")
        if not one_host(ctx):
            raise ValueError("inner: shm runs only along a dimension of ranks that share "
                             "a host (dimension 0 of dims 'auto'); use multiring there")
        chunk = params.get("shm_chunk_bytes") or DEFAULT_CHUNK_BYTES
        return ShmSchedule(ctx, offset, count, dtype, op, int(chunk))

    def __init__(self, ctx: Context, count: int, dtype: str, op: str,
                 params: Mapping[str, Any]) -> None:
        average = op == "avg"
        super().__init__(ctx, count, dtype, op, params)
        self.delegate: Algorithm | None = None
        self.divide_after = False
        self.schedule: ShmSchedule | None = None
        if ctx.size == 1 or count == 0:
            self.trivial = True
            return
        self.trivial = False
        chunk = int(self.params.get("chunk_bytes", DEFAULT_CHUNK_BYTES))
        why = None
        if ctx.backend.on_gpu:
            why = "GPU buffers do not live in host memory (NCCL moves them)"
        elif not one_host(ctx):
            from .hierarchical import auto_dims

            hosts = ctx.hosts if len(ctx.hosts) == ctx.size else tuple(range(ctx.size))
            dims = auto_dims(hosts, ctx.size)
            if len(dims) == 2:
                # DDL's grid: shared memory inside each host, the transport between them.
                grid = {"dims": dims, "inner": ["shm", "multiring"], "rings": 1,
                        "chunk_bytes": 0, "shm_chunk_bytes": chunk}
                self.delegate = _HierarchicalWithShm(ctx, count, dtype, op, grid)
                return
            why = "the hosts hold different numbers of ranks (no grid of one host per row)"
        if why is None:
            try:
                self.schedule = ShmSchedule(ctx, 0, count, dtype, "sum" if average else op,
                                            chunk, divide_by=ctx.size if average else 0,
                                            fused=True)
                return
            except ShmUnavailable as exc:
                why = str(exc)
        name = _fallback(ctx, why)
        cls = get_algorithm(name)
        # ``avg`` came here because shm divides itself; a fallback that does not sums,
        # and this plan divides the result as the communicator would have.
        self.divide_after = average and not cls.fuses_average
        self.delegate = cls(ctx, count, dtype, "sum" if self.divide_after else op,
                            cls.check_params({}, ctx.size))

    def run(self, buf: Any) -> None:
        if self.trivial:
            return
        if self.delegate is not None:
            self.delegate.run(buf)
            if self.divide_after:
                self.ctx.backend.divide(buf, self.ctx.size)
            return
        assert self.schedule is not None
        self.schedule.run(buf)


def _HierarchicalWithShm(ctx: Context, count: int, dtype: str, op: str,  # noqa: N802
                         grid: Mapping[str, Any]) -> Algorithm:
    """``hierarchical`` over ``grid`` with shm's chunk size passed to its shm phases."""
    cls = get_algorithm("hierarchical")
    checked = cls.check_params({k: v for k, v in grid.items() if k != "shm_chunk_bytes"},
                               ctx.size)
    checked["shm_chunk_bytes"] = grid["shm_chunk_bytes"]
    return cls(ctx, count, dtype, op, checked)
