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

This module holds the ``Model`` class (flows, phases, search) and re-exports; each
algorithm's formula and the configurations the model ranks for it live with the algorithm
(``cost``, ``grid_cost``, ``model_space`` of ``collectives.algorithms.base.Algorithm``),
built on the phase primitives here, and the model asks the registry for them. It also
re-exports, so that ``autotune.model.<name>`` keeps working, the names of the modules split
from it: ``measure`` and ``combine`` (``autotune.primitives``: calibration from this
machine's measured primitives, where ``native`` is modelled as the running library's module
in ``collectives.natives`` says),
and ``calibrate`` and ``measure_memory_gbs`` (``autotune.calibrate``: a cluster from
measured link matrices). The tuner's warm start built on the model (``best_guesses``,
``default_cluster``) is ``autotune.guesses``, which imports this module.

What it leaves out, on purpose: switch congestion inside a level (levels are non-blocking),
the PCIe hop between a GPU and its NIC, an algorithm's fixed Python bookkeeping per call,
and the operating system's interleaving of more ranks than cores beyond what primitives
measured with every rank busy show — which is why validation on a small machine is
reported, not assumed (BENCHMARKS.md, issue 6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collectives.algorithms import get_algorithm
from collectives.algorithms.multiring import MAX_BLOCK_CHUNKS
from collectives.algorithms.registry import user_algorithm_names
from collectives.bench import busbw
from collectives.natives import for_cost_model
from collectives.orders import derived_cycles

from .calibrate import calibrate as calibrate
from .calibrate import measure_memory_gbs as measure_memory_gbs
from .cluster import Cluster, Level
from .primitives import CURVE_SIZES as CURVE_SIZES
from .primitives import combine as combine
from .primitives import measure as measure


def model_algorithms() -> tuple[str, ...]:
    """The algorithms the model knows, in display order: every registered one except
    test-only ones (an algorithm without a cost of its own is modelled as one flat ring)."""
    return tuple(user_algorithm_names("display_order"))


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


@dataclass
class Model:
    """The cost model of one cluster. Methods take an array of message sizes (bytes) and
    return seconds per size, so a whole sweep costs one evaluation per configuration."""

    cluster: Cluster
    _terms: dict[Any, np.ndarray] = field(default_factory=dict, repr=False)
    _leaders: Model | None = field(default=None, repr=False)

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
        #: The library whose allreduce ``native`` is (``Cluster.native_model``): its module
        #: in ``collectives.natives`` holds the cost of its default and of each algorithm.
        self.native = for_cost_model(c.native_model)

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

    def pair_terms(self, stride: int, d: int, kind: str, arg: int) -> np.ndarray:
        """The step terms of one recursive halving/doubling step (``_pair_terms``)."""
        return self._pair_terms(stride, d, kind, arg)

    def host_gather_terms(self) -> np.ndarray:
        """The step terms of every rank of each host sending to the host's first rank at
        once (an intra-host reduce's or bcast's flows)."""
        k = self.cluster.ranks_per_host
        key = ("host_gather",)
        if key not in self._terms:
            hosts = np.arange(0, self.n, k, dtype=np.int64)
            others = (hosts[:, None] + np.arange(1, k)[None, :]).ravel()
            self._terms[key] = self.flow_terms(others, np.repeat(hosts, k - 1))
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
                   chunk_bytes: int, reduce: bool, native: bool = False) -> np.ndarray:
        """One reduce-scatter (``reduce``) or all-gather of multiring along a dimension;
        ``native``: with the library's per-message cost and reduction rate."""
        if d <= 1:
            return np.zeros_like(region)
        seg = region / (d * rings)
        # As the runtime cuts them: at most MAX_BLOCK_CHUNKS chunks per block, all rings.
        chunks = np.minimum(np.maximum(1.0, np.ceil(seg / chunk_bytes)),
                            max(1, MAX_BLOCK_CHUNKS // rings)) if chunk_bytes else 1.0
        t = self.step(self._ring_terms(stride, d, rings), seg)
        # Each ring posts one send and one receive per chunk and step.
        msgs = 2 * (self.native_over if native else self.over) * rings * chunks
        if reduce:
            red = self.reduce_time(region / d, native)
            t = np.maximum(t, red) + np.minimum(t, red) / chunks
        return (d - 1) * (t + msgs)

    def rhd_phase(self, stride: int, d: int, region: np.ndarray, reduce: bool,
                  native: bool = False) -> np.ndarray:
        """Recursive halving (``reduce``) or doubling along a dimension; ``native``: with the
        library's per-message cost, reduction rate and partner order (the libraries'
        Rabenseifner: nearest partner first)."""
        if d <= 1:
            return np.zeros_like(region)
        over = self.native_over if native else self.over
        p = 1 << (d.bit_length() - 1)
        total = np.zeros_like(region)
        if d > p:  # fold in (reduce-scatter) or out (all-gather): whole region, one message
            t = self.step(self._pair_terms(stride, d, "fold", 0), region) + over
            total += t + (self.reduce_time(region, native) if reduce else 0.0)
        # Which partner gets the large pieces: ringtune's ``rhd`` halves with the farthest
        # partner first (mask p/2: half the region crosses the outermost level), the MPI
        # libraries' Rabenseifner with the nearest (mask 1, 2, … in the reduce-scatter, the
        # mirror in the all-gather), so on a tiered
        # network its large pieces stay inside a host and only 1/p of the region crosses out.
        masks = [1 << k for k in range(p.bit_length() - 1)]
        if not native:
            masks.reverse()
        part = region.copy()
        for mask in masks:
            part = part / 2
            t = self.step(self._pair_terms(stride, d, "mask", mask), part) + 2 * over
            total += t + (self.reduce_time(part, native) if reduce else 0.0)
        return total

    def native_allreduce(self, stride: int, d: int, region: np.ndarray) -> np.ndarray:
        """The library's own allreduce along a dimension, as its module models it
        (``collectives.natives``: ``default_cost``; the ``"best"`` model: the better of
        recursive doubling and halving/doubling at each size)."""
        return np.asarray(self.native.default_cost(self, stride, d, region), dtype=float)

    def node_aware_native(self) -> bool:
        """Whether the library's allreduce composes intra-host parts with a host leaders'
        allreduce on this world (its module's ``node_aware``)."""
        return self.native.node_aware(self)

    def node_leaders(self) -> Model:
        """The model of the node leaders' world: one rank per host, the host's links all
        its own (``Cluster.flat_hosts``)."""
        if self._leaders is None:
            self._leaders = Model(self.cluster.flat_hosts())
        return self._leaders

    def fresh_pages_time(self, allocated: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """Page faults of a temporary buffer of ``allocated`` bytes, ``touched`` of them
        written: only where the C library maps it afresh (at or above its mmap threshold;
        below, freed memory is reused and already mapped)."""
        c = self.cluster
        if c.page_fault_gbs <= 0:
            return np.zeros_like(allocated)
        return np.where(allocated >= c.mmap_threshold, touched / (c.page_fault_gbs * 1e9), 0.0)

    # -- algorithms ----------------------------------------------------------------
    # Each algorithm's formula lives with the algorithm (``Algorithm.cost``, ``grid_cost``,
    # ``model_space`` in ``collectives.algorithms``), built on the phases above.

    def time(self, algorithm: str, params: Mapping[str, Any], nbytes: Any) -> np.ndarray:
        """Predicted seconds of ``algorithm`` with ``params`` for each size in ``nbytes``
        (its ``cost``; an algorithm without one of its own is modelled as one flat ring)."""
        sizes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        try:
            cls = get_algorithm(algorithm)
        except ValueError:
            raise ValueError(f"the cost model does not know algorithm {algorithm!r}; known: "
                             f"{', '.join(model_algorithms())}") from None
        if self.n <= 1:
            return np.zeros_like(sizes)
        return np.asarray(cls.cost(self, params, sizes), dtype=float)

    # -- search ----------------------------------------------------------------------

    def candidates(self, sizes: np.ndarray) -> Iterable[tuple[str, dict[str, Any], np.ndarray]]:
        """Every configuration the model searches, with its time per size: each registered
        algorithm's ``model_space`` (test-only ones left out), in ``model_order``."""
        for name in user_algorithm_names("model_order"):
            for params, t in get_algorithm(name).model_space(self, sizes):
                yield name, params, t

    def best(self, nbytes: Sequence[int], algorithms: Sequence[str] | None = None
             ) -> dict[str, list[Prediction]]:
        """For each algorithm (default: every one the model knows), its best configuration
        at each size."""
        if algorithms is None:
            algorithms = model_algorithms()
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
                best_p[name][i] = _concrete(name, params, int(i))
        return {
            name: [Prediction(name, best_p[name][i], int(sizes[i]), float(best_t[name][i]) * 1e6,
                              busbw(sizes[i], float(best_t[name][i]) * 1e6, self.n))
                   for i in range(len(sizes))]
            for name in best_t
        }

    def ranked(self, nbytes: int, limit: int = 4) -> list[Prediction]:
        """The best configuration of each algorithm at one size, fastest first; then, up to
        ``limit``, the runners-up of any algorithm (distinct configurations)."""
        sizes = np.array([float(nbytes)])
        preds = [Prediction(name, _concrete(name, params, 0), nbytes, float(t[0]) * 1e6,
                            busbw(nbytes, float(t[0]) * 1e6, self.n))
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


def _concrete(algorithm: str, params: Mapping[str, Any], i: int) -> dict[str, Any]:
    """Runtime parameters of a candidate at size index ``i`` (the algorithm resolves its
    per-size choices, e.g. a grid's ``inner`` per dimension)."""
    return get_algorithm(algorithm).concrete(params, i)
