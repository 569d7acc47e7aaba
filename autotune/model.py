"""The α–β cost model: predicted allreduce time of every algorithm and configuration on a
tiered cluster.

Use it to plan a cluster you do not have (``ringtune simulate``), to warm-start the tuner
(``best_guesses``: the configurations the tuner enqueues first), and to see why an
algorithm wins where it does. It predicts, it never replaces measurement: the tuner still
times every candidate.

The model replays each algorithm's real communication schedule (the ring orders of
``collectives.orders``, the partners of recursive halving/doubling, the sub-groups of a
``hierarchical`` grid) as sets of concurrent flows between ranks. One step takes as long
as its slowest flow: ``α + bytes / bandwidth``, where α is the latency of the outermost
level the flow crosses, and the bandwidth is that level's link bandwidth shared among the
flows that compete for it — the flows of one rank (``links_per_rank``, ``shared``) and the
flows of all ranks of the group below that leave through the same links (a NIC shared by a
host's GPUs). Reduce-scatter steps add the reduction of the received piece at
``memory_gbs / 3`` (read two arrays, write one); chunking (``chunk_bytes``) overlaps that
with the transfer. Every posted message costs ``overhead_us`` of software time.

What it leaves out, on purpose: switch congestion inside a level (levels are non-blocking),
the PCIe hop between a GPU and its NIC, protocol effects (eager/rendezvous thresholds), and
CPU oversubscription (more ranks than cores), which is why validation on a small machine is
reported, not assumed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collectives.algorithms.hierarchical import check_grid_fits_hosts, factorisations
from collectives.orders import derived_cycles

from .cluster import Cluster, Level

#: The algorithms the model knows, in display order.
ALGORITHMS: tuple[str, ...] = ("native", "multiring", "rhd", "hierarchical")
#: Configurations searched for ``best`` (chunk 0 = whole segment).
RINGS: tuple[int, ...] = (1, 2, 4, 8)
CHUNKS: tuple[int, ...] = (0, 1 << 18, 1 << 20, 1 << 22)
HIER_RINGS: tuple[int, ...] = (1, 2, 4)
INNER: tuple[str, ...] = ("multiring", "rhd", "native")


@dataclass(frozen=True)
class Prediction:
    """The model's time for one configuration at one size."""

    algorithm: str
    params: Mapping[str, Any]
    nbytes: int
    time_us: float
    busbw_gbps: float

    def describe(self) -> str:
        if not self.params:
            return self.algorithm
        parts = []
        for k, v in self.params.items():
            if k == "dims":
                v = "x".join(map(str, v))
            elif k == "inner" and isinstance(v, list):
                v = "/".join(v)
            elif k == "order":
                continue
            parts.append(f"{k}={v}")
        return f"{self.algorithm}({', '.join(parts)})"


def busbw(nbytes: float, seconds: float, n: int) -> float:
    """nccl-tests bus bandwidth in GB/s."""
    if seconds <= 0 or n <= 1:
        return 0.0
    return float(nbytes) / float(seconds) * 2.0 * (n - 1) / n / 1e9


