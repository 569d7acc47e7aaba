"""The α–β cost model (``autotune/model.py``) and cluster files (``autotune/cluster.py``).

Closed forms are written out here independently of the model's code, so a wrong formula
or a wrong contention count fails a test.
"""

from __future__ import annotations

import glob
import math
from dataclasses import replace

import numpy as np
import pytest

from autotune.cluster import Cluster, Level, cluster_from_dict, load_cluster, workload_from_dict
from autotune.guesses import best_guesses
from autotune.model import Model, calibrate, combine
from autotune.primitives import _monotone
from collectives.algorithms import get_algorithm

ROOT = __file__.rsplit("/tests/", 1)[0]


def one_level(n: int, bw: float = 10.0, lat: float = 2.0, over: float = 3.0,
              mem: float = 30.0) -> Cluster:
    return Cluster("flat", (Level("host", n, bw, lat, 1.0, True),), memory_gbs=mem,
                   overhead_us=over)


def test_ring_matches_the_textbook_formula() -> None:
    n, size = 4, 1 << 20
    c = one_level(n)
    t = Model(c).time("multiring", {"rings": 1, "chunk_bytes": 0}, [size])[0]
    alpha, over, bw, red = 2e-6, 3e-6, 10e9, 30e9 / 3
    seg = size / n
    # Every step posts one send and one receive: two messages' software cost.
    want = 2 * (n - 1) * (alpha + seg / bw + 2 * over) + (n - 1) * seg / red
    assert t == pytest.approx(want, rel=1e-9)


def test_rhd_and_native_match_their_formulas_on_a_power_of_two() -> None:
    n, size = 8, 1 << 16
    c = one_level(n)
    m = Model(c)
    alpha, over, bw, red = 2e-6, 3e-6, 10e9, 30e9 / 3
    steps = int(math.log2(n))
    rs = sum(alpha + size / 2 ** (k + 1) / bw + 2 * over + size / 2 ** (k + 1) / red
             for k in range(steps))
    ag = sum(alpha + size / 2 ** (k + 1) / bw + 2 * over for k in range(steps))
    assert m.time("rhd", {}, [size])[0] == pytest.approx(rs + ag, rel=1e-9)
    doubling = steps * (alpha + size / bw + 2 * over + size / red)
    assert m.time("native", {}, [size])[0] == pytest.approx(min(rs + ag, doubling), rel=1e-9)


def test_non_power_of_two_rhd_adds_the_fold() -> None:
    size = 1 << 16
    m3, m2 = Model(one_level(3)), Model(one_level(2))
    fold = 2e-6 + size / 10e9 + 3e-6
    extra = m3.time("rhd", {}, [size])[0] - m2.time("rhd", {}, [size])[0]
    assert extra == pytest.approx(2 * fold + size / 10e9, rel=1e-9)


def test_shared_nic_slows_halving_doubling_but_not_a_host_grouped_ring() -> None:
    """Goyal-like: 8 ranks per host share one NIC. A host-grouped ring sends one flow per host
    across the network (full NIC); a halving step across hosts sends 8 (NIC / 8 each)."""
    nic = Level("eth", 4, 6.25, 10.0, 0.125, True)
    c = Cluster("g", (Level("nvl", 8, 20.0, 1.0, 4, False), nic), memory_gbs=732)
    m = Model(c)
    # The last rank of host 0 -> the first of host 1: one flow through the NIC.
    terms = m.flow_terms(np.array([7]), np.array([8]))
    assert terms[:, 1].max() == pytest.approx(1 / 6.25e9)
    src = np.arange(8)              # every rank of host 0 -> its peer on host 1
    terms = m.flow_terms(src, src + 8)
    assert terms[:, 1].max() == pytest.approx(8 / 6.25e9)
    assert terms[:, 0].max() == pytest.approx(10e-6)


def test_unshared_links_let_more_rings_go_faster() -> None:
    """NVLink bricks: one flow rides one link; four rings use four links."""
    c = Cluster("nv", (Level("nvl", 8, 20.0, 1.0, 4, False),), memory_gbs=732, overhead_us=0)
    m = Model(c)
    big = [1 << 28]
    one = m.time("multiring", {"rings": 1}, big)[0]
    two = m.time("multiring", {"rings": 2}, big)[0]
    assert two < 0.6 * one
    shared = Model(replace(c, levels=(replace(c.levels[0], shared=True),)))
    # A shared pipe of 4 links: one ring already gets all of it.
    assert shared.time("multiring", {"rings": 1}, big)[0] < 0.3 * one


