"""A cost-model ``Cluster`` from measured link matrices (``calibrate``).

Use it when you hold per-pair bandwidth and latency figures — ``probes.links.measure``'s
result, a ``Topology`` with links, or a ``(bandwidth, latency)`` pair of matrices — and
want the tiered cluster the model of ``autotune.model`` runs on; ``best_guesses`` calls it
on whatever calibration it is given. To calibrate from this machine's timed primitives
instead, use ``autotune.primitives.measure``.

The tiers are the ones the measurement shows (``probes.links.tiers``): the host, then
groups of hosts whose mutual bandwidth is alike (racks), up to the world — two levels for
hosts on one switch, three for racks. Each level's bandwidth is one flow's (the probe times
pairs that share a host one at a time); where the probe also timed a group's ranks all at
once (``Links.concurrent_gbps``), their per-flow share of it is the level's
``links_per_rank`` (0.5: two ranks share one uplink), so the model sees the sharing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from probes.links import tiers

from .cluster import Cluster, Level


def _matrix(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    # ``probes.links.Links`` keeps ``None`` on the diagonal.
    try:
        arr = np.array([[np.nan if x is None else x for x in row] for row in value],
                       dtype=float)
    except (TypeError, ValueError):
        raise ValueError("calibration: expected a square matrix of numbers") from None
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        raise ValueError(f"calibration: expected a square matrix, got shape {arr.shape}")
    return arr


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, Mapping) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def calibrate(source: Any, hosts: Sequence[int] | None = None, memory_gbs: float | None = None,
              overhead_us: float | None = None, name: str = "calibrated",
              native_model: str = "best") -> Cluster:
    """A ``Cluster`` of this world from measurements.

    ``source`` is a ``Cluster`` (returned as is), a mapping or object with
    ``bandwidth_gbs`` and ``latency_us`` n×n matrices (``probes.links.measure``'s result,
    or a ``Topology`` whose ``links`` holds one), or a ``(bandwidth, latency)`` pair of
    matrices. ``hosts`` (host index per rank) gives the innermost tier; the outer ones are
    found in the bandwidth between hosts (``probes.links.tiers``), one level each. Without
    ``hosts``, a ``Topology``'s layout is used when it has one. A ``concurrent_gbps``
    matrix next to the bandwidth (``probes.links.measure``) sets each outer level's
    ``links_per_rank``; without one, every rank is taken to have a link of its own.
    ``native_model`` (``Cluster.native_model``): the cost model of the MPI library whose
    MPI_Allreduce ``native`` is on host buffers (``collectives.natives``: a library's
    ``cost_model``; the model then follows that library's selection, its node-aware
    composition across hosts included), ``"best"`` for an ideal library.
    """
    if isinstance(source, Cluster):
        return source
    links = _get(source, "links") if not isinstance(source, tuple) else None
    holder = links if links is not None else source
    if isinstance(holder, tuple) and len(holder) == 2:
        bw, lat = _matrix(holder[0]), _matrix(holder[1])
    else:
        bw = _matrix(_get(holder, "bandwidth_gbps", "bandwidth_gbs", "bandwidth"))
        lat = _matrix(_get(holder, "latency_us", "latency"))
    if bw is None or lat is None:
        raise ValueError("calibration: need a bandwidth (GB/s) and a latency (µs) matrix "
                         "(probes.links.measure), a (bandwidth, latency) pair or a Cluster")
    raw = _get(holder, "concurrent_gbps")
    conc = _matrix(raw) if raw is not None and len(raw) else None
    n = bw.shape[0]
    if hosts is None:
        hosts = _topology_hosts(source, n)
    hosts = list(hosts) if hosts is not None and len(hosts) == n else [0] * n
    if conc is not None and conc.shape != bw.shape:
        conc = None
    off = ~np.eye(n, dtype=bool)
    mem = memory_gbs if memory_gbs is not None else measure_memory_gbs()
    groups = _nested_tiers(bw, hosts)
    if groups is None:  # tiers that the model cannot number contiguously: host / network
        same = _together(hosts) & off
        per_host = max(1, n // max(1, len(set(hosts))))
        groups = [[r // per_host for r in range(n)], [0] * n] if (off & ~same).any() \
            else [[0] * n]
    if overhead_us is not None:
        over = overhead_us
    else:
        # The per-message software cost is half a tiny round trip on the *fastest* tier,
        # where the wire adds least (``primitives.measure`` takes the same: half its smallest
        # tiny step). The median over every pair was mostly pairs across hosts on a few
        # hosts (8 of 12 at 2 x 2), so it charged the network's wire latency to software —
        # and to each of the thousands of shared-memory hand-offs of a library's node-aware
        # allreduce (a library module's model, ``collectives.natives``). The fastest tier is
        # the innermost one with a pair of ranks in it: ranks sharing a host, else (one rank
        # per host) sharing a rack, and so on out.
        over = 0.5 * _median(lat[_innermost_pairs([hosts, *groups], off)], 10.0)
    levels = []
    outer = len(groups) - 1
    for t, tier in enumerate(groups):
        inner = groups[t - 1] if t else list(range(n))
        # Pairs whose nearest common group is this tier's.
        mask = _together(tier) & ~_together(inner) & off
        units = len({inner[r] for r in range(n) if tier[r] == tier[0]}) if t else \
            sum(1 for r in range(n) if tier[r] == tier[0])
        share = 1.0
        below = sum(1 for r in range(n) if inner[r] == inner[0]) if t else 1
        if conc is not None and t:
            ratios = [conc[i, j] / bw[i, j] for i in range(n) for j in range(n)
                      if mask[i, j] and np.isfinite(conc[i, j]) and np.isfinite(bw[i, j])
                      and bw[i, j] > 0]
            if ratios:
                share = float(min(1.0, max(1.0 / below, float(np.median(ratios)))))
        label = "host" if t == 0 else ("network" if outer == 1 else f"tier{t}")
        levels.append(Level(label, max(1, units), _median(bw[mask], 1.0),
                            max(0.0, _median(lat[mask], 1.0) - over), share, True, "measured"))
    return Cluster(name=name, levels=tuple(levels), memory_gbs=mem, overhead_us=over,
                   description=f"calibrated from measured links ({len(levels)} tiers)",
                   native_model=native_model)


def _together(groups: Sequence[Any]) -> np.ndarray:
    """The n x n mask of rank pairs in one group (``groups``: a group label per rank)."""
    g = np.asarray(list(groups))
    return g[:, None] == g[None, :]


def _innermost_pairs(groupings: Sequence[Sequence[Any]], off: np.ndarray) -> np.ndarray:
    """The pairs of distinct ranks (``off``) that share a group, in the first of
    ``groupings`` where any do; every pair of ``off`` where none do."""
    for g in groupings:
        mask = _together(g) & off
        if mask.any():
            return mask
    return off


def _nested_tiers(bw: np.ndarray, hosts: Sequence[int]) -> list[list[int]] | None:
    """``probes.links.tiers`` of the matrix when every tier's groups are equal-sized runs of
    consecutive ranks (the model numbers each group contiguously), else ``None`` (ranks of
    a host placed round-robin, hosts of unequal size)."""
    n = len(hosts)
    found = tiers(bw.tolist(), hosts)
    out = []
    for tier in found:
        sizes = []
        start = 0
        for r in range(1, n + 1):
            if r == n or tier[r] != tier[start]:
                sizes.append(r - start)
                start = r
        if len(set(sizes)) != 1 or len(sizes) != len(set(tier)):
            return None
        out.append(list(tier))
    return out


def _median(values: np.ndarray, default: float) -> float:
    v = values[np.isfinite(values) & (values > 0)]
    return float(np.median(v)) if v.size else default


def _topology_hosts(topology: Any, n: int) -> list[int] | None:
    """Host index per rank from a ``probes.Topology`` (``rank_hosts()``) or a layout list."""
    rank_hosts = getattr(topology, "rank_hosts", None)
    if callable(rank_hosts):
        try:
            hosts = [int(h) for h in rank_hosts()]
        except (TypeError, ValueError):
            hosts = []
        if len(hosts) == n:
            return hosts
    layout = _get(topology, "layout", "ranks")
    if layout is None:
        return None
    try:
        hosts = [int(_get(r, "host", "host_index")) for r in layout]
    except (TypeError, ValueError):
        return None
    return hosts if len(hosts) == n else None


def measure_memory_gbs(nbytes: int = 8 << 20, repeats: int = 5) -> float:
    """Memory bandwidth as a reduction sees it: 3 × bytes of ``dst += src`` per second."""
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.ones_like(a)
    np.add(a, b, out=a)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * nbytes / best / 1e9
