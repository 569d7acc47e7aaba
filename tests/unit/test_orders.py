"""Ring orders: identity/explicit orders as before, and ``order: topology`` from a probed
``Topology`` (recorded machines): every ring a permutation, hosts adjacent, the best links
used first, further rings on other links, measured links honoured."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from collectives.orders import (
    derived_cycles,
    host_grouped_order,
    ring_orders,
    validate_order,
)
from probes.rings import best_cycle, best_rings
from probes.topology import Host, Links, NumaNode, RankPlace, Topology
from tests.fixtures import MACHINES


def _world(hosts: list[Host], per_host: int) -> Topology:
    return Topology(hosts=tuple(hosts), ranks=tuple(
        RankPlace(rank=h * per_host + i, host=h, local_rank=i,
                  gpu=i if hosts[h].gpus else None,
                  numa_node=hosts[h].gpus[i].numa_node if hosts[h].gpus else 0)
        for h in range(len(hosts)) for i in range(per_host)))


def _edges(cycle: list[int]) -> list[tuple[int, int]]:
    return [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]


def _hosts_adjacent(cycle: list[int], hosts: tuple[int, ...]) -> bool:
    """Each host's ranks form one contiguous run of the cycle (cyclically)."""
    changes = sum(1 for a, b in _edges(cycle) if hosts[a] != hosts[b])
    return changes == (0 if len(set(hosts)) == 1 else len(set(hosts)))


# -- the behaviour kept from the runtime core ----------------------------------------------

def test_identity_and_explicit_orders_unchanged() -> None:
    assert ring_orders("identity", 3, 5) == derived_cycles(list(range(5)), 3)
    assert ring_orders("identity", 2, 4) == [[0, 1, 2, 3], [3, 2, 1, 0]]
    assert ring_orders([2, 0, 1], 2, 3) == [[2, 0, 1], [1, 0, 2]]
    assert ring_orders([[1, 0, 2], [2, 1, 0]], 2, 3) == [[1, 0, 2], [2, 1, 0]]
    assert ring_orders("topology", 1, 4, hosts=(1, 0, 1, 0)) == [[1, 3, 0, 2]]
    assert host_grouped_order((1, 0, 1, 0)) == [1, 3, 0, 2]
    with pytest.raises(ValueError, match="not a permutation"):
        ring_orders([0, 0, 1], 1, 3)
    with pytest.raises(ValueError, match="2 permutations given for 3 rings"):
        ring_orders([[0, 1], [1, 0]], 3, 2)
    assert validate_order("topology", 2, 4) == "topology"
    assert validate_order((0, 1), 1, 2) == [0, 1]


# -- topology orders ------------------------------------------------------------------------

@pytest.mark.parametrize("name", MACHINES)
@pytest.mark.parametrize("nhosts", [1, 2, 3])
def test_topology_rings_are_permutations_with_hosts_adjacent(
        machines: dict[str, Host], name: str, nhosts: int) -> None:
    topo = _world([machines[name]] * nhosts, 8)
    n = topo.world_size
    hosts = topo.rank_hosts()
    cycles = ring_orders("topology", 6, n, hosts, topo)
    assert len(cycles) == 6
    for c in cycles:
        assert sorted(c) == list(range(n))
        assert _hosts_adjacent(c, hosts), c
    assert cycles[1] == cycles[0][::-1]
    assert len({tuple(c) for c in cycles}) >= 3  # further rings take other cycles


def test_dgx1_ring_uses_only_double_nvlinks(machines: dict[str, Host]) -> None:
    """The hybrid cube-mesh has a Hamiltonian cycle of NV2 links; ring 0 must find it."""
    h = machines["dgx1-v100"]
    topo = _world([h], 8)
    ring = topo.ring_order()
    assert sorted(ring) == list(range(8))
    assert all(h.gpu_pair(a, b).nvlinks == 2 for a, b in _edges(ring))  # type: ignore
    # Ring 2 avoids re-using ring 0's links (same direction) where the mesh allows.
    r0, r1, r2 = topo.ring_orders(3)
    used = set(_edges(r0)) | set(_edges(r1))
    assert len(set(_edges(r2)) & used) < len(r2) // 2
    assert all(h.gpu_pair(a, b).nvlinks >= 1 for a, b in _edges(r2))  # type: ignore


def test_pcie_ring_crosses_sockets_twice_and_keeps_switch_pairs(
        machines: dict[str, Host]) -> None:
    h = machines["pcie-8gpu"]
    ring = _world([h], 8).ring_order()
    labels = [h.gpu_pair(a, b).label for a, b in _edges(ring)]  # type: ignore
    assert labels.count("SYS") == 2
    assert labels.count("PIX") == 4  # each PIX pair adjacent