def test_hierarchical_is_the_sum_of_its_dimensions() -> None:
    c = one_level(8)
    m = Model(c)
    sizes = [1 << 12, 1 << 20]
    flat = m.time("hierarchical", {"dims": [8]}, sizes)
    assert np.allclose(flat, m.time("multiring", {"rings": 1}, sizes))
    grid = m.time("hierarchical", {"dims": [2, 4], "inner": ["rhd", "multiring"]}, sizes)
    parts = m.rhd_phase(1, 2, np.array(sizes, float), True) + m.rhd_phase(
        1, 2, np.array(sizes, float), False)
    parts = parts + m.ring_phase(2, 4, np.array(sizes, float) / 2, 1, 0, True) + m.ring_phase(
        2, 4, np.array(sizes, float) / 2, 1, 0, False)
    assert np.allclose(grid, parts)
    with pytest.raises(ValueError, match="product"):
        m.time("hierarchical", {"dims": [3, 3]}, sizes)
    with pytest.raises(ValueError, match="does not know"):
        m.time("nope", {}, sizes)


def test_best_picks_the_minimum_of_every_candidate() -> None:
    c = load_cluster(f"{ROOT}/profiles/clusters/dgx-h100-32.yaml")
    m = Model(c)
    sizes = [1 << 10, 1 << 24]
    best = m.best(sizes)
    assert set(best) == {"native", "multiring", "rhd", "hierarchical", "shm"}
    for name, preds in best.items():
        for i, p in enumerate(preds):
            again = m.time(name, p.params, [sizes[i]])[0] * 1e6
            assert again == pytest.approx(p.time_us, rel=1e-9)
            others = [t[i] for a, _, t in m.candidates(np.array(sizes, float)) if a == name]
            assert p.time_us == pytest.approx(min(others) * 1e6, rel=1e-9)
            assert p.busbw_gbps == pytest.approx(
                sizes[i] / (p.time_us * 1e-6) * 2 * 255 / 256 / 1e9)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8])
def test_best_guesses_are_valid_runtime_configurations(n: int) -> None:
    guesses = best_guesses(n, 1 << 20)
    assert guesses and len(guesses) <= 4
    assert len({repr(g) for g in guesses}) == len(guesses)
    for name, params in guesses:
        cls = get_algorithm(name)
        checked = cls.check_params(params, n)
        for key, value in params.items():
            assert checked[key] == value


def test_best_guesses_follow_a_calibration() -> None:
    # Very slow messages, very fast links: latency dominates, few steps win (not a ring).
    slow = one_level(8, bw=1000.0, lat=500.0, over=0.0, mem=1e4)
    first = best_guesses(8, 1 << 10, slow)[0][0]
    assert first in ("native", "rhd", "hierarchical", "shm")
    assert first != "multiring"
    # The calibration's world differs: its innermost level is stretched to the world.
    assert best_guesses(4, 1 << 10, slow)


def test_calibrate_from_matrices_and_hosts() -> None:
    n = 4
    bw = np.full((n, n), 10.0)
    lat = np.full((n, n), 4.0)
    bw[:2, 2:] = bw[2:, :2] = 2.0
    lat[:2, 2:] = lat[2:, :2] = 20.0
    c = calibrate((bw, lat), hosts=[0, 0, 1, 1], memory_gbs=30.0, overhead_us=1.0)
    assert [lv.size for lv in c.levels] == [2, 2]
    assert c.levels[0].bandwidth_gbs == 10.0 and c.levels[1].bandwidth_gbs == 2.0
    assert c.levels[0].latency_us == 3.0 and c.levels[1].latency_us == 19.0
    single = calibrate({"bandwidth_gbs": bw, "latency_us": lat}, memory_gbs=30.0,
                       overhead_us=1.0)
    assert [lv.size for lv in single.levels] == [4]

    class Topo:  # what a probes.Topology with a measured link matrix offers
        links = {"bandwidth_gbs": bw.tolist(), "latency_us": lat.tolist()}
        layout = [{"host": h} for h in (0, 0, 1, 1)]

    assert [lv.size for lv in calibrate(Topo(), memory_gbs=30.0).levels] == [2, 2]
    assert calibrate(c) is c
    with pytest.raises(ValueError, match="square"):
        calibrate((np.ones((2, 3)), np.ones((2, 3))))
    with pytest.raises(ValueError, match="bandwidth"):
        calibrate({"nothing": 1})


