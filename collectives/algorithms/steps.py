"""Schedules as generators of waits, run one at a time or several interleaved.

A phase of an algorithm (a ring's reduce-scatter, recursive halving, …) written as a
generator posts its batches with ``ctx.transport.start`` and, where the blocking code would
wait, yields ``(pending, recv_only)`` instead; whoever drives it resumes it once that wait
would return. ``run_blocking`` drives one schedule with plain waits (what a single phase
does). ``interleave`` drives several at once — the pieces of a pipelined ``hierarchical``
grid — resuming whichever piece's data has arrived, so that one piece's inter-host transfer
stays in flight (and MPI keeps progressing it inside every call) while other pieces reduce
or copy on the host. A schedule may also yield ``None``: "the next schedule may start now"
(the pipeline's gate); ``run_blocking`` ignores it.

Schedules that share a communicator must use tags no other schedule in flight uses, and
none may call a blocking collective: interleaving changes the order in which ranks reach
their steps, which point-to-point messages with distinct tags tolerate and collectives
do not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Generator, Sequence
from typing import Any

from ..transport import Pending

#: Tags per piece of a pipelined grid: piece p adds ``TAG_STRIDE · p`` to its phases' tags
#: (multiring: 100 + ring < 116; rhd: 3..5), so pieces in flight on one communicator never
#: match each other's messages.
TAG_STRIDE = 32

#: What a schedule yields: a batch to wait for (``recv_only``: only its receives), or
#: ``None`` to let the next interleaved schedule start.
Wait = tuple[Pending, bool] | None
Steps = Generator[Wait, None, None]


def run_blocking(steps: Steps) -> None:
    """Run one schedule to its end, blocking at each of its waits."""
    for w in steps:
        if w is not None:
            pending, recv_only = w
            if recv_only:
                pending.wait_recv()
            else:
                pending.wait()


def interleave(schedules: Sequence[Steps]) -> None:
    """Run ``schedules`` to their ends, interleaved: schedule k+1 starts when schedule k
    yields ``None`` or ends; every started one is resumed as soon as its wait is over,
    earlier schedules first.

    Deadlock-free on any ranks whose schedules are deadlock-free alone: when no wait is
    over, it polls until *any* awaited request completes (``Testany``, in which MPI
    progresses every piece's transfers, yielding the core between polls) or, where a
    transport cannot list its requests, blocks on the earliest unfinished schedule — whose
    peers have either finished it or can always progress it, by induction over the
    schedules' order."""
    from mpi4py import MPI

    from ..plumbing.stall import stall_timeout

    testany = MPI.Request.Testany
    sched_yield = os.sched_yield
    # RINGTUNE_STALL_TIMEOUT: the poll below gives up after that long without any request
    # completing and hands over to the earliest schedule's own (watched) wait, which names
    # the peers and raises StallError if they stay silent: a dead peer ends a pipelined
    # grid within twice the timeout, never hangs it.
    stall = stall_timeout()
    todo = list(schedules)
    live: list[_Running] = []  # started, unfinished, in start order
    started = 0

    def start_next() -> None:
        nonlocal started
        if started < len(todo):
            run = _Running(todo[started])
            started += 1
            live.append(run)
            advance(run)

    def advance(run: _Running) -> None:
        """Resume ``run`` until it waits on something not yet over, or ends."""
        while True:
            try:
                w = next(run.steps)
            except StopIteration:
                live.remove(run)
                if not run.gated:
                    run.gated = True
                    start_next()
                return
            if w is None:
                if not run.gated:
                    run.gated = True
                    start_next()
            elif not w[0].test(w[1]):
                run.wait = w
                return

    while started < len(todo) or live:
        if not live:
            start_next()
            continue
        moved = False
        for run in list(live):
            pending, recv_only = run.wait
            if pending.test(recv_only):
                moved = True
                advance(run)
        if moved:
            continue
        reqs: list[Any] = []
        for run in live:
            r = run.wait[0].requests(run.wait[1])
            if r is None:
                reqs = []
                break
            reqs += r
        # Until any awaited request completes: Testany (MPI progresses every piece's
        # transfers inside it), then give the core away. Where ranks outnumber cores (or
        # share them with the kernel's network stack), a spin in Waitany takes the CPU from
        # the partner rank and the softirqs the other pieces need.
        if reqs and _poll(reqs, testany, sched_yield, stall):
            continue
        # A transport that cannot poll may never say its batch is over, or nothing moved
        # for the stall timeout: block in the earliest schedule's own wait, then resume it
        # without asking ``test`` again.
        first = live[0]
        pending, recv_only = first.wait
        if recv_only:
            pending.wait_recv()
        else:
            pending.wait()
        advance(first)


def _poll(reqs: list[Any], testany: Any, sched_yield: Any, stall: float | None) -> bool:
    """Poll ``reqs`` until one completes (True) or, with a stall timeout, until that long
    has passed without any completing (False)."""
    if stall is None:
        while not testany(reqs)[1]:
            sched_yield()
        return True
    deadline = time.monotonic() + stall
    while not testany(reqs)[1]:
        if time.monotonic() > deadline:
            return False
        sched_yield()
    return True


class _Running:
    """A started schedule: its generator, the wait it is suspended on, whether it has let
    the next schedule start."""

    __slots__ = ("steps", "wait", "gated")

    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.wait: tuple[Pending, bool] = (_DONE, False)
        self.gated = False


class _Done(Pending):
    """A wait that is over (a schedule's state before its first step)."""

    def wait(self) -> None:
        pass

    def test(self, recv_only: bool = False) -> bool:
        return True

    def requests(self, recv_only: bool = False) -> list[Any] | None:
        return []


_DONE = _Done()
