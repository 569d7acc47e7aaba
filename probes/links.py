"""Measured point-to-point links: bandwidth and latency between every pair of ranks.

Use ``measure(comm)`` (collective) when the structure alone cannot tell which links are
fast — a VM, a container, a cloud network. Pairs are scheduled as a round-robin tournament
(the circle method): in each round every rank has at most one partner, so n-1 rounds (n
rounds for odd n) cover all n(n-1)/2 pairs. Pairs of a round run in parallel only where
they touch different hosts (``split_by_host``): two pairs leaving one host would share its
uplink, and each would see a fraction of the link — the matrix is one flow's bandwidth.
Each pair runs a ping-pong: ``small_bytes`` for latency (half the round trip),
``message_bytes`` for bandwidth (bytes / half the round trip); the median of
``repetitions`` timed runs, after one warm-up, is kept.

Then, per tier of the network (``tiers``: hosts, then groups of hosts whose mutual
bandwidth is alike, e.g. racks), the ranks of two groups of that tier are paired and timed
all at once, both ways (``_exchange``): their per-flow bandwidth
(``Links.concurrent_gbps``) over the single flow's
says how much the group's ranks share its links (one uplink per host: 1/ranks per host).
The result is the same on all ranks.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Sequence
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


def split_by_host(pairs: Sequence[tuple[int, int]],
                  hosts: Sequence[int]) -> list[list[tuple[int, int]]]:
    """``pairs`` (disjoint ranks) in sub-rounds in which no host is in two pairs (greedy,
    order kept): a pair then has its hosts' links to itself."""
    out: list[list[tuple[int, int]]] = []
    used: list[set[int]] = []
    for a, b in pairs:
        mine = {hosts[a], hosts[b]}
        for sub, taken in zip(out, used):
            if not taken & mine:
                sub.append((a, b))
                taken |= mine
                break
        else:
            out.append([(a, b)])
            used.append(set(mine))
    return out


def tiers(bandwidth: Any, hosts: Sequence[int], alike: float = 1.5) -> list[list[int]]:
    """The network's tiers as seen by measurement: per tier, the group index of every rank,
    innermost first (tier 0: the host). Groups of a tier merge into one group of the next
    when the median bandwidth between them is within ``alike`` of the best remaining
    bandwidth between groups, so hosts whose mutual links are alike form a rack. The last
    tier is one group (the world); a world of one host has one tier."""
    import numpy as np

    bw = np.array([[np.nan if x is None else float(x) for x in row] for row in bandwidth],
                  dtype=float)
    n = len(hosts)
    names = sorted(set(hosts))
    group = [names.index(h) for h in hosts]
    out = [list(group)]
    while len(set(group)) > 1:
        k = len(set(group))
        gb = np.full((k, k), np.nan)
        for x in range(k):
            for y in range(x + 1, k):
                vals = [bw[i, j] for i in range(n) for j in range(n)
                        if group[i] == x and group[j] == y and np.isfinite(bw[i, j])]
                gb[x, y] = gb[y, x] = float(np.median(vals)) if vals else np.nan
        top = np.nanmax(gb) if np.isfinite(gb).any() else np.nan
        parent = list(range(k))
        for x in range(k):
            for y in range(x + 1, k):
                if not np.isfinite(top) or (np.isfinite(gb[x, y]) and gb[x, y] * alike >= top):
                    parent[_root(parent, y)] = _root(parent, x)
        roots = sorted({_root(parent, x) for x in range(k)})
        group = [roots.index(_root(parent, g)) for g in group]
        out.append(list(group))
    return out


def _root(parent: list[int], x: int) -> int:
    while parent[x] != x:
        x = parent[x]
    return x


def _pingpong(comm: Any, buf: Any, partner: int, lead: bool, reps: int) -> float:
    """Median round-trip time (s) of ``buf`` to ``partner`` and back."""
    times = []
    for it in range(reps + 1):
        t0 = time.perf_counter()
        if lead:
            comm.Send(buf, dest=partner, tag=77)
            comm.Recv(buf, source=partner, tag=77)
        else:
            comm.Recv(buf, source=partner, tag=77)
            comm.Send(buf, dest=partner, tag=77)
        if it:  # the first exchange is a warm-up (connection set-up, page faults)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _host_name(comm: Any) -> str:
    """This rank's host name: MPI's processor name on an mpi4py communicator, the system's
    host name on any other (a torch.distributed group: the same name on Linux)."""
    if type(comm).__module__.startswith("mpi4py"):
        from mpi4py import MPI

        return str(MPI.Get_processor_name())
    return socket.gethostname()