def test_shipped_cluster_files_load() -> None:
    files = sorted(glob.glob(f"{ROOT}/profiles/clusters/*.yaml"))
    got = {load_cluster(f).name: load_cluster(f) for f in files}
    assert got["ddl-minsky-64"].ranks == 256 and got["ddl-minsky-64"].hosts == 64
    assert got["goyal-bigbasin-32"].ranks == 256 and got["goyal-bigbasin-32"].hosts == 32
    assert got["dgx-h100-32"].ranks == 256 and got["dgx-h100-128"].ranks == 1024
    for c in got.values():
        assert c.sources and all(lv.source for lv in c.levels)


def test_with_hosts_and_flat_hosts() -> None:
    c = load_cluster(f"{ROOT}/profiles/clusters/dgx-h100-128.yaml")
    assert c.with_hosts(64).ranks == 512 and c.with_hosts(64).hosts == 64
    assert c.with_hosts(1).ranks == 8
    ddl = load_cluster(f"{ROOT}/profiles/clusters/ddl-minsky-64.yaml")
    assert ddl.ranks_per_host == 4 and ddl.with_hosts(16).ranks == 64
    flat = load_cluster(f"{ROOT}/profiles/clusters/goyal-bigbasin-32.yaml").flat_hosts()
    assert flat.ranks == 32 and flat.levels[1].links_per_rank == 1.0
    with pytest.raises(ValueError, match="hosts"):
        c.with_hosts(0)


GOOD = {"name": "x", "ranks": 8, "memory_gbs": 100,
        "levels": [{"size": 4, "bandwidth_gbs": 10, "latency_us": 1},
                   {"size": 2, "bandwidth_gbs": 5, "latency_us": 5}]}


def _bad(**change: object) -> dict:
    data = {k: (list(v) if isinstance(v, list) else v) for k, v in GOOD.items()}
    data["levels"] = [dict(lv) for lv in GOOD["levels"]]  # type: ignore[union-attr,attr-defined]
    for key, value in change.items():
        if key.startswith("level1_"):
            data["levels"][1][key[7:]] = value  # type: ignore[index]
        elif value is None:
            data.pop(key)
        else:
            data[key] = value
    return data


@pytest.mark.parametrize("change,where", [
    ({"levels": None}, "f.yaml: levels: missing"),
    ({"levels": []}, "f.yaml: levels: expected a non-empty list"),
    ({"level1_bandwidth_gbs": 0}, "f.yaml: levels[1].bandwidth_gbs: expected a positive"),
    ({"level1_bandwidth_gbs": -3.5}, "f.yaml: levels[1].bandwidth_gbs: expected a positive"),
    ({"level1_latency_us": -1}, "f.yaml: levels[1].latency_us: expected a non-negative"),
    ({"ranks": 16}, "f.yaml: levels: sizes 4 x 2 = 8 ranks, but ranks is 16"),
    ({"colour": "red"}, "f.yaml: colour: unknown key"),
    ({"level1_speed": 3}, "f.yaml: levels[1].speed: unknown key"),
    ({"level1_shared": "yes"}, "f.yaml: levels[1].shared: expected true or false"),
    ({"ranks_per_host": 3}, "f.yaml: ranks_per_host: 3 is not the size"),
    ({"memory_gbs": None}, "f.yaml: memory_gbs: missing"),
])
def test_bad_cluster_files_name_file_and_key(change: dict, where: str) -> None:
    with pytest.raises(ValueError) as exc:
        cluster_from_dict(_bad(**change), "f.yaml")
    assert str(exc.value).startswith(where), str(exc.value)


