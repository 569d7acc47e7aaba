"""Ring orders: which rank follows which in each ring of ``multiring``.

A ring order is a permutation of the ranks ``0..n-1`` read as a Hamiltonian cycle. Ring 0
follows the machine (ranks of one host adjacent, so only two edges of the cycle cross
hosts); further rings use different cycles — the reverse direction, then strides co-prime
with n — so that concurrent rings load different links.

With a probed ``probes.Topology`` (``order: topology``), the cycles come from the topology's
link scores (``Topology.ring_orders``): inside a host, consecutive ranks share the best link
(NVLink count, then PCIe level, then NUMA node; measured bandwidth first when links were
measured), the ring's slowest link is maximised, and rings k >= 2 reuse as few directed
links of earlier rings as possible while keeping hosts adjacent. Without a topology (or for
an object that only offers ``ring_order()``), the derived cycles above are used.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import Any


def _check_permutation(perm: Any, n: int, where: str) -> list[int]:
    if not isinstance(perm, (list, tuple)) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in perm
    ):
        raise ValueError(f"{where}: expected a list of rank numbers, got {perm!r}")
    if sorted(perm) != list(range(n)):
        raise ValueError(
            f"{where}: {list(perm)!r} is not a permutation of the ranks 0..{n - 1}; "
            f"list every rank exactly once"
        )
    return list(perm)


def derived_cycles(base: Sequence[int], rings: int) -> list[list[int]]:
    """``rings`` distinct cycles built from ``base``: base, reversed, then strided walks
    along base with strides co-prime with n (so each is still a Hamiltonian cycle)."""
    n = len(base)
    cycles: list[list[int]] = [list(base)]
    if rings > 1:
        cycles.append(list(reversed(base)) if n > 2 else list(base))
    stride = 2
    while len(cycles) < rings:
        # Walk base with a step co-prime with n: still visits every rank once; alternate
        # directions so neighbouring rings do not share a direction on the same edge.
        while stride < n and gcd(stride, n) != 1:
            stride += 1
        if stride >= n:
            cycles.append(list(cycles[len(cycles) % 2]))
            continue
        walk = [base[(i * stride) % n] for i in range(n)]
        if len(cycles) % 2:
            walk.reverse()
        cycles.append(walk)
        stride += 1
    return cycles[:rings]


def host_grouped_order(hosts: Sequence[int]) -> list[int]:
    """Ranks sorted so that those on one host are adjacent (stable within a host)."""
    return sorted(range(len(hosts)), key=lambda r: (hosts[r], r))


def ring_orders(
    order: Any, rings: int, size: int, hosts: Sequence[int] = (), topology: Any = None,
    world_ranks: Sequence[int] = (),
) -> list[list[int]]:
    """The ``rings`` cycles for the ``order`` parameter of ``multiring``.

    ``order`` is ``"identity"`` (0, 1, …, n−1 and its derived cycles), ``"topology"``
    (from the probed topology when given, else ranks grouped by host), a single
    permutation (ring 0; further rings derived from it) or a list of ``rings``
    permutations, one per ring. ``world_ranks``: for a sub-communicator, the world rank
    of each of its ranks (so a world topology can order it).
    """
    if order == "identity":
        return derived_cycles(list(range(size)), rings)
    if order == "topology":
        if topology is not None:
            from_topology = _topology_cycles(topology, rings, size, world_ranks)
            if from_topology is not None:
                return from_topology
        base = host_grouped_order(hosts) if len(hosts) == size else list(range(size))
        return derived_cycles(base, rings)
    if isinstance(order, (list, tuple)) and order and all(
        isinstance(x, (list, tuple)) for x in order
    ):
        if len(order) != rings:
            raise ValueError(
                f"order: {len(order)} permutations given for {rings} rings; give one per "
                f"ring or a single permutation"
            )
        return [_check_permutation(p, size, f"order[{k}]") for k, p in enumerate(order)]
    if isinstance(order, (list, tuple)):
        return derived_cycles(_check_permutation(order, size, "order"), rings)
    raise ValueError(
        f"order: expected 'topology', 'identity' or a list of permutations of the ranks, "
        f"got {order!r}"
    )


def _topology_cycles(topology: Any, rings: int, size: int,
                     world_ranks: Sequence[int] = ()) -> list[list[int]] | None:
    """Cycles from a probed ``Topology`` (``None`` when it cannot say more than hosts).

    Every cycle is checked to be a permutation of ``0..size-1``: a topology that does not
    describe this communicator (other world size) falls back to the host grouping."""
    world = getattr(topology, "world_size", None)
    sub = list(world_ranks) if world_ranks else None
    if sub is not None:
        if len(sub) != size:
            return None
        if sub == list(range(size)) and world == size:
            sub = None  # the world itself
        elif isinstance(world, int) and not all(0 <= r < world for r in sub):
            return None
    if sub is None and isinstance(world, int) and world != size:
        return None
    many = getattr(topology, "ring_orders", None)
    cycles: list[list[int]] | None = None
    if callable(many):
        cycles = many(rings, sub) if sub is not None else many(rings)
    else:
        base = getattr(topology, "ring_order", None)
        if callable(base) and sub is None:
            perm = base()
            if perm is not None:
                cycles = derived_cycles(list(perm), rings)
    if not cycles or len(cycles) != rings:
        return None
    want = list(range(size))
    if any(sorted(c) != want for c in cycles):
        return None
    return [list(c) for c in cycles]


def validate_order(order: Any, rings: int, size: int) -> Any:
    """Check an ``order`` parameter without building topology cycles (no communication)."""
    if order in ("identity", "topology"):
        return order
    ring_orders(order, rings, size)
    if isinstance(order, tuple):
        return list(order)
    return order
