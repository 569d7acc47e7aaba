"""Synchronisation inside a shared segment: one sequence counter per rank, fences, and
bounded waits that name the rank they wait for.

Use ``Flags`` where ranks of one host hand each other data through shared memory: a rank
writes its data, then ``publish(value)``; a peer ``wait_all(value)`` (or ``wait(rank,
value)``) before reading it. No library barrier is involved — a barrier through MPI or gloo
costs what the shared-memory path exists to save.

Why counters, not flags: every rank's counter only grows (it counts the steps the rank has
finished since the segment was made), so one word per rank serves every step of every call,
nothing is ever reset, and a wait is a comparison.

Memory ordering: NumPy's stores are plain stores. On x86 (TSO) stores become visible in
program order and loads are not reordered with older loads, so "data, then counter" and
"counter, then data" need no instruction — only that the compiler keeps the order, which an
opaque call into NumPy's C code guarantees. Elsewhere (Arm, POWER) ``fence()`` is a full
barrier taken from POSIX's memory-synchronisation guarantee for mutexes (a lock/unlock pair
twice: release then acquire, in that order, is a full fence under the C11 model that glibc
implements), since Python has no fence of its own.

Every wait is bounded: by ``RINGTUNE_STALL_TIMEOUT`` when set, else ``DEFAULT_TIMEOUT_S``
(torch's own default for gloo); a waited-for rank whose process is gone is reported within
``LIVENESS_S``, without waiting for the timeout. Waits spin briefly (only where every local
rank has a CPU), then sleep in growing steps: a rank that spins or yields costs a core that
its peer, on a machine with fewer cores than ranks or other work, needs to make the
progress it waits for.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import socket
import sys
import time
from collections.abc import Sequence

import numpy as np

from ..plumbing.stall import ENV as STALL_ENV
from ..plumbing.stall import StallError, stall_timeout

#: Seconds a wait lasts when ``RINGTUNE_STALL_TIMEOUT`` is unset (torch's gloo default).
DEFAULT_TIMEOUT_S = 1800.0
#: Seconds between checks that the waited-for ranks' processes are still alive.
LIVENESS_S = 0.2
#: Checks made back to back before a wait starts sleeping (about 1 µs each), where every
#: local rank has a CPU of its own (``cpu_each``); with more ranks than CPUs a spinning
#: rank takes the core its peer needs, and waits sleep at once.
SPIN_CHECKS = 16
#: Seconds of ``sched_yield`` before a wait starts sleeping. 0: none. Measured on 2 vCPUs
#: beside other work (2 and 4 ranks, 64 KiB-16 MiB): 2 ms of yielding made calls 1.3-5x
#: slower than sleeping at once, since a yield hands the core to any runnable process,
#: not to the peer being waited for.
YIELD_S = 0.0
#: First and longest sleep between two checks (a late wake costs at most the longest).
FIRST_SLEEP_S = 0.00002
MAX_SLEEP_S = 0.0005
#: int64 words between two ranks' counters: one 64-byte cache line each, so a rank's
#: stores never invalidate the line its peers poll for another rank.
STRIDE = 8

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


class PeerGone(StallError):
    """A rank waited for a peer whose process has ended (killed, crashed)."""


def _make_fence() -> object:
    """The full memory barrier of this platform as a callable (see the module docstring)."""
    if _X86:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    mutex = ctypes.create_string_buffer(64)  # >= sizeof(pthread_mutex_t) on Linux
    if libc.pthread_mutex_init(mutex, None) != 0:  # pragma: no cover - never fails
        raise OSError("pthread_mutex_init failed")
    lock, unlock = libc.pthread_mutex_lock, libc.pthread_mutex_unlock

    def fence() -> None:
        lock(mutex)
        unlock(mutex)  # release: orders every earlier access before it
        lock(mutex)  # acquire, after a release: no later access moves above it
        unlock(mutex)

    return fence


_FENCE = _make_fence()


def fence() -> None:
    """A full memory barrier between the shared-memory accesses before and after it (free
    on x86, whose ordering already gives what the counters need)."""
    if _FENCE is not None:
        _FENCE()  # type: ignore[operator]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie, killed but not yet
    reaped by its launcher, counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's: not ours to judge
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # no /proc: the signal check above is all there is
    return state not in (b"Z", b"X")


def affinity() -> frozenset[int]:
    """The CPUs this process may run on (every CPU where the system cannot say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return frozenset(range(os.cpu_count() or 1))


def cpu_each(masks: Sequence[frozenset[int]]) -> bool:
    """Whether each rank can have a CPU of its own, given each rank's ``affinity()``.

    Every rank's mask, not one rank's: an MPI library that binds each rank to a core (Open
    MPI's and Intel MPI's default) leaves every rank one CPU, yet every rank has its own —
    judged from one mask, waits never spun there and the segment's path ran 2-4x slower at
    256 KiB-1 MiB than unbound (Open MPI, 2 ranks). Greedy, ranks with fewest CPUs first."""
    used: set[int] = set()
    for mask in sorted(masks, key=len):
        free = mask - used
        if not free:
            return False
        used.add(min(free))
    return True


class Flags:
    """The per-rank counters of one segment, seen by rank ``rank`` of ``size``.

    ``own_cpus``: whether every rank has a CPU of its own (``cpu_each`` of the ranks'
    ``affinity()``, gathered at attach), which lets waits spin; ``None``: judged from this
    rank's CPUs alone.
    ``words`` is the segment's int64 header area: ``size * STRIDE`` words of counters,
    then ``size`` words of process ids (each rank writes its own at attach). ``names`` are
    the ranks as messages should name them (world ranks)."""

    def __init__(self, words: np.ndarray, rank: int, size: int,
                 names: Sequence[int] | None = None, own_cpus: bool | None = None) -> None:
        if words.dtype != np.int64 or words.size < size * (STRIDE + 1):
            raise ValueError(f"counter area of {words.size} int64 words is too small for "
                             f"{size} ranks")
        self.rank, self.size = rank, size
        self.counters = words[: size * STRIDE : STRIDE]
        #: Two words per rank beside its counter (same cache line): the address and byte
        #: length of the buffer it offers to single-copy peers, written before it publishes.
        self.addresses = words[1: size * STRIDE : STRIDE]
        self.lengths = words[2: size * STRIDE : STRIDE]
        self.pids = words[size * STRIDE : size * STRIDE + size]
        self.names = tuple(names) if names is not None else tuple(range(size))
        self.mine = int(self.counters[rank])
        if own_cpus is None:  # the ranks' CPUs unknown: as if each could run on this one's
            own_cpus = cpu_each([affinity()] * size)
        self.spin = SPIN_CHECKS if own_cpus else 0
        timeout = stall_timeout()
        self.timeout = timeout if timeout is not None else DEFAULT_TIMEOUT_S
        self.timeout_source = f"{STALL_ENV}={timeout:g}" if timeout is not None else (
            f"the default {DEFAULT_TIMEOUT_S:g} s; {STALL_ENV} sets another")

    def register_pid(self) -> None:
        """Record this process's id, so that peers can tell when it is gone."""
        self.pids[self.rank] = os.getpid()

    def publish(self, value: int) -> None:
        """Make every store this rank made before visible, then set its counter to
        ``value`` (a release store)."""
        fence()
        self.counters[self.rank] = value
        self.mine = value

    def wait_all(self, value: int) -> None:
        """Return once every rank's counter is at least ``value`` (an acquire: what they
        wrote before publishing it is visible after)."""
        if bool((self.counters >= value).all()):
            fence()
            return
        self._wait(None, value)

    def wait(self, rank: int, value: int) -> None:
        """Return once rank ``rank``'s counter is at least ``value``."""
        if int(self.counters[rank]) >= value:
            fence()
            return
        self._wait(rank, value)

    def _behind(self, rank: int | None, value: int) -> list[int]:
        if rank is not None:
            return [rank] if int(self.counters[rank]) < value else []
        return [int(r) for r in np.flatnonzero(self.counters < value)]

    def _wait(self, rank: int | None, value: int) -> None:
        counters = self.counters
        for _ in range(self.spin):
            if (int(counters[rank]) >= value if rank is not None
                    else bool((counters >= value).all())):
                fence()
                return
        start = time.monotonic()
        deadline = start + self.timeout
        next_alive = start + LIVENESS_S
        sleep = FIRST_SLEEP_S
        while True:
            behind = self._behind(rank, value)
            if not behind:
                fence()
                return
            now = time.monotonic()
            if now - start < YIELD_S:
                os.sched_yield()
                continue
            if now >= next_alive:
                next_alive = now + LIVENESS_S
                gone = [r for r in behind if self.pids[r] and not process_alive(
                    int(self.pids[r]))]
                if gone:
                    self._fail(gone, value, now - start, PeerGone)
            if now >= deadline:
                self._fail(behind, value, now - start, StallError)
            time.sleep(sleep)
            sleep = min(sleep * 2, MAX_SLEEP_S)

    def report(self, kind: type[StallError], ranks: list[int], value: int,
               waited: float) -> None:
        """Raise ``kind`` (``PeerGone``, ``StallError``) naming ``ranks`` at ``value``, as a
        failed wait does: for a failure found outside a wait (a single-copy read)."""
        self._fail(ranks, value, waited, kind)

    def _fail(self, ranks: list[int], value: int, waited: float,
              kind: type[StallError]) -> None:
        who = ", ".join(f"rank {self.names[r]} (pid {int(self.pids[r])})" for r in ranks)
        me = f"rank {self.names[self.rank]} ({socket.gethostname()})"
        if kind is PeerGone:
            msg = (f"{me}: {who} ended while this rank waited {waited:.1f} s for it at "
                   f"shared-memory step {value}: it was killed or crashed; see its own "
                   "output for why")
        else:
            msg = (f"{me}: no progress for {waited:.0f} s waiting on {who} at shared-memory "
                   f"step {value} (bound: {self.timeout_source}): that rank is stuck or "
                   "never entered this allreduce")
        print(f"ringtune: stall: {msg}", file=sys.stderr, flush=True)
        raise kind(msg)
