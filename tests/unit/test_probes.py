"""Probes on recorded machines (sysfs subtree + NVML answers) and on broken input: every
reader goes through the same parsing code as on a live machine."""

from __future__ import annotations

import dataclasses
import os
import sys
import types
from pathlib import Path

import pytest

import probes
from probes import gpu, layout, links, net, pci
from probes.gpu import RecordedResponder
from probes.sysfs import format_cpulist, normalize_bus_id, parse_cpulist
from probes.topology import Gpu, Host, Links, Nic, NumaNode, RankPlace, Topology
from tests.fixtures import MACHINES


def _world(h: Host, ranks: int | None = None) -> Topology:
    n = len(h.gpus) if ranks is None else ranks
    return Topology(hosts=(h,), ranks=tuple(
        RankPlace(rank=i, host=0, local_rank=i, gpu=i if h.gpus else None,
                  numa_node=h.gpus[i].numa_node if h.gpus else None) for i in range(n)))


# -- the three recorded machines --------------------------------------------------------

def test_dgx_a100_facts(machines: dict[str, Host]) -> None:
    h = machines["dgx-a100"]
    assert h.cpu_model == "AMD EPYC 7742 64-Core Processor"
    assert (h.sockets, h.cores, h.cpus) == (2, 128, 256)
    assert len(h.numa) == 8
    assert format_cpulist(h.numa[3].cpus) == "48-63,176-191"
    assert h.numa[0].distances == (10, 12, 12, 12, 32, 32, 32, 32)
    assert [g.bus_id for g in h.gpus] == ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0",
                                          "0000:4e:00.0", "0000:87:00.0", "0000:90:00.0",
                                          "0000:b7:00.0", "0000:bd:00.0"]
    # NVML says "not supported" for NUMA on x86: the node comes from sysfs.
    assert [g.numa_node for g in h.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert format_cpulist(h.gpus[4].cpus) == "112-127,240-255"
    g = h.gpus[0]
    assert (g.name, g.pcie_gen, g.pcie_width, g.memory_bytes) == (
        "NVIDIA A100-SXM4-40GB", 4, 16, 40536 << 20)
    assert all(cell == "NV12" for i, row in enumerate(h.gpu_matrix()) for j, cell in
               enumerate(row) if i != j)
    # Every GPU's 12 links go to the six NVSwitches, 2 each.
    assert [(nv.kind, nv.links) for nv in g.nvlinks] == [("switch", 2)] * 6
    assert {p.level for p in h.gpu_pairs} == {"PXB", "SYS"}
    ib = [n for n in h.nics if n.kind == "infiniband"]
    assert len(ib) == 9 and all(n.speed_mbps == 200000 and n.state == "active" for n in ib)
    assert [n.netdev for n in ib][:2] == ["ibp12s0", "ibp18s0"]
    # GPU0 is PXB to the two HCAs of its switch complex, SYS to the others (published).
    dev = {d.address: d for d in h.pci}
    levels = [pci.pcie_level(dev[g.bus_id], dev[n.pci]) for n in ib]
    assert levels == ["PXB", "PXB"] + ["SYS"] * 7
    switches = [d for d in h.pci if d.kind == "switch"]
    assert len(switches) == 6


def test_pcie_server_facts(machines: dict[str, Host]) -> None:
    h = machines["pcie-8gpu"]
    assert (h.sockets, h.cores, h.cpus, len(h.numa)) == (2, 28, 28, 2)
    want = [["X", "PIX", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"],
            ["PIX", "X", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"],
            ["PXB", "PXB", "X", "PIX", "SYS", "SYS", "SYS", "SYS"],
            ["PXB", "PXB", "PIX", "X", "SYS", "SYS", "SYS", "SYS"],
            ["SYS", "SYS", "SYS", "SYS", "X", "PIX", "PXB", "PXB"],
            ["SYS", "SYS", "SYS", "SYS", "PIX", "X", "PXB", "PXB"],
            ["SYS", "SYS", "SYS", "SYS", "PXB", "PXB", "X", "PIX"],
            ["SYS", "SYS", "SYS", "SYS", "PXB", "PXB", "PIX", "X"]]
    assert h.gpu_matrix() == want
    assert all(g.nvlinks == () for g in h.gpus)
    pair = h.gpu_pair(0, 5)
    assert pair is not None and (pair.p2p_read, pair.p2p_nvlink) == ("CNS", "NS")
    dev = {d.address: d for d in h.pci}
    (hca,) = h.nics
    assert (hca.kind, hca.speed_mbps, hca.numa_node, hca.netdev) == ("infiniband", 100000, 1,
                                                                     "ib0")
    assert [pci.pcie_level(dev[g.bus_id], dev[hca.pci]) for g in h.gpus] == \
        ["SYS"] * 4 + ["PHB"] * 4
    assert dev[h.gpus[0].bus_id].link_speed_gts == 8.0


def test_dgx1_facts(machines: dict[str, Host]) -> None:
    h = machines["dgx1-v100"]
    assert (h.sockets, h.cores, h.cpus) == (2, 40, 80)
    want = [["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
            ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
            ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
            ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
            ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
            ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
            ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
            ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"]]
    assert h.gpu_matrix() == want
    assert sum(nv.links for nv in h.gpus[0].nvlinks) == 6
    assert h.gpu_pair(0, 1).level == "PIX" and h.gpu_pair(0, 2).level == "PHB"  # type: ignore
    kinds = [(n.kind, n.speed_mbps, n.state) for n in h.nics]
    assert kinds == [("infiniband", 100000, "active")] * 4 + \
        [("ethernet", 10000, "up"), ("ethernet", None, "down")]
    assert [n.name for n in h.nics if n.kind == "infiniband"] == [f"mlx5_{i}" for i in
                                                                 range(4)]


@pytest.mark.parametrize("name", MACHINES)
def test_sysfs_levels_agree_with_nvml(machines: dict[str, Host], name: str) -> None:
    """The PCIe class computed from the sysfs tree equals NVML's common-ancestor level."""
    h = machines[name]
    dev = {d.address: d for d in h.pci}
    for p in h.gpu_pairs:
        a, b = h.gpus[p.a], h.gpus[p.b]
        assert pci.pcie_level(dev[a.bus_id], dev[b.bus_id]) == p.level, (p.a, p.b)


@pytest.mark.parametrize("name", MACHINES)
def test_yaml_and_json_round_trip(machines: dict[str, Host], name: str) -> None:
    topo = _world(machines[name])
    topo = dataclasses.replace(topo, links=Links(
        bandwidth_gbps=tuple(tuple(None if i == j else 10.0 + i + j for j in range(8))
                             for i in range(8)),
        latency_us=tuple(tuple(None if i == j else 1.5 for j in range(8)) for i in range(8)),
        message_bytes=1 << 20, small_bytes=8, repetitions=3))
    back = Topology.from_yaml(topo.to_yaml())
    assert back == topo
    assert back.fingerprint() == topo.fingerprint()
    assert Topology.from_json(topo.to_json()) == topo
    data = topo.to_dict()
    assert data["format"] == "ringtune-topology" and data["fingerprint"] == topo.fingerprint()


def test_live_machine_round_trip_and_speed() -> None:
    topo = probes.detect()
    assert topo.world_size == 1 and len(topo.hosts) == 1
    assert Topology.from_yaml(topo.to_yaml()) == topo
    assert topo.fingerprint().startswith("sha256:") and len(topo.fingerprint()) == 71


# -- fingerprint ------------------------------------------------------------------------

def test_fingerprint_equal_for_nodes_of_one_kind(machines: dict[str, Host]) -> None:
    a = _world(machines["dgx1-v100"])
    h = machines["dgx1-v100"]
    # Another node of the same kind: other name, bus ids, UUIDs, memory, measured links.
    other = dataclasses.replace(
        h, name="node-b", gpus=tuple(dataclasses.replace(
            g, uuid=f"GPU-other-{g.index}", bus_id=f"0001:{g.index:02x}:00.0",
            memory_bytes=(g.memory_bytes or 0) - 1) for g in h.gpus),
        nics=tuple(dataclasses.replace(n, pci=None, state="active") if n.kind != "ethernet"
                   else n for n in h.nics))
    b = dataclasses.replace(_world(other), links=Links(
        bandwidth_gbps=((None, 1.0),) * 0, latency_us=(), message_bytes=8))
    assert a.fingerprint() == b.fingerprint()
    # Host order does not matter either.
    two = Topology(hosts=(h, other), ranks=tuple(
        RankPlace(rank=r, host=r // 8, local_rank=r % 8, gpu=r % 8) for r in range(16)))
    swapped = Topology(hosts=(other, h), ranks=two.ranks)
    assert two.fingerprint() == swapped.fingerprint()


def test_fingerprint_changes_with_structure(machines: dict[str, Host]) -> None:
    h = machines["dgx1-v100"]
    base = _world(h)
    fp = base.fingerprint()
    changed = {
        "world size": _world(h, 4),
        "ranks per host": Topology(hosts=(h, h), ranks=tuple(
            RankPlace(rank=r, host=0 if r < 6 else 1, local_rank=r if r < 6 else r - 6,
                      gpu=r if r < 6 else r - 6) for r in range(8))),
        "gpu model": _world(dataclasses.replace(h, gpus=tuple(
            dataclasses.replace(g, name="Tesla V100-SXM2-16GB") for g in h.gpus))),
        "link class": _world(dataclasses.replace(h, gpu_pairs=tuple(
            dataclasses.replace(p, nvlinks=0) if (p.a, p.b) == (0, 1) else p
            for p in h.gpu_pairs))),
        "nic speed": _world(dataclasses.replace(h, nics=tuple(
            dataclasses.replace(n, speed_mbps=56000) if n.kind == "infiniband" else n
            for n in h.nics))),
        "numa shape": _world(dataclasses.replace(h, numa=h.numa[:1])),
        "cpu model": _world(dataclasses.replace(h, cpu_model="Intel(R) Xeon(R) Gold 6148")),
    }
    for what, topo in changed.items():
        assert topo.fingerprint() != fp, what
    assert len({t.fingerprint() for t in changed.values()}) == len(changed)


def test_summary_lines(machines: dict[str, Host]) -> None:
    cpu_host = Host(name="vm", cpu_model="x", numa=(NumaNode(id=0, cpus=(0, 1)),))
    cpu = Topology(hosts=(cpu_host,), ranks=tuple(RankPlace(rank=r) for r in range(4)))
    assert cpu.summary() == "1 host x 4 ranks, cpu, shm"
    alone = Topology(hosts=(cpu_host,), ranks=(RankPlace(rank=0),))
    assert alone.summary() == "1 host x 1 rank, cpu"
    eth = dataclasses.replace(cpu_host, nics=(Nic(name="e", kind="ethernet",
                                                  speed_mbps=10000),))
    spread = Topology(hosts=(eth, eth), ranks=(RankPlace(rank=0), RankPlace(rank=1, host=1)))
    assert spread.summary() == "2 hosts x 1 rank, cpu, eth 10G"
    two = Topology(hosts=(machines["dgx-a100"],) * 2, ranks=tuple(
        RankPlace(rank=r, host=r // 8, local_rank=r % 8, gpu=r % 8) for r in range(16)))
    assert two.summary() == "2 hosts x 8 ranks, NVIDIA A100-SXM4-40GB, nvlink+ib 200G"
    assert _world(machines["pcie-8gpu"]).summary() == \
        "1 host x 8 ranks, Tesla P100-PCIE-16GB, pcie"


# -- small parsers ----------------------------------------------------------------------

@pytest.mark.parametrize("raw,want", [
    (b"00000000:3B:00.0", "0000:3b:00.0"), ("00000000:3B:00.0", "0000:3b:00.0"),
    (b"00000001:AF:1F.7\x00\x00", "0001:af:1f.7"), ("3b:00.0", "0000:3b:00.0"),
    ("0000:3b:00.0", "0000:3b:00.0"), ("GPU-1234", None), (None, None), ("", None),
])
def test_normalize_bus_id(raw: object, want: str | None) -> None:
    assert normalize_bus_id(raw) == want


def test_cpulists() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("x,2,3-a,5") == (2, 5)
    assert parse_cpulist("") == () and parse_cpulist(None) == ()
    assert format_cpulist((0, 1, 2, 3, 8, 10, 11)) == "0-3,8,10-11"


def test_speed_and_rate_parsers() -> None:
    assert pci.parse_speed("16.0 GT/s PCIe") == 16.0 and pci.parse_speed("8 GT/s") == 8.0
    assert pci.parse_speed("Unknown") is None and pci.parse_speed("0 GT/s") is None
    assert [pci.gen_of(x) for x in (2.5, 5.0, 8.0, 16.0, 32.0, None)] == [1, 2, 3, 4, 5, None]
    assert net.parse_rate("200 Gb/sec (4X HDR)") == 200000
    assert net.parse_rate("25 Gb/sec (1X EDR)") == 25000 and net.parse_rate("junk") is None


# -- bad input: nothing crashes, unknown is unknown ---------------------------------------

def _file(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _vm_tree(root: Path) -> None:
    """A VM: numa_node -1, NIC speed -1, no InfiniBand, a loopback and a virtual bridge."""
    dev = "sys/devices/pci0000:00/0000:00:03.0"
    _file(root, f"{dev}/class", "0x020000")
    _file(root, f"{dev}/vendor", "0x1af4")
    _file(root, f"{dev}/numa_node", "-1")
    _file(root, f"{dev}/virtio2/net/eth0/speed", "-1")
    _file(root, f"{dev}/virtio2/net/eth0/operstate", "up")
    _file(root, f"{dev}/virtio2/net/eth0/mtu", "1500")
    _file(root, f"{dev}/virtio2/net/eth0/type", "1")
    for name, ntype in (("lo", "772"), ("br0", "1")):
        _file(root, f"sys/devices/virtual/net/{name}/type", ntype)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "sys/class/net").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:03.0",
               root / "sys/bus/pci/devices/0000:00:03.0")
    os.symlink("../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0",
               root / "sys/class/net/eth0")
    for name in ("lo", "br0"):
        os.symlink(f"../../devices/virtual/net/{name}", root / f"sys/class/net/{name}")


def test_vm_numa_minus_one_speed_minus_one_no_ib(tmp_path: Path) -> None:
    _vm_tree(tmp_path)
    devices = pci.read_pci(str(tmp_path))
    assert devices["0000:00:03.0"].numa_node is None
    assert devices["0000:00:03.0"].link_speed_gts is None  # file missing
    nics = net.read_nics(str(tmp_path), devices)
    assert nics == (Nic(name="eth0", kind="ethernet", speed_mbps=None, state="up", mtu=1500,
                        pci="0000:00:03.0", numa_node=None, netdev="eth0"),)


def test_empty_root_gives_unknowns(tmp_path: Path) -> None:
    h = layout.read_host(str(tmp_path), responder=RecordedResponder({}), name="empty")
    assert (h.cpu_model, h.sockets, h.cores, h.cpus) == (None, None, None, None)
    assert h.numa == () and h.gpus == () and h.nics == () and h.pci == ()
    topo = layout.single(h)
    assert topo.ranks[0].numa_node is None and topo.ranks[0].gpu is None
    assert Topology.from_yaml(topo.to_yaml()) == topo
    assert "host 0: empty" in _render(topo)


def _render(topo: Topology) -> str:
    from ringtune.commands.probe import render

    return render(topo)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    _vm_tree(tmp_path)
    dev = tmp_path / "sys/devices/pci0000:00/0000:00:03.0"
    (dev / "numa_node").unlink()
    (dev / "numa_node").mkdir()  # reading a folder fails like an unreadable file
    os.symlink("nowhere", dev / "current_link_speed")  # dangling link
    (dev / "class").write_bytes(b"\xff\xfe\x00garbage")
    eth = dev / "virtio2/net/eth0"
    (eth / "mtu").write_text("lots\n")
    _file(tmp_path, "proc/cpuinfo", "processor : 0\nphysical id : x\ncore id : y\n")
    _file(tmp_path, "sys/devices/system/node/node0/cpulist", "0-1")
    _file(tmp_path, "sys/devices/system/node/node0/distance", "ten")
    h = layout.read_host(str(tmp_path), responder=RecordedResponder({}), name="odd")
    d = pci.read_pci(str(tmp_path))["0000:00:03.0"]
    assert (d.numa_node, d.link_speed_gts, d.kind) == (None, None, "other")
    (nic,) = h.nics
    assert nic.mtu is None and nic.speed_mbps is None
    assert h.numa == (NumaNode(id=0, cpus=(0, 1), distances=()),)
    assert h.cpus == 1 and h.sockets is None


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root reads files whatever their mode")
def test_permission_denied_file(tmp_path: Path) -> None:
    _vm_tree(tmp_path)
    speed = tmp_path / "sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0/operstate"
    speed.chmod(0)
    (nic,) = net.read_nics(str(tmp_path))
    assert nic.state is None


def test_no_nvml_library(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    gpus, pairs, source = gpu.read_gpus(str(tmp_path))
    assert gpus == () and pairs == () and source.startswith("unavailable:")
    assert "nvidia-ml-py" in source


def test_nvml_without_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = types.ModuleType("pynvml")

    def init() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, _, source = gpu.read_gpus(str(tmp_path))
    assert gpus == () and "Library Not Found" in source


def test_nvml_library_with_no_gpu_and_failing_calls(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """The live adapter over a fake pynvml: every per-device call fails (NotSupported)."""
    fake = types.ModuleType("pynvml")
    calls: list[str] = []

    def fail(*_: object) -> None:
        raise RuntimeError("NVMLError_NotSupported")

    fake.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    fake.nvmlSystemGetDriverVersion = lambda: b"550.54.15"  # type: ignore[attr-defined]
    fake.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("h", i)  # type: ignore[attr-defined]
    for fn in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetMemoryInfo",
               "nvmlDeviceGetPciInfo", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetCpuAffinity",
               "nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetCurrPcieLinkWidth",
               "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
               "nvmlDeviceGetNvLinkState"):
        setattr(fake, fn, fail)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gpus, pairs, source = gpu.read_gpus(str(tmp_path))
    assert source == "nvml 550.54.15" and pairs == ()
    assert gpus == (Gpu(index=0),)
    assert calls == ["init", "shutdown"]
    fake.nvmlDeviceGetCount = lambda: 0  # type: ignore[attr-defined]
    assert gpu.read_gpus(str(tmp_path))[:2] == ((), ())


def test_nvswitch_links_without_remote_type(tmp_path: Path) -> None:
    """Older drivers cannot name the remote device type: links to a bus id that is not one
    of the GPUs are NVSwitch links, so two GPUs with 2 such links each are NV2."""
    sw = ["00000000:C4:00.0", None]
    nv = RecordedResponder({"gpus": [{"bus_id": "00000000:07:00.0", "nvlinks": [sw, sw]},
                                     {"bus_id": "00000000:0F:00.0", "nvlinks": [sw, sw]}]})
    _, pairs = gpu.gpus_from(nv, str(tmp_path))
    assert pairs[0].nvlinks == 2 and pairs[0].label == "NV2"


def test_recorded_responder_with_missing_answers(machines: dict[str, Host],
                                                 tmp_path: Path) -> None:
    nv = RecordedResponder({"gpus": [{"bus_id": "00000000:06:00.0"},
                                     {"name": "X", "pcie": [3, None, "?", -1]}]})
    gpus, pairs = gpu.gpus_from(nv, str(tmp_path))
    assert gpus[0].bus_id == "0000:06:00.0" and gpus[0].numa_node is None
    assert (gpus[1].pcie_gen, gpus[1].pcie_width, gpus[1].pcie_max_gen) == (3, None, None)
    assert pairs[0].level is None and pairs[0].label == "?"


# -- rank layout and link schedule --------------------------------------------------------

def test_bind_gpu(machines: dict[str, Host]) -> None:
    h = machines["dgx1-v100"]
    assert layout.bind_gpu(h, {"local_rank": 3, "visible": None}) == 3
    assert layout.bind_gpu(h, {"local_rank": 9, "visible": None}) == 1
    assert layout.bind_gpu(h, {"local_rank": 1, "visible": "4,5"}) == 5
    assert layout.bind_gpu(h, {"local_rank": 0, "visible": "GPU-fixture-v100-6"}) == 6
    assert layout.bind_gpu(h, {"local_rank": 0, "visible": ""}) is None
    assert layout.bind_gpu(h, {"local_rank": 0, "visible": "MIG-abc"}) is None
    assert layout.bind_gpu(h, {"local_rank": 0, "cuda_bus": "00000000:89:00.0"}) == 6
    assert layout.bind_gpu(Host(), {"local_rank": 0}) is None
    p = layout.place(0, 0, h, {"local_rank": 0, "visible": "2", "cpus": (0, 1)})
    assert (p.gpu, p.numa_node) == (2, 0)
    p = layout.place(0, 0, Host(numa=(NumaNode(id=0, cpus=(0, 1)),
                                      NumaNode(id=1, cpus=(2, 3)))),
                     {"local_rank": 0, "cpus": (2, 3)})
    assert p.numa_node == 1


@pytest.mark.parametrize("n", range(1, 10))
def test_round_robin_schedule(n: int) -> None:
    rounds = links.schedule(n)
    seen = [pair for r in rounds for pair in r]
    assert sorted(seen) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for r in rounds:
        ranks = [x for pair in r for x in pair]
        assert len(ranks) == len(set(ranks))  # disjoint: no rank twice in a round
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


# -- topology files -----------------------------------------------------------------------

def test_load_topology_and_env(tmp_path: Path, machines: dict[str, Host],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    topo = _world(machines["pcie-8gpu"], 1)
    f = tmp_path / "one.yaml"
    f.write_text(topo.to_yaml())
    assert probes.load_topology(f) == dataclasses.replace(topo, source=str(f))
    monkeypatch.setenv("RINGTUNE_TOPOLOGY", str(f))
    got = probes.detect()
    assert got.source == str(f) and got.fingerprint() == topo.fingerprint()
    assert probes.world_fingerprint(None, got) == topo.fingerprint()
    # Hosts only: the layout comes from this process (1 rank, GPU by local rank).
    hosts_only = tmp_path / "hosts.json"
    hosts_only.write_text(Topology(hosts=(machines["dgx1-v100"],)).to_json())
    monkeypatch.setenv("RINGTUNE_TOPOLOGY", str(hosts_only))
    got = probes.detect()
    assert got.world_size == 1 and got.ranks[0].gpu in (0, None)
    assert got.hosts[0].gpu_matrix() == machines["dgx1-v100"].gpu_matrix()
    # A layout for another world size is refused.
    f8 = tmp_path / "eight.yaml"
    f8.write_text(_world(machines["pcie-8gpu"]).to_yaml())
    with pytest.raises(probes.TopologyError, match=r"eight.yaml: ranks: .*8 ranks.* has 1"):
        probes.detect(topology_file=str(f8))


HOSTS_OK = "hosts:\n- name: a\n  gpus:\n  - {index: 0, name: G}\n"


@pytest.mark.parametrize("text,words", [
    ("hosts: [", ["not valid YAML"]),
    ("- 1\n- 2\n", ["top level", "mapping"]),
    ("ranks: []\n", ["hosts", "missing"]),
    ("hosts: []\n", ["hosts", "empty"]),
    ("hosts:\n- name: a\n  gpu: []\n", ["hosts[0].gpu", "unknown key"]),
    ("hosts:\n- {cores: many}\n", ["hosts[0].cores", "integer", "'many'"]),
    ("hosts:\n- {numa: [{cpus: 0-3}]}\n", ["hosts[0].numa[0].id", "missing"]),
    ("hosts:\n- {nics: [{name: e, kind: token-ring}]}\n", ["hosts[0].nics[0].kind"]),
    (HOSTS_OK + "ranks:\n- {rank: 0, host: 3}\n", ["ranks[0].host", "3"]),
    (HOSTS_OK + "ranks:\n- {rank: 0, host: 0, gpu: 4}\n", ["ranks[0].gpu", "4"]),
    (HOSTS_OK + "ranks:\n- {rank: 1}\n", ["ranks[0].rank", "expected 0"]),
    (HOSTS_OK + "  gpu_pairs:\n  - {a: 0, b: 1}\n", ["hosts[0].gpu_pairs[0]"]),
    (HOSTS_OK + "  gpu_pairs: []\nranks:\n- {rank: 0}\nlinks: {bandwidth_gbps: [[1, 2]]}\n",
     ["links.bandwidth_gbps", "1x1"]),
    ("format: other\nhosts: []\n", ["format", "ringtune-topology"]),
    ("version: 7\n" + HOSTS_OK, ["version", "7"]),
])
def test_malformed_topology_names_file_and_key(tmp_path: Path, text: str,
                                               words: list[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(probes.TopologyError) as info:
        probes.load_topology(f)
    msg = str(info.value)
    assert msg.startswith(str(f)), msg
    for w in words:
        assert w in msg, msg
    assert isinstance(info.value, ValueError)


def test_missing_and_binary_topology_files(tmp_path: Path) -> None:
    with pytest.raises(probes.TopologyError, match="nope.yaml: cannot read"):
        probes.load_topology(tmp_path / "nope.yaml")
    b = tmp_path / "bin.yaml"
    b.write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(probes.TopologyError, match="bin.yaml"):
        probes.load_topology(b)
    j = tmp_path / "t.json"
    j.write_text("{hosts: }")
    with pytest.raises(probes.TopologyError, match=r"t.json: line 1: not valid JSON"):
        probes.load_topology(j)


def test_hand_written_minimal_topology(tmp_path: Path) -> None:
    f = tmp_path / "vm.yaml"
    f.write_text("# a VM that hides its GPUs' links\nhosts:\n- name: vm\n  numa:\n"
                 "  - {id: 0, cpus: 0-7}\n  gpus:\n  - {index: 0, name: NVIDIA A10}\n"
                 "  - {index: 1, name: NVIDIA A10}\n  gpu_pairs:\n"
                 "  - {a: 0, b: 1, level: PHB}\n  nics:\n"
                 "  - {name: eth0, kind: ethernet, speed_mbps: 25000}\n")
    t = probes.load_topology(f)
    assert t.hosts[0].numa[0].cpus == tuple(range(8))
    assert t.hosts[0].gpu_matrix() == [["X", "PHB"], ["PHB", "X"]]
    assert t.ranks == () and t.fingerprint().startswith("sha256:")
