"""The progress watchdog: bound a wait on peers that never answer (``RINGTUNE_STALL_TIMEOUT``).

MPI over TCP blocks forever when a peer's host is gone or its link is down: no error, no
progress. With ``RINGTUNE_STALL_TIMEOUT=S`` (seconds; default off) the MPI transport waits
on its requests with ``Testall`` against a deadline instead of ``Waitall``; when none of a
batch's requests completes for ``S`` seconds it prints one line naming this rank, its host
and the peer ranks it waited on, and raises ``StallError`` (the CLI then aborts the job).
Off, the hot loop is the plain ``Waitall``: the check costs nothing unless asked for.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import PeerFailure

ENV = "RINGTUNE_STALL_TIMEOUT"


class StallError(PeerFailure):
    """No progress on a batch of sends/receives for ``RINGTUNE_STALL_TIMEOUT`` seconds (or,
    as ``collectives.shm``'s ``PeerGone``, a peer's process seen ended while waiting)."""


def env_seconds(name: str, meaning: str, environ: Any = None) -> float:
    """Seconds from environment variable ``name`` (0 when unset or empty); a negative,
    infinite or non-number value is a ``ValueError`` of one line naming the variable, its
    value and ``meaning`` (what the seconds are for). The one parser of the runtime's and
    the CLI's seconds-valued variables."""
    from safefiles.numbers import NumberError, parse_number

    text = (os.environ if environ is None else environ).get(name, "").strip()
    if not text:
        return 0.0
    try:
        return float(parse_number(text, name, kind=float, lo=0.0))
    except NumberError:
        raise ValueError(f"{name}={text!r}: expected a number of seconds >= 0 "
                         f"({meaning})") from None


def stall_timeout() -> float | None:
    """The configured stall timeout in seconds, ``None`` when off (unset, empty or 0)."""
    return env_seconds(ENV, "0 or unset: off") or None


def watched_waitall(timeout: float, comm: Any) -> Callable[[list[Any], Sequence[int]], None]:
    """A ``waitall(requests, peers)`` for ``comm`` that raises ``StallError`` after
    ``timeout`` seconds without completing any request; ``peers[i]`` is the rank of ``comm``
    request ``i`` talks to (-1: a collective of all ranks). Messages name world ranks."""
    from mpi4py import MPI

    testall, testany, null = MPI.Request.Testall, MPI.Request.Testany, MPI.REQUEST_NULL
    world = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                      MPI.COMM_WORLD.Get_group())
    rank = MPI.COMM_WORLD.Get_rank()

    def name(peers: set[int]) -> str:
        if -1 in peers:
            return "every other rank (a collective)"
        return "rank(s) " + ", ".join(str(world[p]) for p in sorted(peers))

    def waitall(reqs: list[Any], peers: Sequence[int]) -> None:
        deadline = time.monotonic() + timeout
        while not testall(reqs):
            if testany(reqs)[1]:  # some request completed: that is progress
                deadline = time.monotonic() + timeout
            elif time.monotonic() > deadline:
                stuck = {p for r, p in zip(reqs, peers) if r != null}
                msg = (f"rank {rank} ({socket.gethostname()}): no progress for {timeout:g} s "
                       f"waiting on {name(stuck)}: the "
                       f"peer's process or host died, or the link to it is down "
                       f"({ENV}={timeout:g})")
                print(f"ringtune: stall: {msg}", file=sys.stderr, flush=True)
                raise StallError(msg)
            else:
                time.sleep(0)  # yield the core: ranks may share one with their peers
    return waitall
