"""Calibration of the cost model from this machine's measured primitives (``measure``), and
the median of several such calibrations (``combine``).

Use it to predict this machine rather than a cluster file: ``measure(comm)`` times the
model's primitives — per-message cost, point-to-point time of freshly reduced buffers by
size, reduction rates, fresh pages — never an allreduce's time, and returns a ``Cluster``
in which ``native`` is modelled as the running library's module says (``native_model``: its
own selection where the module models it; others: the best of the model's algorithms). A
measured level's bandwidth is a curve over message size, which absorbs protocol switches
and caches. On a shared machine, ``combine`` several calibrations. ``autotune.model``
re-exports both names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .cluster import Cluster, Level

#: Message sizes of the measured curves (bytes): every power of two, 4 KiB .. 64 MiB, so
#: that interpolation between points stays within a factor of two of a measurement.
CURVE_SIZES: tuple[int, ...] = tuple(1 << k for k in range(12, 27))


def measure(comm: Any, sizes: Sequence[int] = CURVE_SIZES, reps: int = 7,
            small: int = 8) -> Cluster:
    """Calibrate the model's primitives on this machine (collective over ``comm``; about a
    second at 2 ranks). Every primitive is timed with all ranks doing it at once, as they
    do in an allreduce, so the time-sharing of more ranks than cores
    (``os.sched_getaffinity``) and the machine's other load are in the figures; each time is
    the slowest rank's, median of ``reps``. Nothing here runs an allreduce: the figures are
    the parts the model adds up, never the algorithms' own times.

    - per-message software cost: a tiny exchange through ``MpiTransport`` (the Python and
      MPI call path every algorithm step pays: post a send and a receive, wait), and through
      mpi4py's ``Sendrecv`` (one C call, as inside the library's own allreduce);
    - point-to-point time by message size, as the algorithms move data: every rank sends
      to one peer while receiving from another (a ring shift on one host; disjoint pairs,
      level by level, across hosts), and the buffer sent was written by a reduction
      (``reduce_into``) just before, as in every reduce-scatter step;
    - the reduction rate by size: the backend's ``reduce_into`` (ours) and
      ``MPI.Op.Reduce_local`` (the library's own);
    - first touch of freshly mapped pages (the library's per-call temporary buffer).

    Every rank returns the same ``Cluster``."""
    import os

    from mpi4py import MPI

    from collectives.registry import get_backend
    from collectives.transports.mpi import MpiTransport

    n, rank = comm.Get_size(), comm.Get_rank()
    sizes = sorted(int(s) for s in sizes)
    names = comm.allgather(MPI.Get_processor_name())
    ids: dict[str, int] = {}
    hosts = [ids.setdefault(h, len(ids)) for h in names]
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    per_host = max(1, n // max(1, len(ids)))
    be = get_backend("numpy")
    tr = MpiTransport(comm, be)
    timer = _Timer(comm, reps)

    # -- point to point: one pattern per level (kind 0 within a host, 1 between hosts) --
    patterns: list[tuple[int, int | None, int | None]] = []  # (kind, send to, receive from)
    if len(ids) == 1:
        if n > 1:
            patterns.append((0, (rank + 1) % n, (rank - 1) % n))
    else:
        seen: set[int] = set()
        for shift in range(1, 1 << (n - 1).bit_length()):
            peer = rank ^ shift
            kinds = {int(hosts[r] != hosts[r ^ shift]) for r in range(n) if r ^ shift < n}
            if kinds <= seen:
                continue  # a level already measured: one round per level is enough
            seen |= kinds
            ok = peer < n
            kind = int(ok and hosts[peer] != hosts[rank])
            patterns.append((kind if ok else -1, peer if ok else None, peer if ok else None))
    tiny: dict[int, list[float]] = {0: [], 1: []}
    curves: dict[int, list[np.ndarray]] = {0: [], 1: []}
    c_tiny: list[float] = []
    for kind, dst, src in patterns:
        t_tiny, t_c, per_size = _pattern_times(comm, tr, timer, dst, src, sizes, reps)
        # Every rank learns every rank's figures; each kind keeps its slowest rank's.
        for (k, tt, tc, ps) in comm.allgather((kind, t_tiny, t_c, per_size)):
            if k >= 0:
                tiny[k].append(tt)
                curves[k].append(np.array(ps))
                c_tiny.append(tc)

    # -- reductions and fresh pages, all ranks at once ---------------------------------
    mem_times: list[float] = []
    native_times: list[float] = []
    for size in sizes:
        a = np.zeros(max(1, size // 4), dtype=np.float32)
        b = np.zeros_like(a)
        r = _reps(size, reps)

        def ours(a: Any = a, b: Any = b) -> None:
            be.reduce_into(a, b, "sum")

        def theirs(a: Any = a, b: Any = b) -> None:
            MPI.SUM.Reduce_local(b, a)

        ours()
        theirs()
        mem_times.append(timer.slowest(ours, reps=r))
        native_times.append(timer.slowest(theirs, reps=r))
    # As GB/s of the three arrays a reduction touches; times made non-decreasing in size.
    mem_curve = [(b, 3 * b / max(1e-9, t) / 1e9) for b, t in zip(sizes, _monotone(mem_times))]
    native_curve = [(b, 3 * b / max(1e-9, t) / 1e9)
                    for b, t in zip(sizes, _monotone(native_times))]
    fault_gbs = _fresh_pages_gbs(comm, tr, timer, patterns[0][1:] if patterns else None)

    # -- the cluster -------------------------------------------------------------------
    # Moving more bytes never takes less time: noise that says otherwise (a burst of other
    # work during one size) is pooled with its neighbours (isotonic regression).
    t_sizes = {k: _monotone(np.max(np.stack(v), axis=0)) for k, v in curves.items() if v}
    t_small = {k: min(float(np.max(tiny[k])), float(t_sizes[k][0])) for k in t_sizes}
    # Per message: half a tiny exchange step (one send and one receive posted and waited).
    over = 0.5 * min(t_small.values()) if t_small else 0.5 * timer.local(
        lambda: tr.start([], []).wait())
    levels = []
    for kind, (name, size) in enumerate((("host", per_host if len(ids) > 1 else n),
                                         ("network", len(ids)))):
        if kind not in t_sizes or (kind == 1 and len(ids) == 1):
            continue
        t_s = t_sizes[kind]
        extra = t_small[kind] - 2 * over  # wire latency beyond the fastest level's
        # Seconds per byte beyond the tiny step's fixed cost; never below 1/1000 of it.
        per_byte = np.maximum(t_s - t_small[kind], 1e-3 * t_small[kind]) / np.array(sizes)
        curve = tuple((s, float(1e-9 / pb)) for s, pb in zip(sizes, per_byte))
        levels.append(Level(name, size, curve[-1][1], max(0.0, extra) * 1e6, 1.0, True,
                            "measured", curve=curve))
    if not levels:  # one rank: nothing to send; keep the shape of a one-level cluster
        levels.append(Level("host", max(1, n), 1.0, 0.0, 1.0, True, "measured"))
    ranks_here = n // max(1, len(ids))
    return Cluster(
        name="measured", levels=tuple(levels), memory_gbs=mem_curve[-1][1],
        overhead_us=over * 1e6, memory_curve=tuple(mem_curve),
        **_library_calibration(),
        native_overhead_us=0.5 * float(np.max(c_tiny)) * 1e6 if c_tiny else over * 1e6,
        native_memory_curve=tuple(native_curve), page_fault_gbs=fault_gbs,
        description=f"measured: {n} ranks, {ranks_here} per host on {cores} cores "
                    f"(time-sharing factor {max(1.0, ranks_here / cores):.1f}, in the figures)")


def native_cost_model() -> str:
    """How the model times the running library's default allreduce: the library's module
    says (``collectives.natives``: its own selection where it has a model of it; elsewhere
    the best algorithm)."""
    return str(_library_calibration()["native_model"])


def _library_calibration() -> dict[str, Any]:
    """The cluster fields the running library's module sets (``NativeLibrary.calibration``)."""
    from collectives.natives import current

    return current().calibration()


def _pattern_times(comm: Any, tr: Any, timer: _Timer, dst: int | None, src: int | None,
                   sizes: Sequence[int], reps: int) -> tuple[float, float, list[float]]:
    """This rank's times (s) of one exchange pattern (send to ``dst`` while receiving from
    ``src``; ``None``: idle this round): a tiny step through the transport, a tiny
    ``Sendrecv``, and a step of each size whose send buffer a reduction has just written."""
    active = dst is not None and src is not None
    zero = np.zeros(2, dtype=np.float32)
    rbuf = np.zeros_like(zero)
    sends = [(zero, dst, 5)] if active else []
    recvs = [(rbuf, src, 5)] if active else []
    loops = 20

    def tiny_steps() -> None:
        for _ in range(loops):
            tr.start(sends, recvs).wait()

    def c_steps() -> None:
        for _ in range(loops):
            if active:
                comm.Sendrecv(zero, dst, 6, rbuf, src, 6)

    t_tiny = timer.local(tiny_steps) / loops
    t_c = timer.local(c_steps) / loops
    per_size = []
    reduce_into = tr.backend.reduce_into
    for size in sizes:
        # Buffers of the message's size, allocated as an algorithm allocates its scratch
        # (NumPy backs those of 4 MiB and more with huge pages) and written through once, so
        # that no timed step pays for first-touch page faults.
        sbuf, other, recv = (np.ones(max(1, size // 4), dtype=np.float32) for _ in range(3))
        for w in (sbuf, other, recv):
            w[:] = 0.0
        s_list = [(sbuf, dst, 7)] if active else []
        r_list = [(recv, src, 7)] if active else []

        def exchange(s_list: Any = s_list, r_list: Any = r_list) -> None:
            tr.start(s_list, r_list).wait()

        def dirty(sbuf: Any = sbuf, other: Any = other) -> None:
            reduce_into(sbuf, other, "sum")  # zeros: the values never change

        # A reduction writes the buffer (untimed), a barrier, then the exchange is timed.
        # Timing reduction + exchange back to back and taking off the reduction timed alone
        # was tried too: it also catches the penalty this VM sometimes puts on sending
        # freshly written data, but the partner's skew lands in it, and it over-predicted
        # 2-3x as often as it helped (BENCHMARKS.md, issue 6).
        exchange()  # first touch, protocol set-up
        per_size.append(timer.local(exchange, before=dirty, reps=_reps(size, reps)))
    return t_tiny, t_c, per_size


def _monotone(values: Iterable[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent
    violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in map(float, values):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(c), t / c) for t, c in blocks])


def _reps(size: int, reps: int) -> int:
    """Fewer repetitions for the largest sizes (each takes milliseconds)."""
    return reps if size <= 1 << 22 else max(3, reps - 2)


class _Timer:
    """Times a step on every rank at once: barrier, step, slowest rank; median of reps."""

    def __init__(self, comm: Any, reps: int) -> None:
        self.comm = comm
        self.reps = max(1, reps)

    def local(self, step: Any, before: Any = None, reps: int | None = None) -> float:
        """Median over reps of this rank's time (``before`` runs untimed, pre-barrier);
        the caller gathers ranks."""
        return float(np.median(self._times(step, before, reps)))

    def slowest(self, step: Any, reps: int | None = None) -> float:
        from mpi4py import MPI

        times = self._times(step, None, reps)
        worst = np.empty_like(times)
        self.comm.Allreduce(times, worst, op=MPI.MAX)
        return float(np.median(worst))

    def _times(self, step: Any, before: Any, reps: int | None) -> np.ndarray:
        out = np.empty(self.reps if reps is None else max(1, reps))
        clock = time.perf_counter
        for i in range(out.size):
            if before is not None:
                before()
            self.comm.Barrier()
            t0 = clock()
            step()
            out[i] = clock() - t0
        return out


def _fresh_pages_gbs(comm: Any, tr: Any, timer: _Timer, pattern: tuple[Any, Any] | None,
                     nbytes: int = 32 << 20) -> float:
    """GB/s of pages a receive into a freshly mapped buffer costs beyond the same receive
    into a mapped one (the page faults of the library's per-call temporary buffer; all
    ranks at once). With nobody to exchange with, the first touch of fresh pages."""
    import mmap

    dst, src = pattern if pattern is not None else (None, None)
    sbuf = np.zeros(nbytes // 4, dtype=np.float32)
    warm = np.zeros_like(sbuf)
    active = dst is not None and src is not None

    def into(buf: Any) -> None:
        if active:
            tr.start([(sbuf, dst, 8)], [(buf, src, 8)]).wait()
        else:
            buf[::mmap.PAGESIZE // 4] = 1

    def fresh() -> None:
        # Private anonymous pages, as malloc maps a large block (the mmap module's default
        # is shared memory, whose pages fault about 1.5x slower here).
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = np.frombuffer(mm, dtype=np.float32)
        into(view)
        del view
        mm.close()

    into(warm)
    extra = timer.slowest(fresh, reps=3) - timer.slowest(lambda: into(warm), reps=3)
    return nbytes / max(1e-9, extra) / 1e9


def combine(runs: Sequence[Cluster]) -> Cluster:
    """The median of several calibrations of the same world, figure by figure (the machine
    is shared: a median is robust to a burst of load during one of them)."""
    from dataclasses import replace

    if not runs:
        raise ValueError("combine: no calibrations")
    first = runs[0]

    def med(values: Iterable[float]) -> float:
        return float(np.median(list(values)))

    def curve(get: Any) -> tuple[tuple[int, float], ...]:
        points = [get(r) for r in runs]
        return tuple((b, med(p[k][1] for p in points)) for k, (b, _) in enumerate(points[0]))

    levels = []
    for j, lv in enumerate(first.levels):
        levels.append(replace(
            lv, bandwidth_gbs=med(r.levels[j].bandwidth_gbs for r in runs),
            latency_us=med(r.levels[j].latency_us for r in runs),
            curve=curve(lambda r, j=j: r.levels[j].curve)))
    return replace(
        first, levels=tuple(levels), memory_gbs=med(r.memory_gbs for r in runs),
        overhead_us=med(r.overhead_us for r in runs),
        native_overhead_us=med(r.native_overhead_us or r.overhead_us for r in runs),
        memory_curve=curve(lambda r: r.memory_curve),
        native_memory_curve=curve(lambda r: r.native_memory_curve),
        page_fault_gbs=med(r.page_fault_gbs for r in runs))