def measure(comm: Any, message_bytes: int = 1 << 22, small_bytes: int = 8,
            repetitions: int = 5) -> Links:
    """Collective: the bandwidth (GB/s) and latency (µs) matrix between all ranks, one flow
    per link, and the per-flow bandwidth of concurrent flows between groups of each tier."""
    import numpy as np

    n = comm.Get_size()
    rank = comm.Get_rank()
    names = comm.allgather(_host_name(comm))
    hosts = [sorted(set(names)).index(h) for h in names]
    big = np.zeros(max(1, int(message_bytes)), dtype=np.uint8)
    small = np.zeros(max(1, int(small_bytes)), dtype=np.uint8)
    mine: dict[int, tuple[float, float]] = {}
    for pairs in schedule(n):
        for sub in split_by_host(pairs, hosts):
            for a, b in sub:
                if rank in (a, b):
                    partner = b if rank == a else a
                    lead = rank == a
                    lat = _pingpong(comm, small, partner, lead, repetitions) / 2
                    bw_t = _pingpong(comm, big, partner, lead, repetitions) / 2
                    mine[partner] = (big.nbytes / bw_t / 1e9 if bw_t > 0 else 0.0, lat * 1e6)
            comm.Barrier()  # sub-rounds do not overlap: a pair has its links to itself
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
    conc = _concurrent(comm, big, bw, hosts, repetitions)
    return Links(bandwidth_gbps=tuple(tuple(row) for row in bw),
                 latency_us=tuple(tuple(row) for row in lat_m),
                 message_bytes=int(big.nbytes), small_bytes=int(small.nbytes),
                 repetitions=int(repetitions), concurrent_gbps=conc)


def concurrent_pairs(groups: Sequence[int], parents: Sequence[int]) -> list[tuple[int, int]]:
    """Rank pairs that load the links of one tier all at once: the ranks of the first group
    of the tier (in ``groups``) that shares its parent group with another, zipped with that
    other group's ranks. Empty when no group has a sibling of two or more ranks each."""
    n = len(groups)
    for g in sorted(set(groups)):
        members = [r for r in range(n) if groups[r] == g]
        parent = parents[members[0]]
        sibs = sorted({groups[r] for r in range(n) if parents[r] == parent and groups[r] > g})
        if sibs:
            other = [r for r in range(n) if groups[r] == sibs[0]]
            pairs = list(zip(members, other))
            return pairs if len(pairs) > 1 else []
    return []


def _exchange(comm: Any, buf: Any, partner: int | None, reps: int) -> float:
    """Collective: median time (s) of ``buf`` sent to ``partner`` while the same size comes
    back, every pair at once after a barrier (so that the flows really overlap: unsynchronised
    ping-pongs of two pairs would take turns on a link and hide its sharing)."""
    import numpy as np

    back = np.empty_like(buf)
    times = []
    for it in range(reps + 1):
        comm.Barrier()
        t0 = time.perf_counter()
        if partner is not None:
            comm.Sendrecv(buf, dest=partner, sendtag=78, recvbuf=back, source=partner,
                          recvtag=78)
        if it:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _concurrent(comm: Any, big: Any, bw: list[list[float | None]], hosts: Sequence[int],
                repetitions: int) -> tuple[tuple[float | None, ...], ...]:
    """Per tier, the pairs of ``concurrent_pairs`` timed all at once (collective); ``()``
    when no tier has such pairs (one rank per group everywhere)."""
    n = comm.Get_size()
    rank = comm.Get_rank()
    levels = tiers(bw, hosts)
    out: list[list[float | None]] = [[None] * n for _ in range(n)]
    found = False
    for inner, outer in zip(levels, levels[1:]):
        pairs = concurrent_pairs(inner, outer)
        if not pairs:
            continue
        found = True
        partner = next((b if rank == a else a for a, b in pairs if rank in (a, b)), None)
        t = _exchange(comm, big, partner, repetitions)
        got = None
        if partner is not None and t > 0:
            got = (min(rank, partner), max(rank, partner), big.nbytes / t / 1e9)
        for item in comm.allgather(got if got and got[0] == rank else None):
            if item is not None:
                a, b, v = item
                out[a][b] = out[b][a] = round(v, 4)
    return tuple(tuple(row) for row in out) if found else ()