@dataclass
class Model:
    """The cost model of one cluster. Methods take an array of message sizes (bytes) and
    return seconds per size, so a whole sweep costs one evaluation per configuration."""

    cluster: Cluster
    _terms: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        c = self.cluster
        self.n = c.ranks
        # group[l] = ranks in one group of level l (cumulative product, innermost first).
        self.group = np.cumprod([lv.size for lv in c.levels]).astype(np.int64)
        self.lat = np.array([lv.latency_us * 1e-6 for lv in c.levels])
        self.red_rate = c.memory_gbs * 1e9 / 3.0
        self.curves = [lv.curve for lv in c.levels]
        self.over = c.overhead_us * 1e-6
        self.hosts = c.host_of()

    # -- flows -----------------------------------------------------------------------

    def _level(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Outermost level each flow crosses: the first level whose group holds both."""
        lvl = np.zeros(src.shape, dtype=np.int64)
        for g in self.group[:-1]:
            lvl += (src // g) != (dst // g)
        return lvl

    def flow_terms(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The step terms of concurrent flows ``src[i] → dst[i]``: per level crossed, its
        latency (s), the slowest flow's seconds per byte, and the level index."""
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        keep = src != dst
        src, dst = src[keep], dst[keep]
        if src.size == 0:
            return np.zeros((0, 3))
        lvl = self._level(src, dst)
        rows = []
        for li in np.unique(lvl):
            lv: Level = self.cluster.levels[int(li)]
            m = lvl == li
            below = int(self.group[li - 1]) if li > 0 else 1  # ranks sharing this level's links
            bw = lv.bandwidth_gbs * 1e9
            worst = 0.0
            for side in (src[m], dst[m]):  # egress and ingress are limited alike
                per_rank = np.bincount(side)[side]            # flows of this rank
                group = side // below
                per_group = np.bincount(group)[group]         # flows through these links
                cap = np.minimum(bw * max(1.0, lv.links_per_rank) / per_rank,
                                 bw * lv.links_per_rank * below / per_group)
                if not lv.shared:
                    cap = np.minimum(cap, bw)  # one flow rides one link
                worst = max(worst, float(np.max(1.0 / cap)))
            # All flows of a level share its latency: the slowest one is the step's term.
            rows.append((float(self.lat[li]), worst, float(li)))
        return np.array(rows)  # one (α, τ, level) per level crossed: a handful of rows

    def step(self, terms: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Time of one step moving ``nbytes`` per flow (array over sizes): the slowest flow.
        A level with a measured bandwidth curve scales its flows' per-byte time by
        nominal / measured bandwidth at that message size."""
        if terms.size == 0:
            return np.zeros_like(nbytes, dtype=float)
        per_byte = terms[:, 1:2] * np.ones((1, nbytes.size))
        for i, li in enumerate(terms[:, 2].astype(int)):
            curve = self.curves[li]
            if curve:
                per_byte[i] *= self.cluster.levels[li].bandwidth_gbs / _interp(curve, nbytes)
        return np.max(terms[:, :1] + per_byte * nbytes[None, :], axis=0)

    def reduce_time(self, nbytes: np.ndarray) -> np.ndarray:
        """Seconds to reduce ``nbytes`` received bytes into the buffer (reads two arrays,
        writes one), at the measured rate for that size when there is a curve."""
        curve = self.cluster.memory_curve
        rate = self.red_rate if not curve else _interp(curve, nbytes) * 1e9 / 3.0
        return nbytes / rate

    def _bases(self, stride: int, d: int) -> np.ndarray:
        """Grid positions whose coordinate along a dimension (stride, size d) is 0."""
        pos = np.arange(self.n, dtype=np.int64)
        return pos[(pos // stride) % d == 0]

    def _ring_terms(self, stride: int, d: int, rings: int) -> np.ndarray:
        key = ("ring", stride, d, rings)
        if key not in self._terms:
            bases = self._bases(stride, d)
            srcs, dsts = [], []
            for perm in derived_cycles(list(range(d)), rings):
                p = np.array(perm, dtype=np.int64)
                srcs.append(bases[:, None] + p[None, :] * stride)
                dsts.append(bases[:, None] + np.roll(p, -1)[None, :] * stride)
            self._terms[key] = self.flow_terms(np.concatenate(srcs, axis=None),
                                               np.concatenate(dsts, axis=None))
        return self._terms[key]

    def _pair_terms(self, stride: int, d: int, kind: str, arg: int) -> np.ndarray:
        """Flows of one recursive halving/doubling step (``kind`` "mask": partners differ
        in bit ``arg`` of the folded rank; "fold": the 2r extra ranks into their pairs)."""
        key = (kind, stride, d, arg)
        if key not in self._terms:
            bases = self._bases(stride, d)
            p = 1 << (d.bit_length() - 1)
            r = d - p
            if kind == "fold":
                a = np.arange(0, 2 * r, 2)
                b = a + 1
            else:
                c = np.arange(p)
                real = np.where(c < r, 2 * c + 1, c + r)
                partner = c ^ arg
                a = real
                b = np.where(partner < r, 2 * partner + 1, partner + r)
            src = bases[:, None] + a[None, :] * stride
            dst = bases[:, None] + b[None, :] * stride
            self._terms[key] = self.flow_terms(src, dst)
        return self._terms[key]

    # -- phases (seconds, over an array of region sizes in bytes) --------------------

    def ring_phase(self, stride: int, d: int, region: np.ndarray, rings: int,
                   chunk_bytes: int, reduce: bool) -> np.ndarray:
        """One reduce-scatter (``reduce``) or all-gather of multiring along a dimension."""
        if d <= 1:
            return np.zeros_like(region)
        seg = region / (d * rings)
        chunks = np.maximum(1.0, np.ceil(seg / chunk_bytes)) if chunk_bytes else 1.0
        t = self.step(self._ring_terms(stride, d, rings), seg)
        msgs = self.over * rings * chunks
        if reduce:
            red = self.reduce_time(region / d)
            t = np.maximum(t, red) + np.minimum(t, red) / chunks
        return (d - 1) * (t + msgs)

    def rhd_phase(self, stride: int, d: int, region: np.ndarray, reduce: bool) -> np.ndarray:
        if d <= 1:
            return np.zeros_like(region)
        p = 1 << (d.bit_length() - 1)
        total = np.zeros_like(region)
        if d > p:  # fold in (reduce-scatter) or out (all-gather): whole region, one message
            t = self.step(self._pair_terms(stride, d, "fold", 0), region) + self.over
            total += t + (self.reduce_time(region) if reduce else 0.0)
        part = region.copy()
        mask = p >> 1
        while mask:
            part = part / 2
            t = self.step(self._pair_terms(stride, d, "mask", mask), part) + 2 * self.over
            total += t + (self.reduce_time(part) if reduce else 0.0)
            mask >>= 1
        return total

    def native_allreduce(self, stride: int, d: int, region: np.ndarray) -> np.ndarray:
        """The library's allreduce, modelled as the better of recursive doubling (whole
        buffer each step, for short messages) and Rabenseifner's halving/doubling — what
        MPICH chooses between by size."""
        if d <= 1:
            return np.zeros_like(region)
        halving = self.rhd_phase(stride, d, region, True) + self.rhd_phase(stride, d, region,
                                                                           False)
        p = 1 << (d.bit_length() - 1)
        doubling = np.zeros_like(region)
        if d > p:
            fold = self.step(self._pair_terms(stride, d, "fold", 0), region) + self.over
            doubling += 2 * fold + self.reduce_time(region)
        mask = p >> 1
        while mask:
            doubling += (self.step(self._pair_terms(stride, d, "mask", mask), region)
                         + 2 * self.over + self.reduce_time(region))
            mask >>= 1
        return np.minimum(halving, doubling)

    # -- algorithms ------------------------------------------------------------------

    def time(self, algorithm: str, params: Mapping[str, Any], nbytes: Any) -> np.ndarray:
        """Predicted seconds of ``algorithm`` with ``params`` for each size in ``nbytes``."""
        sizes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        n = self.n
        if n <= 1:
            return np.zeros_like(sizes)
        if algorithm == "native":
            return self.native_allreduce(1, n, sizes)
        if algorithm == "rhd":
            return self.rhd_phase(1, n, sizes, True) + self.rhd_phase(1, n, sizes, False)
        if algorithm == "multiring":
            rings, cb = int(params.get("rings", 1)), int(params.get("chunk_bytes", 0))
            return (self.ring_phase(1, n, sizes, rings, cb, True)
                    + self.ring_phase(1, n, sizes, rings, cb, False))
        if algorithm == "hierarchical":
            dims = list(params.get("dims") or [n])
            if math.prod(dims) != n:
                raise ValueError(f"dims {dims}: product is not {n}")
            inner = params.get("inner") or ["multiring"] * len(dims)
            if isinstance(inner, str):
                inner = [inner] * len(dims)
            rings, cb = int(params.get("rings", 1)), int(params.get("chunk_bytes", 0))
            return sum((self._dim_time(s, d, r, inner[j], rings, cb)
                        for j, (s, d, r) in enumerate(_dim_regions(dims, sizes))),
                       np.zeros_like(sizes))
        raise ValueError(f"the cost model does not know algorithm {algorithm!r}; known: "
                         f"{', '.join(ALGORITHMS)}")

    def _dim_time(self, stride: int, d: int, region: np.ndarray, inner: str, rings: int,
                  cb: int) -> np.ndarray:
        """Reduce-scatter plus all-gather along one grid dimension."""
        if inner == "rhd":
            return self.rhd_phase(stride, d, region, True) + self.rhd_phase(stride, d, region,
                                                                            False)
        if inner == "native":
            return (self.native_allreduce(stride, d, region)
                    + self.ring_phase(stride, d, region, 1, 0, False))
        return (self.ring_phase(stride, d, region, rings, cb, True)
                + self.ring_phase(stride, d, region, rings, cb, False))

    # -- search ----------------------------------------------------------------------

    def grids(self, max_dims: int = 3) -> list[list[int]]:
        """Grids of at most ``max_dims`` dimensions that do not split a host."""
        out = []
        for g in factorisations(self.n):
            if len(g) > max_dims:
                continue
            try:
                check_grid_fits_hosts(g, self.hosts)
            except ValueError:
                continue
            out.append(g)
        return out

    def candidates(self, sizes: np.ndarray) -> Iterable[tuple[str, dict[str, Any], np.ndarray]]:
        """Every configuration the model searches, with its time per size. For a grid the
        best ``inner`` per dimension is chosen independently (dimensions run one after the
        other, so their times add), as DDL's exploration mode did."""
        n = self.n
        yield "native", {}, self.time("native", {}, sizes)
        yield "rhd", {}, self.time("rhd", {}, sizes)
        for rings in RINGS:
            for cb in CHUNKS:
                params = {"rings": rings, "chunk_bytes": cb, "order": "topology"}
                yield "multiring", params, self.time("multiring", params, sizes)
        if n <= 1:
            return
        dim_cache: dict[tuple[int, int, int, int], np.ndarray] = {}
        for dims in self.grids():
            if len(dims) == 1:
                continue  # a one-dimensional grid is multiring / rhd / native above
            regions = _dim_regions(dims, sizes)
            for rings in HIER_RINGS:
                for cb in CHUNKS:
                    total = np.zeros_like(sizes)
                    # Per size, the best inner of each dimension (chosen per size below).
                    per_dim = []
                    for s, d, r in regions:
                        # Grids share dimensions (same stride and size): compute each once.
                        key = (s, d, rings, cb)
                        opts = dim_cache.get(key)
                        if opts is None:
                            opts = np.stack([self._dim_time(s, d, r, k, rings, cb)
                                             for k in INNER])
                            dim_cache[key] = opts
                        per_dim.append(opts)
                        total = total + opts.min(axis=0)
                    yield "hierarchical", {"dims": dims, "rings": rings, "chunk_bytes": cb,
                                           "_per_dim": per_dim}, total

    def best(self, nbytes: Sequence[int], algorithms: Sequence[str] = ALGORITHMS
             ) -> dict[str, list[Prediction]]:
        """For each algorithm, its best configuration at each size."""
        sizes = np.asarray(list(nbytes), dtype=float)
        best_t: dict[str, np.ndarray] = {}
        best_p: dict[str, list[dict[str, Any]]] = {}
        for name, params, t in self.candidates(sizes):
            if name not in algorithms:
                continue
            if name not in best_t:
                best_t[name] = np.full(sizes.shape, np.inf)
                best_p[name] = [{} for _ in sizes]
            better = t < best_t[name]
            best_t[name] = np.where(better, t, best_t[name])
            for i in np.flatnonzero(better):
                best_p[name][i] = _concrete(params, int(i))
        return {
            name: [Prediction(name, best_p[name][i], int(sizes[i]), float(best_t[name][i]) * 1e6,
                              busbw(sizes[i], float(best_t[name][i]), self.n))
                   for i in range(len(sizes))]
            for name in best_t
        }

    def ranked(self, nbytes: int, limit: int = 4) -> list[Prediction]:
        """The best configuration of each algorithm at one size, fastest first; then, up to
        ``limit``, the runners-up of any algorithm (distinct configurations)."""
        sizes = np.array([float(nbytes)])
        preds = [Prediction(name, _concrete(params, 0), nbytes, float(t[0]) * 1e6,
                            busbw(nbytes, float(t[0]), self.n))
                 for name, params, t in self.candidates(sizes)]
        preds.sort(key=lambda p: p.time_us)
        firsts: dict[str, Prediction] = {}
        for p in preds:
            firsts.setdefault(p.algorithm, p)
        out = sorted(firsts.values(), key=lambda p: p.time_us)[:limit]
        seen = {p.describe() for p in out}
        for p in preds:
            if len(out) >= limit:
                break
            if p.describe() not in seen:
                seen.add(p.describe())
                out.append(p)
        return out


def _interp(curve: Sequence[tuple[int, float]], nbytes: np.ndarray) -> np.ndarray:
    """GB/s at each size from a measured (bytes, GB/s) curve: log-log interpolation,
    flat beyond its ends."""
    xs = np.log([max(1, b) for b, _ in curve])
    ys = np.log([g for _, g in curve])
    return np.exp(np.interp(np.log(np.maximum(nbytes, 1.0)), xs, ys))


def _dim_regions(dims: Sequence[int], sizes: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(stride, size, region bytes) per grid dimension: dimension j works on 1/(d0·…·dj−1)
    of the buffer, over ranks ``stride`` = d0·…·dj−1 apart."""
    out, stride = [], 1
    for d in dims:
        out.append((stride, d, sizes / stride))
        stride *= d
    return out


def _concrete(params: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Runtime parameters of a candidate at size index ``i`` (resolves per-dim choices)."""
    out = {k: v for k, v in params.items() if not k.startswith("_")}
    per_dim = params.get("_per_dim")
    if per_dim is not None:
        out["dims"] = list(out["dims"])
        out["inner"] = [INNER[int(np.argmin(opts[:, i]))] for opts in per_dim]
    return out


# -- calibration -----------------------------------------------------------------------


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


#: Message sizes of the measured bandwidth and memory curves (bytes).
CURVE_SIZES: tuple[int, ...] = tuple(4 << (2 * k) for k in range(5, 13))  # 4 KiB .. 64 MiB


def measure(comm: Any, small: int = 8, iters: int = 10,
            sizes: Sequence[int] = CURVE_SIZES) -> Cluster:
    """Calibrate by a quick in-process measurement (collective over ``comm``; seconds).

    - latency and bandwidth of every pair of ranks by a simultaneous exchange (both ranks
      send and receive at once, as in every step of the algorithms; on shared memory the two
      directions share the copying CPUs and memory), in rounds of disjoint pairs, at
      ``small`` bytes and at each of ``sizes``: MPI libraries switch protocols with the
      message size, so bandwidth is kept as a curve (the link matrix holds the largest);
    - the reduction rate (``dst += src``) at each size (caches);
    - the software cost per message, from an 8-byte ``multiring`` allreduce over the whole
      world: its 2(n−1) steps cost 2(n−1)·(latency + overhead).

    Every rank returns the same ``Cluster``."""
    from dataclasses import replace

    from mpi4py import MPI

    n, rank = comm.Get_size(), comm.Get_rank()
    sizes = sorted(sizes)
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    curves = np.zeros((n, n, len(sizes)))
    names = comm.allgather(MPI.Get_processor_name())
    ids: dict[str, int] = {}
    hosts = [ids.setdefault(h, len(ids)) for h in names]
    # Rounds of disjoint pairs (i, i ^ shift) for shifts 1..n-1 cover every pair.
    for shift in range(1, 1 << max(0, (n - 1).bit_length())):
        partner = rank ^ shift
        res: tuple[float, list[float]] = (0.0, [0.0] * len(sizes))
        if partner < n:
            res = _exchange(comm, partner, small, sizes, iters)
        for r, (a, (t_lat, gbs)) in enumerate(comm.allgather((partner, res))):
            if a < n:
                lat[r, a], curves[r, a] = t_lat, gbs
                bw[r, a] = gbs[-1]
    mem_curve = [(nb, float(np.median(comm.allgather(measure_memory_gbs(max(nb, 1 << 16))))))
                 for nb in sizes]
    off = ~np.eye(n, dtype=bool)
    alpha = _median(lat[off], 0.0) if n > 1 else 0.0
    over = _ring_overhead(comm, alpha) if n > 1 else _post_cost()
    cluster = calibrate((bw, lat), hosts=hosts, memory_gbs=mem_curve[-1][1], overhead_us=over,
                        name="measured")
    same = np.array([[hosts[i] == hosts[j] for j in range(n)] for i in range(n)]) & off
    levels = []
    for lv, mask in zip(cluster.levels, (same, off & ~same)):
        pts = curves[mask]
        curve = tuple((nb, float(np.median(pts[:, k]))) for k, nb in enumerate(sizes)
                      if pts.size and np.median(pts[:, k]) > 0)
        # The overhead came from the ring net of the measured latency: keep that latency.
        levels.append(replace(lv, curve=curve, latency_us=_median(lat[mask], lv.latency_us)))
    return replace(cluster, levels=tuple(levels), memory_curve=tuple(mem_curve))


def _exchange(comm: Any, peer: int, small: int, sizes: Sequence[int],
              iters: int) -> tuple[float, list[float]]:
    """(latency µs, [bandwidth GB/s per size]) to ``peer`` when both send to each other at
    once: the textbook exchange (median of ``iters``; fewer for the largest messages).

    The same buffers are sent again unchanged. The algorithms send data they have just
    reduced; on this project's VM such freshly written buffers move several times slower
    (BENCHMARKS.md, issue 6), and the model does not capture that."""
    def timed(size: int, reps: int) -> float:
        sbuf = np.zeros(max(1, size), dtype=np.uint8)
        rbuf = np.zeros_like(sbuf)
        comm.Sendrecv(sbuf, peer, 9, rbuf, peer, 9)  # warm-up (and first touch)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            comm.Sendrecv(sbuf, peer, 9, rbuf, peer, 9)
            times.append(time.perf_counter() - t0)
        return float(np.median(times))

    t_small = timed(small, 2 * iters)
    gbs = []
    for size in sizes:
        t = timed(size, iters if size <= 1 << 22 else max(3, iters // 3))
        gbs.append(size / max(1e-9, t - t_small) / 1e9)
    return t_small * 1e6, gbs


def _ring_overhead(comm: Any, alpha_us: float, reps: int = 50) -> float:
    """Software cost (µs) per ring step beyond the wire latency: an 8-byte ``multiring``
    allreduce over ``comm`` (2(n−1) steps), slowest rank, median of ``reps``."""
    from mpi4py import MPI

    from collectives import Communicator

    n = comm.Get_size()
    c = Communicator(comm)
    buf = np.zeros(2, dtype=np.float32)
    for _ in range(5):
        c.allreduce(buf, algorithm="multiring", rings=1)
    local = np.empty(reps)
    for i in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        c.allreduce(buf, algorithm="multiring", rings=1)
        local[i] = time.perf_counter() - t0
    slowest = np.empty_like(local)
    comm.Allreduce(local, slowest, op=MPI.MAX)
    c.close()
    per_step = float(np.median(slowest)) * 1e6 / (2 * (n - 1))
    return max(0.0, per_step - alpha_us)


def _post_cost(reps: int = 200) -> float:
    """Software cost (µs) of posting and completing one message and one reduction call on
    this process (the per-chunk work of the ring schedule), for a world of one rank."""
    from mpi4py import MPI

    from collectives.backend import get_backend
    from collectives.transport import MpiTransport

    be = get_backend("numpy")
    t = MpiTransport(MPI.COMM_SELF, be)
    a = np.zeros(16, dtype=np.float32)
    b = np.zeros_like(a)
    t0 = time.perf_counter()
    for _ in range(reps):
        t.start([(a, 0, 1)], [(b, 0, 1)]).wait()
        be.reduce_into(a, b, "sum")
    return (time.perf_counter() - t0) / reps * 1e6


# -- the tuner's warm start ------------------------------------------------------------


def default_cluster(world_size: int) -> Cluster:
    """A single host of ``world_size`` ranks with generic shared-memory figures, for when
    nothing was measured (only the ranking of configurations matters there)."""
    return Cluster(
        name=f"default-{world_size}",
        levels=(Level("host", max(1, world_size), 5.0, 1.0, 1.0, True,
                      "generic shared memory"),),
        memory_gbs=10.0, overhead_us=10.0, description="uncalibrated default")


def _fit_world(cluster: Cluster, world_size: int) -> Cluster:
    """The calibration's cluster when its rank count matches, else its innermost level
    stretched to ``world_size`` ranks (one host)."""
    if cluster.ranks == world_size:
        return cluster
    from dataclasses import replace

    inner = replace(cluster.levels[0], size=max(1, world_size))
    return replace(cluster, levels=(inner,), name=f"{cluster.name} (as {world_size} ranks)")


def best_guesses(world_size: int, nbytes: int, calibration: Any = None,
                 limit: int = 4) -> list[tuple[str, dict[str, Any]]]:
    """The configurations the model ranks fastest for ``nbytes`` on ``world_size`` ranks,
    as (algorithm, params) with runtime parameter names, fastest first and distinct.

    ``calibration``: ``None`` (generic figures), a ``Cluster``, a measured link matrix or a
    ``Topology`` with links (see ``calibrate``)."""
    if world_size <= 1:
        return [("native", {})]
    cluster = default_cluster(world_size) if calibration is None else calibrate(calibration)
    model = Model(_fit_world(cluster, world_size))
    return [(p.algorithm, dict(p.params)) for p in model.ranked(int(nbytes), limit)]