def test_ring_order_brute_force_bottleneck() -> None:
    """On small random-like score matrices the search finds the best slowest link."""
    import random

    rnd = random.Random(7)
    for n in range(3, 8):
        score = [[0.0] * n for _ in range(n)]
        for a in range(n):
            for b in range(a + 1, n):
                score[a][b] = score[b][a] = float(rnd.randint(1, 9))
        best = max(min(score[c[i]][c[(i + 1) % n]] for i in range(n))
                   for c in ([0, *p] for p in itertools.permutations(range(1, n))))
        got = best_cycle(list(range(n)), score)
        assert min(score[a][b] for a, b in _edges(got)) == best


def test_measured_links_decide_the_order() -> None:
    """Four CPU ranks where the measurement says 0-1 and 2-3 are slow: the ring avoids them
    even though the structure cannot tell the ranks apart."""
    host = Host(name="vm", numa=(NumaNode(id=0, cpus=(0, 1, 2, 3)),))
    slow = {(0, 1), (1, 0), (2, 3), (3, 2)}
    bw = tuple(tuple(None if a == b else (0.5 if (a, b) in slow else 8.0) for b in range(4))
               for a in range(4))
    topo = Topology(hosts=(host,), ranks=tuple(RankPlace(rank=r, local_rank=r, numa_node=0)
                                               for r in range(4)),
                    links=Links(bandwidth_gbps=bw, latency_us=bw, message_bytes=1))
    ring = ring_orders("topology", 1, 4, (0,) * 4, topo)[0]
    assert not set(_edges(ring)) & slow
    # Without the measurement: plain rank order.
    plain = dataclasses.replace(topo, links=None)
    assert ring_orders("topology", 1, 4, (0,) * 4, plain)[0] == [0, 1, 2, 3]
    # Noise below the 25 % step does not reorder equal links.
    noisy = tuple(tuple(None if a == b else 8.0 + 0.1 * ((a * 3 + b) % 5) for b in range(4))
                  for a in range(4))
    quiet = dataclasses.replace(topo, links=Links(bandwidth_gbps=noisy, latency_us=noisy))
    assert quiet.ring_order() == [0, 1, 2, 3]


def test_sub_communicator_and_mismatched_topology(machines: dict[str, Host]) -> None:
    topo = _world([machines["dgx1-v100"]] * 2, 8)
    # The 8 ranks {0, 2, ..., 14} (4 per host) of a sub-communicator, in its rank order.
    sub = list(range(0, 16, 2))
    cycles = ring_orders("topology", 2, 8, (), topo, world_ranks=sub)
    hosts = tuple(topo.ranks[r].host for r in sub)
    for c in cycles:
        assert sorted(c) == list(range(8)) and _hosts_adjacent(c, hosts)
    # A topology of another world size falls back to grouping by host.
    assert ring_orders("topology", 2, 4, (0, 1, 0, 1), topo) == [[0, 2, 1, 3], [3, 1, 2, 0]]


def test_duck_typed_topology_with_only_ring_order() -> None:
    class Only:
        def ring_order(self) -> list[int]:
            return [2, 0, 3, 1]

    assert ring_orders("topology", 2, 4, (), Only()) == [[2, 0, 3, 1], [1, 3, 0, 2]]

    class Wrong:
        def ring_order(self) -> list[int]:
            return [0, 0, 1, 2]

    assert ring_orders("topology", 1, 4, (), Wrong()) == [[0, 1, 2, 3]]


def test_best_rings_edge_cases() -> None:
    assert best_rings([], [], 3) == []
    assert best_rings([[0.0]], [0], 2) == [[0], [0]]
    assert best_rings([[0.0, 1.0], [1.0, 0.0]], [0, 0], 3) == [[0, 1]] * 3
    # A big host takes the heuristic path and still gives permutations.
    n = 12
    score = [[float((a * b) % 7 + 1) if a != b else 0.0 for b in range(n)] for a in range(n)]
    for c in best_rings(score, [0] * n, 4):
        assert sorted(c) == list(range(n))


def test_multiring_call_path(machines: dict[str, Host]) -> None:
    """The algorithm's call path: ``ring_orders(order, rings, size, hosts, topology)``."""
    topo = _world([machines["pcie-8gpu"]], 8)
    perms = ring_orders("topology", 4, 8, topo.rank_hosts(), topo)
    assert perms == topo.ring_orders(4)
