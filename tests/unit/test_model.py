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
from autotune.model import Model, best_guesses, calibrate
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
    want = 2 * (n - 1) * (alpha + seg / bw + over) + (n - 1) * seg / red
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
    assert set(best) == {"native", "multiring", "rhd", "hierarchical"}
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
    assert first in ("native", "rhd", "hierarchical")
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
    data["levels"] = [dict(lv) for lv in GOOD["levels"]]  # type: ignore[union-attr]
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
