"""A cost-model ``Cluster`` from measured link matrices (``calibrate``).

Use it when you hold per-pair bandwidth and latency figures — ``probes.links.measure``'s
result, a ``Topology`` with links, or a ``(bandwidth, latency)`` pair of matrices — and
want the two-level (within host / between hosts) cluster the model of ``autotune.model``
runs on; ``best_guesses`` calls it on whatever calibration it is given. To calibrate from
this machine's timed primitives instead, use ``autotune.primitives.measure``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

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
              overhead_us: float | None = None, name: str = "calibrated") -> Cluster:
    """A ``Cluster`` of this world from measurements.

    ``source`` is a ``Cluster`` (returned as is), a mapping or object with
    ``bandwidth_gbs`` and ``latency_us`` n×n matrices (``probes.links.measure``'s result,
    or a ``Topology`` whose ``links`` holds one), or a ``(bandwidth, latency)`` pair of
    matrices. ``hosts`` (host index per rank) splits pairs into within-host and
    between-host levels; without it, a ``Topology``'s layout is used when it has one.
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
    n = bw.shape[0]
    if hosts is None:
        hosts = _topology_hosts(source, n)
    hosts = list(hosts) if hosts is not None and len(hosts) == n else [0] * n
    off = ~np.eye(n, dtype=bool)
    same = np.array([[hosts[i] == hosts[j] for j in range(n)] for i in range(n)]) & off
    cross = off & ~same
    mem = memory_gbs if memory_gbs is not None else measure_memory_gbs()
    over = overhead_us if overhead_us is not None else 0.5 * _median(lat[off], 10.0)
    per_host = max(1, n // max(1, len(set(hosts))))
    levels = [Level("host", per_host if cross.any() else n, _median(bw[same], 1.0),
                    max(0.0, _median(lat[same], 1.0) - over), 1.0, True, "measured")]
    if cross.any():
        levels.append(Level("network", n // per_host, _median(bw[cross], 1.0),
                            max(0.0, _median(lat[cross], 1.0) - over), 1.0, True, "measured"))
    return Cluster(name=name, levels=tuple(levels), memory_gbs=mem, overhead_us=over,
                   description="calibrated from measured links")


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