def test_good_cluster_and_workloads() -> None:
    c = cluster_from_dict(GOOD, "f.yaml")
    assert c.ranks == 8 and c.hosts == 2
    w = workload_from_dict({"gradient_bytes": 100, "compute_seconds": 1.0, "overlap": 0.5})
    assert w.step_seconds(0.4) == pytest.approx(1.2)
    assert w.step_seconds(4.0) == pytest.approx(4.0)  # hidden part bounded by compute
    assert w.efficiency(0.0) == 1.0
    for bad, key in (({"gradient_bytes": 1, "compute_seconds": 1, "overlap": 2}, "overlap"),
                     ({"gradient_bytes": 0, "compute_seconds": 1}, "gradient_bytes"),
                     ({"compute_seconds": 1}, "gradient_bytes: missing"),
                     ({"gradient_bytes": 1, "compute_seconds": 1, "x": 1}, "x: unknown key")):
        with pytest.raises(ValueError, match=f"w.yaml: {key}"):
            workload_from_dict(bad, "w.yaml")


def test_calibrate_from_a_probed_topology_with_measured_links() -> None:
    """``probes.links.measure`` result inside a ``probes.Topology`` (None on the diagonal)."""
    from probes.topology import Links, RankPlace, Topology

    def cell(i: int, j: int, near: float, far: float) -> float | None:
        if i == j:
            return None
        return near if (i < 2) == (j < 2) else far

    links = Links(bandwidth_gbps=tuple(tuple(cell(i, j, 10.0, 2.0) for j in range(4))
                                       for i in range(4)),
                  latency_us=tuple(tuple(cell(i, j, 4.0, 20.0) for j in range(4))
                                   for i in range(4)))
    topo = Topology(ranks=tuple(RankPlace(rank=r, host=r // 2) for r in range(4)), links=links)
    c = calibrate(topo, memory_gbs=30.0, overhead_us=1.0)
    assert [lv.size for lv in c.levels] == [2, 2]
    assert [lv.bandwidth_gbs for lv in c.levels] == [10.0, 2.0]
    guesses = best_guesses(4, 1 << 20, topo)
    assert guesses and all(isinstance(p, dict) for _, p in guesses)


def mpich_level(n: int) -> Cluster:
    """One level with the figures a calibration on this machine fills in for ``native``."""
    flat = ((1, 12.0), (1 << 30, 12.0))  # 12 GB/s of 3 arrays: reduction at 4 GB/s
    return replace(one_level(n), native_model="mpich", native_overhead_us=1.0,
                   native_memory_curve=flat, page_fault_gbs=0.5)


def test_native_follows_mpich_choice_rates_and_temporary_buffer() -> None:
    n = 4
    m = Model(mpich_level(n))
    alpha, o, bw, red, fault = 2e-6, 1e-6, 10e9, 4e9, 0.5e9

    def rsag(size: float) -> float:
        halves = [size / 2, size / 4]
        return (sum(alpha + h / bw + 2 * o + h / red for h in halves)
                + sum(alpha + h / bw + 2 * o for h in halves))

    # Small: recursive doubling, the whole buffer each of log2(4) = 2 steps.
    small = 1024
    assert m.time("native", {}, [small])[0] == pytest.approx(
        2 * (alpha + small / bw + 2 * o + small / red), rel=1e-9)
    # Large, below glibc's mmap threshold: Rabenseifner, no page faults.
    mid = 16 << 20
    assert m.time("native", {}, [mid])[0] == pytest.approx(rsag(mid), rel=1e-9)
    # At the threshold: the temporary buffer is mapped afresh; 3/4 of it is received into.
    big = 64 << 20
    assert m.time("native", {}, [big])[0] == pytest.approx(
        rsag(big) + big * 0.75 / fault, rel=1e-9)
    # Three ranks fold: the folded-into rank receives the whole buffer into fresh pages.
    m3 = Model(mpich_level(3))
    sizes = np.array([float(big)])
    plain = m3.rhd_phase(1, 3, sizes, True, True) + m3.rhd_phase(1, 3, sizes, False, True)
    assert m3.time("native", {}, sizes)[0] == pytest.approx(plain[0] + big / fault, rel=1e-9)
    # Spec clusters keep the better of the two (what NCCL-like libraries approach).
    assert one_level(n).native_model == "best"


def two_hosts(native_model: str = "mpich") -> Cluster:
    """2 hosts x 2 ranks: shared memory 2 GB/s, 40 us; uplinks 0.1 GB/s, 30 us, shared."""
    return Cluster("2x2", (Level("host", 2, 2.0, 40.0, 1.0, True),
                           Level("network", 2, 0.1, 30.0, 0.5, True)),
                   memory_gbs=30.0, overhead_us=3.0, native_model=native_model,
                   native_overhead_us=1.0)


def test_mpich_native_across_hosts_is_reduce_leaders_allreduce_bcast() -> None:
    """MPICH's node-aware composition: the release_gather reduce to each host's first rank
    (8 KiB cells, each one hand-off at the library's per-message cost, the wire latency
    overlapped), the leaders' halving/doubling over the whole uplink (one rank per host: no
    sharing), the release_gather bcast."""
    from collectives.natives.mpich import SHM_CELL_BYTES as MPICH_SHM_CELL_BYTES

    m = Model(two_hosts())
    assert m.node_aware_native()
    size = 64 * MPICH_SHM_CELL_BYTES
    cells, cell = 64, MPICH_SHM_CELL_BYTES
    bw_host, red, o = 2e9, 30e9 / 3, 1e-6
    bcast = cells * (o + cell / bw_host)
    reduce = cells * (o + cell / bw_host + cell / red)
    # Two leaders: one exchange of half the buffer each way to reduce-scatter, one to gather,
    # each at the uplink's full 0.1 GB/s (the host's one link is the leader's alone).
    half = size / 2
    leaders = 2 * (30e-6 + half / 0.1e9 + 2 * o) + half / red
    assert m.time("native", {}, [size])[0] == pytest.approx(bcast + reduce + leaders,
                                                            rel=1e-9)
    # The flat halving/doubling over all four ranks (what MPICH runs with composition 2,
    # and what the model said before) is a different number: both ranks of a host share
    # the uplink in its cross-host step.
    flat = m.native_allreduce(1, 4, np.array([float(size)]))[0]
    assert flat != pytest.approx(bcast + reduce + leaders, rel=1e-3)
    # Not MPICH, one host, or one rank per host: no composition.
    assert not Model(two_hosts("best")).node_aware_native()
    assert not Model(mpich_level(4)).node_aware_native()
    one_per_host = replace(two_hosts(), levels=(
        Level("host", 1, 2.0, 40.0), Level("network", 4, 0.1, 30.0)))
    assert not Model(one_per_host).node_aware_native()
    for c in (two_hosts("best"), mpich_level(4), one_per_host):
        mm = Model(c)
        sizes = np.array([float(size)])
        assert mm.time("native", {}, sizes)[0] == pytest.approx(
            mm.native_allreduce(1, mm.n, sizes)[0], rel=1e-12)


def test_calibrate_passes_the_native_model_through() -> None:
    bw = [[np.nan, 2.0, 0.1, 0.1], [2.0, np.nan, 0.1, 0.1],
          [0.1, 0.1, np.nan, 2.0], [0.1, 0.1, 2.0, np.nan]]
    lat = [[np.nan if i == j else 40.0 for j in range(4)] for i in range(4)]
    hosts = [0, 0, 1, 1]
    assert calibrate((bw, lat), hosts=hosts, memory_gbs=30.0).native_model == "best"
    c = calibrate((bw, lat), hosts=hosts, memory_gbs=30.0, native_model="mpich")
    assert c.native_model == "mpich" and Model(c).node_aware_native()


def test_native_uses_the_library_reduction_rate_and_message_cost() -> None:
    m = Model(mpich_level(2))
    sizes = np.array([1e6])
    assert m.reduce_time(sizes, native=True)[0] == pytest.approx(1e6 / 4e9)
    assert m.reduce_time(sizes)[0] == pytest.approx(1e6 / 10e9)
    ours = m.rhd_phase(1, 2, sizes, False)[0]
    theirs = m.rhd_phase(1, 2, sizes, False, native=True)[0]
    assert ours - theirs == pytest.approx(2 * (3e-6 - 1e-6))


def test_monotone_pools_adjacent_violators() -> None:
    assert np.allclose(_monotone([1.0, 3.0, 2.0, 4.0]), [1.0, 2.5, 2.5, 4.0])
    assert np.allclose(_monotone([5.0, 1.0, 1.0]), [7 / 3] * 3)
    assert np.allclose(_monotone([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0])


def test_combine_takes_the_median_of_every_figure() -> None:
    runs = []
    for k in (1.0, 2.0, 9.0):
        lv = replace(one_level(2).levels[0], bandwidth_gbs=k, curve=((4096, k), (1 << 20, 2 * k)))
        runs.append(replace(one_level(2), levels=(lv,), overhead_us=k, memory_gbs=10 * k,
                            memory_curve=((4096, k),), native_memory_curve=((4096, 3 * k),),
                            native_model="mpich", native_overhead_us=k, page_fault_gbs=k))
    c = combine(runs)
    assert c.levels[0].curve == ((4096, 2.0), (1 << 20, 4.0))
    assert c.levels[0].bandwidth_gbs == 2.0 and c.overhead_us == 2.0 and c.memory_gbs == 20.0
    assert c.memory_curve == ((4096, 2.0),) and c.native_memory_curve == ((4096, 6.0),)
    assert c.native_overhead_us == 2.0 and c.page_fault_gbs == 2.0
    with pytest.raises(ValueError, match="no calibrations"):
        combine([])


def test_measure_on_one_rank_fills_every_primitive() -> None:
    """The in-process calibration on a world of one (the MPI runs are the validation
    script's): reduction curves, fresh pages, MPICH's native model; no exchange to time."""
    from mpi4py import MPI

    from autotune.model import measure

    sizes = (4096, 1 << 16)
    c = measure(MPI.COMM_SELF, sizes=sizes, reps=2)
    assert c.ranks == 1 and c.native_model == "mpich"
    assert [b for b, _ in c.memory_curve] == list(sizes)
    assert [b for b, _ in c.native_memory_curve] == list(sizes)
    assert all(g > 0 for _, g in c.memory_curve + c.native_memory_curve)
    assert c.page_fault_gbs > 0 and c.overhead_us >= 0
    # Non-decreasing reduction time with size, after pooling noise.
    times = [3 * b / g for b, g in c.memory_curve]
    assert times == sorted(times)


def test_concurrent_rings_read_a_measured_curve_at_their_total_size() -> None:
    """On a measured level one CPU copies all of a rank's flows: two rings of 512 KiB cost
    what one 1 MiB message costs (the curve is read at 1 MiB, not at 512 KiB)."""
    lv = replace(one_level(2).levels[0], bandwidth_gbs=4.0,
                 curve=((1 << 16, 1.0), (1 << 20, 4.0)))
    m = Model(replace(one_level(2), levels=(lv,)))
    size = 2 << 20
    seg = size / 4                       # per flow: half a block, two rings
    alpha, over, red = 2e-6, 3e-6, 30e9 / 3
    t = alpha + 2 * seg / 4e9            # two flows at the 1 MiB point, 4 GB/s
    want = (t + size / 2 / red + 4 * over) + (t + 4 * over)
    got = m.time("multiring", {"rings": 2, "chunk_bytes": 0}, [size])[0]
    assert got == pytest.approx(want, rel=1e-9)


def test_shm_models_single_copy_from_its_threshold() -> None:
    """One host: shm's fused run is single copy from ``SINGLE_COPY_MIN_BYTES`` (a memcpy's
    traffic per rank, two synchronisations per call), the segment's passes below it (copy
    in, reduce, copy out; three synchronisations per step)."""
    from collectives.algorithms.shm import SINGLE_COPY_MIN_BYTES

    n, chunk = 4, 1 << 20
    m = Model(one_level(n))
    over, red = 3e-6, 30e9 / 3
    big = float(SINGLE_COPY_MIN_BYTES)
    below = big - 4096
    t_big, t_below = m.time("shm", {"chunk_bytes": chunk}, [big, below])
    assert t_big == pytest.approx(2 * big / 3 / red + 2 * over, rel=1e-9)
    passes = below * (2.0 + (n + 1) / n + 2.0 * (n - 1) / n) / 3.0
    steps = np.ceil(below / (chunk * n))
    assert t_below == pytest.approx(passes / red + steps * 3 * over, rel=1e-9)
    assert t_big < t_below
