"""Measured point-to-point links: bandwidth and latency between every pair of ranks.

Use ``measure(comm)`` (collective) when the structure alone cannot tell which links are
fast — a VM, a container, a cloud network. Pairs are scheduled as a round-robin tournament
(the circle method): in each round every rank has at most one partner, so n-1 rounds (n
rounds for odd n) cover all n(n-1)/2 pairs and the pairs of a round run in parallel without
sharing a rank. Each pair runs a ping-pong: ``small_bytes`` for latency (half the round
trip), ``message_bytes`` for bandwidth (bytes / half the round trip); the median of
``repetitions`` timed runs, after one warm-up, is kept. The result is the same on all ranks.
"""

from __future__ import annotations

import statistics
from typing import Any

from .topology import Links


def schedule(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs ``(a, b)``, ``a < b``, covering every pair once."""
    if n < 2:
        return []
    players: list[int | None] = list(range(n))
    if n % 2:
        players.append(None)  # the bye: whoever meets it sits the round out
    m = len(players)
    rounds: list[list[tuple[int, int]]] = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _pingpong(comm: Any, buf: Any, partner: int, lead: bool, reps: int) -> float:
    """Median round-trip time (s) of ``buf`` to ``partner`` and back."""
    from mpi4py import MPI

    times = []
    for it in range(reps + 1):
        t0 = MPI.Wtime()
        if lead:
            comm.Send(buf, dest=partner, tag=77)
            comm.Recv(buf, source=partner, tag=77)
        else:
            comm.Recv(buf, source=partner, tag=77)
            comm.Send(buf, dest=partner, tag=77)
        if it:  # the first exchange is a warm-up (connection set-up, page faults)
            times.append(MPI.Wtime() - t0)
    return statistics.median(times)


def measure(comm: Any, message_bytes: int = 1 << 22, small_bytes: int = 8,
            repetitions: int = 5) -> Links:
    """Collective: the bandwidth (GB/s) and latency (µs) matrix between all ranks."""
    import numpy as np

    n = comm.Get_size()
    rank = comm.Get_rank()
    big = np.zeros(max(1, int(message_bytes)), dtype=np.uint8)
    small = np.zeros(max(1, int(small_bytes)), dtype=np.uint8)
    mine: dict[int, tuple[float, float]] = {}
    for pairs in schedule(n):
        for a, b in pairs:
            if rank in (a, b):
                partner = b if rank == a else a
                lead = rank == a
                lat = _pingpong(comm, small, partner, lead, repetitions) / 2
                bw_t = _pingpong(comm, big, partner, lead, repetitions) / 2
                mine[partner] = (big.nbytes / bw_t / 1e9 if bw_t > 0 else 0.0, lat * 1e6)
        comm.Barrier()  # rounds do not overlap: a round's pairs have the links to themselves
    everyone = comm.allgather(mine)
    bw: list[list[float | None]] = [[None] * n for _ in range(n)]
    lat_m: list[list[float | None]] = [[None] * n for _ in range(n)]
    for r, results in enumerate(everyone):
        for p, (b, lt) in results.items():
            # Both ends measured the same exchange; keep rank-pair symmetric values from the
            # leading (lower) rank, which timed it.
            lo = min(r, p)
            if r == lo:
                bw[r][p] = bw[p][r] = round(b, 4)
                lat_m[r][p] = lat_m[p][r] = round(lt, 3)
    return Links(bandwidth_gbps=tuple(tuple(row) for row in bw),
                 latency_us=tuple(tuple(row) for row in lat_m),
                 message_bytes=int(big.nbytes), small_bytes=int(small.nbytes),
                 repetitions=int(repetitions))
