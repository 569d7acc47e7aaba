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
with the transfer. Every posted message (a send or a receive) costs ``overhead_us`` of
software time.

``measure(comm)`` calibrates the model on this machine from its primitives — per-message
cost, point-to-point time of freshly reduced buffers by size, reduction rates, fresh pages
— never from an allreduce's time; there ``native`` is modelled as MPICH runs it
(``Cluster.native_model == "mpich"``). A measured level's bandwidth is a curve over message
size, which absorbs protocol switches and caches.

What it leaves out, on purpose: switch congestion inside a level (levels are non-blocking),
the PCIe hop between a GPU and its NIC, an algorithm's fixed Python bookkeeping per call,
and the operating system's interleaving of more ranks than cores beyond what primitives
measured with every rank busy show — which is why validation on a small machine is
reported, not assumed (BENCHMARKS.md, issue 6).
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

#: MPICH's default MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE: recursive doubling up to this size.
MPICH_SHORT_BYTES = 2048
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
        self.native_over = (c.overhead_us if c.native_overhead_us is None
                            else c.native_overhead_us) * 1e-6
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
        nominal / measured bandwidth at the size a rank moves in the step: its concurrent
        flows on a measured level (the rings of ``multiring``) are copied by the same CPU,
        so together they cost what one message of their total size costs."""
        if terms.size == 0:
            return np.zeros_like(nbytes, dtype=float)
        per_byte = terms[:, 1:2] * np.ones((1, nbytes.size))
        for i, li in enumerate(terms[:, 2].astype(int)):
            curve = self.curves[li]
            if curve:
                lv = self.cluster.levels[li]
                # Flows per rank on this level: its per-byte time over one link's.
                flows = max(1.0, float(np.rint(terms[i, 1] * lv.bandwidth_gbs * 1e9
                                               * max(1.0, lv.links_per_rank))))
                per_byte[i] *= lv.bandwidth_gbs / _interp(curve, nbytes * flows)
        return np.max(terms[:, :1] + per_byte * nbytes[None, :], axis=0)

    def reduce_time(self, nbytes: np.ndarray, native: bool = False) -> np.ndarray:
        """Seconds to reduce ``nbytes`` received bytes into the buffer (reads two arrays,
        writes one), at the measured rate for that size when there is a curve; ``native``:
        the communication library's own reduction (its curve, when measured)."""
        curve = self.cluster.memory_curve
        if native and self.cluster.native_memory_curve:
            curve = self.cluster.native_memory_curve
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
        # Each ring posts one send and one receive per chunk and step.
        msgs = 2 * self.over * rings * chunks
        if reduce:
            red = self.reduce_time(region / d)
            t = np.maximum(t, red) + np.minimum(t, red) / chunks
        return (d - 1) * (t + msgs)

    def rhd_phase(self, stride: int, d: int, region: np.ndarray, reduce: bool,
                  native: bool = False) -> np.ndarray:
        """Recursive halving (``reduce``) or doubling along a dimension; ``native``: with the
        library's per-message cost and reduction rate (MPICH's own halving/doubling)."""
        if d <= 1:
            return np.zeros_like(region)
        over = self.native_over if native else self.over
        p = 1 << (d.bit_length() - 1)
        total = np.zeros_like(region)
        if d > p:  # fold in (reduce-scatter) or out (all-gather): whole region, one message
            t = self.step(self._pair_terms(stride, d, "fold", 0), region) + over
            total += t + (self.reduce_time(region, native) if reduce else 0.0)
        part = region.copy()
        mask = p >> 1
        while mask:
            part = part / 2
            t = self.step(self._pair_terms(stride, d, "mask", mask), part) + 2 * over
            total += t + (self.reduce_time(part, native) if reduce else 0.0)
            mask >>= 1
        return total

    def native_allreduce(self, stride: int, d: int, region: np.ndarray) -> np.ndarray:
        """The library's allreduce, modelled as the better of recursive doubling (whole
        buffer each step, for short messages) and Rabenseifner's halving/doubling — what
        MPICH chooses between by size."""
        if d <= 1:
            return np.zeros_like(region)
        mpich = self.cluster.native_model == "mpich"
        halving = (self.rhd_phase(stride, d, region, True, mpich)
                   + self.rhd_phase(stride, d, region, False, mpich))
        over = self.native_over if mpich else self.over
        p = 1 << (d.bit_length() - 1)
        doubling = np.zeros_like(region)
        if d > p:
            fold = self.step(self._pair_terms(stride, d, "fold", 0), region) + over
            doubling += 2 * fold + self.reduce_time(region, mpich)
        mask = p >> 1
        while mask:
            doubling += (self.step(self._pair_terms(stride, d, "mask", mask), region)
                         + 2 * over + self.reduce_time(region, mpich))
            mask >>= 1
        if not mpich:
            return np.minimum(halving, doubling)
        # MPICH (MPIR_Allreduce_intra_recursive_doubling / _reduce_scatter_allgather): recursive
        # doubling up to MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE (2048 bytes), Rabenseifner above.
        # Both malloc a temporary buffer of the whole message per call and receive into it.
        # A slowest rank touches all of it (doubling, or a folded world) or 1 - 1/p of it.
        touched = np.where(region <= MPICH_SHORT_BYTES, region,
                           region if d > p else region * (1.0 - 1.0 / p))
        return (np.where(region <= MPICH_SHORT_BYTES, doubling, halving)
                + self.fresh_pages_time(region, touched))

    def fresh_pages_time(self, allocated: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """Page faults of a temporary buffer of ``allocated`` bytes, ``touched`` of them
        written: only where the C library maps it afresh (at or above its mmap threshold;
        below, freed memory is reused and already mapped)."""
        c = self.cluster
        if c.page_fault_gbs <= 0:
            return np.zeros_like(allocated)
        return np.where(allocated >= c.mmap_threshold, touched / (c.page_fault_gbs * 1e9), 0.0)

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


#: Message sizes of the measured curves (bytes): every power of two, 4 KiB .. 64 MiB, so
#: that interpolation between points stays within a factor of two of a measurement.
CURVE_SIZES: tuple[int, ...] = tuple(1 << k for k in range(12, 27))


def measure(comm: Any, sizes: Sequence[int] = CURVE_SIZES, reps: int = 7,
            small: int = 8) -> Cluster:
    """Calibrate the model's primitives on this machine (collective over ``comm``; about a
    second at 2 ranks). Every primitive is timed with all ranks doing it at once, as they
    do in an allreduce, so the time-sharing of more ranks than cores
    (``os.sched_getaffinity``) and the machine's other load are in the figures; each time is
    the slowest rank's, median of ``reps``. Nothing here runs an allreduce: the figures are
    the parts the model adds up, never the algorithms' own times.

    - per-message software cost: a tiny exchange through ``MpiTransport`` (the Python and
      MPI call path every algorithm step pays: post a send and a receive, wait), and through
      mpi4py's ``Sendrecv`` (one C call, as inside the library's own allreduce);
    - point-to-point time by message size, as the algorithms move data: every rank sends
      to one peer while receiving from another (a ring shift on one host; disjoint pairs,
      level by level, across hosts), and the buffer sent was written by a reduction
      (``reduce_into``) just before, as in every reduce-scatter step;
    - the reduction rate by size: the backend's ``reduce_into`` (ours) and
      ``MPI.Op.Reduce_local`` (the library's own);
    - first touch of freshly mapped pages (the library's per-call temporary buffer).

    Every rank returns the same ``Cluster``."""
    import os

    from mpi4py import MPI

    from collectives.backend import get_backend
    from collectives.transport import MpiTransport

    n, rank = comm.Get_size(), comm.Get_rank()
    sizes = sorted(int(s) for s in sizes)
    names = comm.allgather(MPI.Get_processor_name())
    ids: dict[str, int] = {}
    hosts = [ids.setdefault(h, len(ids)) for h in names]
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    per_host = max(1, n // max(1, len(ids)))
    be = get_backend("numpy")
    tr = MpiTransport(comm, be)
    timer = _Timer(comm, reps)

    # -- point to point: one pattern per level (kind 0 within a host, 1 between hosts) --
    patterns: list[tuple[int, int | None, int | None]] = []  # (kind, send to, receive from)
    if len(ids) == 1:
        if n > 1:
            patterns.append((0, (rank + 1) % n, (rank - 1) % n))
    else:
        seen: set[int] = set()
        for shift in range(1, 1 << (n - 1).bit_length()):
            peer = rank ^ shift
            kinds = {int(hosts[r] != hosts[r ^ shift]) for r in range(n) if r ^ shift < n}
            if kinds <= seen:
                continue  # a level already measured: one round per level is enough
            seen |= kinds
            ok = peer < n
            kind = int(ok and hosts[peer] != hosts[rank])
            patterns.append((kind if ok else -1, peer if ok else None, peer if ok else None))
    tiny: dict[int, list[float]] = {0: [], 1: []}
    curves: dict[int, list[np.ndarray]] = {0: [], 1: []}
    c_tiny: list[float] = []
    for kind, dst, src in patterns:
        t_tiny, t_c, per_size = _pattern_times(comm, tr, timer, dst, src, sizes, reps)
        # Every rank learns every rank's figures; each kind keeps its slowest rank's.
        for (k, tt, tc, ps) in comm.allgather((kind, t_tiny, t_c, per_size)):
            if k >= 0:
                tiny[k].append(tt)
                curves[k].append(np.array(ps))
                c_tiny.append(tc)

    # -- reductions and fresh pages, all ranks at once ---------------------------------
    mem_times: list[float] = []
    native_times: list[float] = []
    for size in sizes:
        a = np.zeros(max(1, size // 4), dtype=np.float32)
        b = np.zeros_like(a)
        r = _reps(size, reps)

        def ours(a: Any = a, b: Any = b) -> None:
            be.reduce_into(a, b, "sum")

        def theirs(a: Any = a, b: Any = b) -> None:
            MPI.SUM.Reduce_local(b, a)

        ours()
        theirs()
        mem_times.append(timer.slowest(ours, reps=r))
        native_times.append(timer.slowest(theirs, reps=r))
    # As GB/s of the three arrays a reduction touches; times made non-decreasing in size.
    mem_curve = [(b, 3 * b / max(1e-9, t) / 1e9) for b, t in zip(sizes, _monotone(mem_times))]
    native_curve = [(b, 3 * b / max(1e-9, t) / 1e9)
                    for b, t in zip(sizes, _monotone(native_times))]
    fault_gbs = _fresh_pages_gbs(comm, tr, timer, patterns[0][1:] if patterns else None)

    # -- the cluster -------------------------------------------------------------------
    # Moving more bytes never takes less time: noise that says otherwise (a burst of other
    # work during one size) is pooled with its neighbours (isotonic regression).
    t_sizes = {k: _monotone(np.max(np.stack(v), axis=0)) for k, v in curves.items() if v}
    t_small = {k: min(float(np.max(tiny[k])), float(t_sizes[k][0])) for k in t_sizes}
    # Per message: half a tiny exchange step (one send and one receive posted and waited).
    over = 0.5 * min(t_small.values()) if t_small else 0.5 * timer.local(
        lambda: tr.start([], []).wait())
    levels = []
    for kind, (name, size) in enumerate((("host", per_host if len(ids) > 1 else n),
                                         ("network", len(ids)))):
        if kind not in t_sizes or (kind == 1 and len(ids) == 1):
            continue
        t_s = t_sizes[kind]
        extra = t_small[kind] - 2 * over  # wire latency beyond the fastest level's
        # Seconds per byte beyond the tiny step's fixed cost; never below 1/1000 of it.
        per_byte = np.maximum(t_s - t_small[kind], 1e-3 * t_small[kind]) / np.array(sizes)
        curve = tuple((s, float(1e-9 / pb)) for s, pb in zip(sizes, per_byte))
        levels.append(Level(name, size, curve[-1][1], max(0.0, extra) * 1e6, 1.0, True,
                            "measured", curve=curve))
    if not levels:  # one rank: nothing to send; keep the shape of a one-level cluster
        levels.append(Level("host", max(1, n), 1.0, 0.0, 1.0, True, "measured"))
    ranks_here = n // max(1, len(ids))
    return Cluster(
        name="measured", levels=tuple(levels), memory_gbs=mem_curve[-1][1],
        overhead_us=over * 1e6, memory_curve=tuple(mem_curve),
        native_model="mpich",
        native_overhead_us=0.5 * float(np.max(c_tiny)) * 1e6 if c_tiny else over * 1e6,
        native_memory_curve=tuple(native_curve), page_fault_gbs=fault_gbs,
        description=f"measured: {n} ranks, {ranks_here} per host on {cores} cores "
                    f"(time-sharing factor {max(1.0, ranks_here / cores):.1f}, in the figures)")


def _pattern_times(comm: Any, tr: Any, timer: _Timer, dst: int | None, src: int | None,
                   sizes: Sequence[int], reps: int) -> tuple[float, float, list[float]]:
    """This rank's times (s) of one exchange pattern (send to ``dst`` while receiving from
    ``src``; ``None``: idle this round): a tiny step through the transport, a tiny
    ``Sendrecv``, and a step of each size whose send buffer a reduction has just written."""
    active = dst is not None and src is not None
    zero = np.zeros(2, dtype=np.float32)
    rbuf = np.zeros_like(zero)
    sends = [(zero, dst, 5)] if active else []
    recvs = [(rbuf, src, 5)] if active else []
    loops = 20

    def tiny_steps() -> None:
        for _ in range(loops):
            tr.start(sends, recvs).wait()

    def c_steps() -> None:
        for _ in range(loops):
            if active:
                comm.Sendrecv(zero, dst, 6, rbuf, src, 6)

    t_tiny = timer.local(tiny_steps) / loops
    t_c = timer.local(c_steps) / loops
    per_size = []
    reduce_into = tr.backend.reduce_into
    for size in sizes:
        # Buffers of the message's size, allocated as an algorithm allocates its scratch
        # (NumPy backs those of 4 MiB and more with huge pages) and written through once, so
        # that no timed step pays for first-touch page faults.
        sbuf, other, recv = (np.ones(max(1, size // 4), dtype=np.float32) for _ in range(3))
        for w in (sbuf, other, recv):
            w[:] = 0.0
        s_list = [(sbuf, dst, 7)] if active else []
        r_list = [(recv, src, 7)] if active else []

        def exchange(s_list: Any = s_list, r_list: Any = r_list) -> None:
            tr.start(s_list, r_list).wait()

        def dirty(sbuf: Any = sbuf, other: Any = other) -> None:
            reduce_into(sbuf, other, "sum")  # zeros: the values never change

        # A reduction writes the buffer (untimed), a barrier, then the exchange is timed.
        # Timing reduction + exchange back to back and taking off the reduction timed alone
        # was tried too: it also catches the penalty this VM sometimes puts on sending
        # freshly written data, but the partner's skew lands in it, and it over-predicted
        # 2-3x as often as it helped (BENCHMARKS.md, issue 6).
        exchange()  # first touch, protocol set-up
        per_size.append(timer.local(exchange, before=dirty, reps=_reps(size, reps)))
    return t_tiny, t_c, per_size


def _monotone(values: Iterable[float]) -> np.ndarray:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent
    violators)."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in map(float, values):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return np.concatenate([np.full(int(c), t / c) for t, c in blocks])


def _reps(size: int, reps: int) -> int:
    """Fewer repetitions for the largest sizes (each takes milliseconds)."""
    return reps if size <= 1 << 22 else max(3, reps - 2)


class _Timer:
    """Times a step on every rank at once: barrier, step, slowest rank; median of reps."""

    def __init__(self, comm: Any, reps: int) -> None:
        self.comm = comm
        self.reps = max(1, reps)

    def local(self, step: Any, before: Any = None, reps: int | None = None) -> float:
        """Median over reps of this rank's time (``before`` runs untimed, pre-barrier);
        the caller gathers ranks."""
        return float(np.median(self._times(step, before, reps)))

    def slowest(self, step: Any, reps: int | None = None) -> float:
        from mpi4py import MPI

        times = self._times(step, None, reps)
        worst = np.empty_like(times)
        self.comm.Allreduce(times, worst, op=MPI.MAX)
        return float(np.median(worst))

    def _times(self, step: Any, before: Any, reps: int | None) -> np.ndarray:
        out = np.empty(self.reps if reps is None else max(1, reps))
        clock = time.perf_counter
        for i in range(out.size):
            if before is not None:
                before()
            self.comm.Barrier()
            t0 = clock()
            step()
            out[i] = clock() - t0
        return out


def _fresh_pages_gbs(comm: Any, tr: Any, timer: _Timer, pattern: tuple[Any, Any] | None,
                     nbytes: int = 32 << 20) -> float:
    """GB/s of pages a receive into a freshly mapped buffer costs beyond the same receive
    into a mapped one (the page faults of the library's per-call temporary buffer; all
    ranks at once). With nobody to exchange with, the first touch of fresh pages."""
    import mmap

    dst, src = pattern if pattern is not None else (None, None)
    sbuf = np.zeros(nbytes // 4, dtype=np.float32)
    warm = np.zeros_like(sbuf)
    active = dst is not None and src is not None

    def into(buf: Any) -> None:
        if active:
            tr.start([(sbuf, dst, 8)], [(buf, src, 8)]).wait()
        else:
            buf[::mmap.PAGESIZE // 4] = 1

    def fresh() -> None:
        # Private anonymous pages, as malloc maps a large block (the mmap module's default
        # is shared memory, whose pages fault about 1.5x slower here).
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = np.frombuffer(mm, dtype=np.float32)
        into(view)
        del view
        mm.close()

    into(warm)
    extra = timer.slowest(fresh, reps=3) - timer.slowest(lambda: into(warm), reps=3)
    return nbytes / max(1e-9, extra) / 1e9


def combine(runs: Sequence[Cluster]) -> Cluster:
    """The median of several calibrations of the same world, figure by figure (the machine
    is shared: a median is robust to a burst of load during one of them)."""
    from dataclasses import replace

    if not runs:
        raise ValueError("combine: no calibrations")
    first = runs[0]

    def med(values: Iterable[float]) -> float:
        return float(np.median(list(values)))

    def curve(get: Any) -> tuple[tuple[int, float], ...]:
        points = [get(r) for r in runs]
        return tuple((b, med(p[k][1] for p in points)) for k, (b, _) in enumerate(points[0]))

    levels = []
    for j, lv in enumerate(first.levels):
        levels.append(replace(
            lv, bandwidth_gbs=med(r.levels[j].bandwidth_gbs for r in runs),
            latency_us=med(r.levels[j].latency_us for r in runs),
            curve=curve(lambda r, j=j: r.levels[j].curve)))
    return replace(
        first, levels=tuple(levels), memory_gbs=med(r.memory_gbs for r in runs),
        overhead_us=med(r.overhead_us for r in runs),
        native_overhead_us=med(r.native_overhead_us or r.overhead_us for r in runs),
        memory_curve=curve(lambda r: r.memory_curve),
        native_memory_curve=curve(lambda r: r.native_memory_curve),
        page_fault_gbs=med(r.page_fault_gbs for r in runs))


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
