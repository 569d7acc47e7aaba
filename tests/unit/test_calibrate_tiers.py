"""Calibration builds the tiers the link matrix shows (host, rack, world) and the sharing
of a tier's links that the probe's concurrent pairs measured (issue 10)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from autotune.calibrate import calibrate
from autotune.model import Model
from probes.links import concurrent_pairs, schedule, split_by_host, tiers
from probes.topology import Links, RankPlace, Topology

Matrix = tuple[tuple[float | None, ...], ...]


def _matrix(n: int, value: Callable[[int, int], float | None]) -> Matrix:
    return tuple(tuple(None if i == j else value(i, j) for j in range(n)) for i in range(n))


def test_split_by_host_never_puts_one_host_in_two_pairs() -> None:
    hosts = [0, 0, 1, 1, 2, 2]
    for pairs in schedule(6):
        subs = split_by_host(pairs, hosts)
        assert sorted(p for s in subs for p in s) == sorted(pairs)
        for sub in subs:
            seen = [h for a, b in sub for h in {hosts[a], hosts[b]}]
            assert len(seen) == len(set(seen)), sub
    # One rank per host: a round's pairs stay together.
    assert split_by_host([(0, 3), (1, 2)], [0, 1, 2, 3]) == [[(0, 3), (1, 2)]]


def test_tiers_find_racks_from_bandwidth() -> None:
    rack = [0, 0, 1, 1]
    bw = _matrix(4, lambda i, j: 0.10 if rack[i] == rack[j] else 0.035)
    found = tiers(bw, [0, 1, 2, 3])
    assert found == [[0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 0, 0]]
    assert concurrent_pairs(found[0], found[1]) == []          # one rank per host
    assert concurrent_pairs(found[1], found[2]) == [(0, 2), (1, 3)]
    # Alike links (noise within 1.5x) are one tier.
    flat = _matrix(4, lambda i, j: 0.10 if (i + j) % 2 else 0.08)
    assert tiers(flat, [0, 1, 2, 3]) == [[0, 1, 2, 3], [0, 0, 0, 0]]
    assert tiers(_matrix(2, lambda i, j: 1.0), [0, 0]) == [[0, 0]]


def test_calibration_has_three_tiers_and_their_sharing() -> None:
    n = 4
    rack = [0, 0, 1, 1]
    bw = _matrix(n, lambda i, j: 0.12 if rack[i] == rack[j] else 0.06)
    lat = _matrix(n, lambda i, j: 100.0 if rack[i] == rack[j] else 200.0)
    conc = _matrix(n, lambda i, j: 0.03 if rack[i] != rack[j] and i % 2 == j % 2 else None)
    topo = Topology(ranks=tuple(RankPlace(rank=r, host=r) for r in range(n)),
                    links=Links(bandwidth_gbps=bw, latency_us=lat, concurrent_gbps=conc))
    c = calibrate(topo, memory_gbs=10.0, overhead_us=10.0)
    assert [lv.size for lv in c.levels] == [1, 2, 2]
    assert [lv.bandwidth_gbs for lv in c.levels[1:]] == [0.12, 0.06]
    assert [lv.latency_us for lv in c.levels[1:]] == [90.0, 190.0]
    # The two ranks of a rack each got half of one flow's bandwidth: they share its uplink.
    assert c.levels[2].links_per_rank == pytest.approx(0.5)
    assert c.levels[1].links_per_rank == 1.0
    m = Model(c)
    grid = float(m.time("hierarchical", {"dims": [2, 2]}, [1 << 24])[0])
    flat = float(m.time("multiring", {"rings": 1}, [1 << 24])[0])
    assert grid < flat  # DDL's grid per tier moves less across the slow tier


def test_calibration_two_hosts_shared_uplink() -> None:
    n = 4
    host = [0, 0, 1, 1]
    bw = _matrix(n, lambda i, j: 0.6 if host[i] == host[j] else 0.118)
    lat = _matrix(n, lambda i, j: 40.0 if host[i] == host[j] else 120.0)
    conc = _matrix(n, lambda i, j: 0.062 if (i, j) in {(0, 2), (2, 0), (1, 3), (3, 1)}
                   else None)
    c = calibrate({"bandwidth_gbps": bw, "latency_us": lat, "concurrent_gbps": conc},
                  hosts=host, memory_gbs=10.0, overhead_us=10.0)
    assert [lv.size for lv in c.levels] == [2, 2]
    assert c.levels[1].links_per_rank == pytest.approx(0.062 / 0.118)
    # Without the concurrent figures each rank is taken to have a link of its own.
    alone = calibrate((np.array(bw, dtype=float), np.array(lat, dtype=float)), hosts=host,
                      memory_gbs=10.0, overhead_us=10.0)
    assert alone.levels[1].links_per_rank == 1.0
    # Ranks of a host not numbered together: the host / network split of before.
    rr = calibrate({"bandwidth_gbps": bw, "latency_us": lat}, hosts=[0, 1, 0, 1],
                   memory_gbs=10.0, overhead_us=10.0)
    assert [lv.size for lv in rr.levels] == [2, 2]


def test_per_message_cost_is_taken_on_the_fastest_tier() -> None:
    """Half a tiny round trip between ranks of one host, not the median over every pair:
    on 2 hosts x 2 ranks 8 of the 12 pairs cross hosts, and their wire latency is not
    software (it was charged to each of MPICH's shared-memory hand-offs)."""
    host = [0, 0, 1, 1]
    bw = _matrix(4, lambda i, j: 2.0 if host[i] == host[j] else 0.12)
    lat = _matrix(4, lambda i, j: 22.0 if host[i] == host[j] else 64.0)
    c = calibrate({"bandwidth_gbps": bw, "latency_us": lat}, hosts=host, memory_gbs=10.0)
    assert c.overhead_us == pytest.approx(11.0)
    assert [lv.latency_us for lv in c.levels] == pytest.approx([11.0, 53.0])
    # Ranks of a host not numbered together: still the pairs that share a host.
    rr = calibrate({"bandwidth_gbps": _matrix(4, lambda i, j: 2.0 if i % 2 == j % 2 else 0.12),
                    "latency_us": _matrix(4, lambda i, j: 22.0 if i % 2 == j % 2 else 64.0)},
                   hosts=[0, 1, 0, 1], memory_gbs=10.0)
    assert rr.overhead_us == pytest.approx(11.0)
    # One rank per host: the innermost tier with pairs, the racks.
    rack = [0, 0, 1, 1]
    racks = calibrate({"bandwidth_gbps": _matrix(4, lambda i, j: 0.12 if rack[i] == rack[j]
                                                 else 0.06),
                       "latency_us": _matrix(4, lambda i, j: 80.0 if rack[i] == rack[j]
                                             else 200.0)},
                      hosts=[0, 1, 2, 3], memory_gbs=10.0)
    assert racks.overhead_us == pytest.approx(40.0)
    # One host: every pair is on the fastest tier, as before.
    one = calibrate({"bandwidth_gbps": _matrix(3, lambda i, j: 2.0),
                     "latency_us": _matrix(3, lambda i, j: 6.0 + i + j)},
                    hosts=[0, 0, 0], memory_gbs=10.0)
    assert one.overhead_us == pytest.approx(0.5 * 8.0)
    # And the model of MPICH's node-aware allreduce pays that per hand-off, not the network's.
    slow = calibrate({"bandwidth_gbps": bw, "latency_us": lat}, hosts=host, memory_gbs=10.0,
                     overhead_us=0.5 * 43.0, native_model="mpich")
    fast = calibrate({"bandwidth_gbps": bw, "latency_us": lat}, hosts=host, memory_gbs=10.0,
                     native_model="mpich")
    size = [64 << 20]
    assert float(Model(fast).time("native", {}, size)[0]) \
        < float(Model(slow).time("native", {}, size)[0])
