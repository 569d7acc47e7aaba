"""Searching ring orders on a matrix of link scores: pure functions, no MPI, no I/O.

Use ``best_rings(score, hosts, rings)`` when you know, for every pair of ranks, how good the
link between them is (higher is better) and which host each rank is on. Ring 0 keeps the
ranks of one host adjacent (only two edges of the cycle cross hosts per host) and, inside a
host, maximises the ring's slowest link, then the sum of its links. Ring 1 is ring 0
reversed (full-duplex links: the other direction is idle in ring 0). Ring k >= 2 is a
further cycle in which a directed link already used by u earlier rings counts 1/(u+1) of
its score (the rings would share it), so it prefers links the earlier rings left idle.
Inside a host of up to ``EXACT_LIMIT`` ranks the search is exhaustive; larger hosts use a
greedy start, improved by 2-opt moves up to ``TWO_OPT_LIMIT`` ranks (a 2-opt pass costs
O(n³): 256 ranks took 2 s, 1024 did not end in 10 minutes).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

#: Largest host (ranks) searched exhaustively: 7! = 5040 cycles per ring.
EXACT_LIMIT = 8
#: Largest host (ranks) whose greedy cycle is improved by 2-opt (~0.3 s at 128).
TWO_OPT_LIMIT = 128

Score = Sequence[Sequence[float]]


def _cycle_value(cycle: Sequence[int], score: Score, used: dict[tuple[int, int], int],
                 closed: bool) -> tuple[float, float]:
    """(slowest link, sum of links): larger is better. A directed link already used by
    ``u`` earlier rings counts ``score / (u + 1)``: concurrent rings share its bandwidth."""
    m = len(cycle)
    if m < 2:
        return (0.0, 0.0)
    edges = m if closed else m - 1
    worst = float("inf")
    total = 0.0
    for i in range(edges):
        a, b = cycle[i], cycle[(i + 1) % m]
        s = score[a][b] / (1 + used.get((a, b), 0))
        total += s
        if s < worst:
            worst = s
    return (worst, total)


def _exact_cycle(nodes: Sequence[int], score: Score,
                 used: dict[tuple[int, int], int]) -> list[int]:
    first, rest = nodes[0], list(nodes[1:])
    m = len(nodes)
    # Effective scores of directed links once, then every cycle through ``first``; a cycle
    # is dropped as soon as one of its links is below the best slowest link found so far.
    eff = {(a, b): score[a][b] / (1 + used.get((a, b), 0)) for a in nodes for b in nodes}
    best: list[int] = list(nodes)
    best_worst, best_total = _cycle_value(best, score, used, True)
    for perm in itertools.permutations(rest):
        cand = (first, *perm)
        worst = float("inf")
        total = 0.0
        for i in range(m):
            s = eff[cand[i], cand[(i + 1) % m]]
            if s < best_worst:
                break
            total += s
            if s < worst:
                worst = s
        else:
            # strict: ties keep the first found (closest to rank order)
            if (worst, total) > (best_worst, best_total):
                best, best_worst, best_total = list(cand), worst, total
    return best


def _heuristic_cycle(nodes: Sequence[int], score: Score,
                     used: dict[tuple[int, int], int]) -> list[int]:
    # Greedy: from the first rank, always go to the best unvisited neighbour (least reused).
    left = list(nodes[1:])
    cycle = [nodes[0]]
    while left:
        cur = cycle[-1]
        nxt = max(left, key=lambda r: (score[cur][r], -used.get((cur, r), 0), -r))
        cycle.append(nxt)
        left.remove(nxt)
    # 2-opt: reverse a segment while that improves the value; bounded passes.
    best_val = _cycle_value(cycle, score, used, True)
    for _ in range(4 if len(cycle) <= TWO_OPT_LIMIT else 0):
        improved = False
        for i in range(1, len(cycle) - 1):
            for j in range(i + 1, len(cycle)):
                cand = cycle[:i] + cycle[i:j + 1][::-1] + cycle[j + 1:]
                val = _cycle_value(cand, score, used, True)
                if val > best_val:
                    cycle, best_val, improved = cand, val, True
        if not improved:
            break
    return cycle


def best_cycle(nodes: Sequence[int], score: Score,
               used: dict[tuple[int, int], int] | None = None) -> list[int]:
    """The best Hamiltonian cycle through ``nodes`` (starting at ``nodes[0]``)."""
    used = used or {}
    if len(nodes) <= 3 and not used:
        return list(nodes)  # every cycle of <= 3 nodes has the same edges
    if len(nodes) <= EXACT_LIMIT:
        return _exact_cycle(nodes, score, used)
    return _heuristic_cycle(nodes, score, used)


def _cut(cycle: list[int], score: Score, ends: dict[tuple[int, int], int]) -> list[int]:
    """Open a cycle into a path at its weakest edge (that edge becomes the hop to the next
    host, which is slower anyway); among equal edges prefer endpoints not used before."""
    m = len(cycle)
    if m <= 1:
        return cycle

    def key(i: int) -> tuple[float, int, int]:
        a, b = cycle[i], cycle[(i + 1) % m]
        return (score[a][b], ends.get((a, b), 0), i)

    i = min(range(m), key=key)
    return cycle[i + 1:] + cycle[:i + 1]


def best_rings(score: Score, hosts: Sequence[int], rings: int) -> list[list[int]]:
    """``rings`` cycles over ranks ``0..n-1`` (see the module docstring)."""
    n = len(hosts)
    if n == 0 or rings < 1:
        return []
    order = sorted(set(hosts))
    blocks = [[r for r in range(n) if hosts[r] == h] for h in order]
    used: dict[tuple[int, int], int] = {}
    ends: dict[tuple[int, int], int] = {}
    out: list[list[int]] = []
    for k in range(rings):
        if k == 1:
            ring = list(reversed(out[0])) if n > 2 else list(out[0])
        elif len(blocks) == 1:
            ring = best_cycle(blocks[0], score, used)
        else:
            paths = []
            for block in blocks:
                path = _cut(best_cycle(block, score, used), score, ends)
                ends[(path[-1], path[0])] = ends.get((path[-1], path[0]), 0) + 1
                paths.append(path)
            if k % 2:
                paths = [p[::-1] for p in reversed(paths)]
            ring = [r for p in paths for r in p]
        for i in range(n):
            edge = (ring[i], ring[(i + 1) % n])
            used[edge] = used.get(edge, 0) + 1
        out.append(ring)
    return out
