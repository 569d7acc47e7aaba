"""``probes`` under MPI at any world size 1..4: detect() gives every rank the same topology,
the layout matches ``Split_type(COMM_TYPE_SHARED)``, measure() fills a symmetric matrix,
and a bad topology file fails on every rank alike."""

from __future__ import annotations

import os
import tempfile

import pytest
from mpi4py import MPI

import probes
from probes.links import measure

from .conftest import WORLD, agree


def test_detect_same_everywhere_and_layout_matches_mpi() -> None:
    topo = probes.detect(WORLD)
    n, rank = WORLD.Get_size(), WORLD.Get_rank()
    local = WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    fails = []
    fps = WORLD.allgather(topo.fingerprint())
    if len(set(fps)) != 1:
        fails.append(f"fingerprints differ: {fps}")
    if topo.world_size != n or [p.rank for p in topo.ranks] != list(range(n)):
        fails.append(f"ranks {topo.ranks} for world size {n}")
    me = topo.ranks[rank] if rank < topo.world_size else None
    if me is None or me.local_rank != local_rank:
        fails.append(f"local rank {me} != {local_rank}")
    elif topo.ranks_per_host()[me.host] != local_size:
        fails.append(f"host {me.host} has {topo.ranks_per_host()} ranks, MPI says {local_size}")
    if WORLD.allgather(probes.world_fingerprint(WORLD)) != fps:
        fails.append("world_fingerprint differs from detect().fingerprint()")
    if WORLD.allgather(topo.summary()) != [topo.summary()] * n:
        fails.append("summaries differ")
    agree(fails)


def test_measure_tiny_matrix() -> None:
    links = measure(WORLD, message_bytes=4096, small_bytes=8, repetitions=2)
    n = WORLD.Get_size()
    fails = []
    for name, m in (("bandwidth", links.bandwidth_gbps), ("latency", links.latency_us)):
        if len(m) != n or any(len(row) != n for row in m):
            fails.append(f"{name}: not {n}x{n}")
            continue
        for i in range(n):
            for j in range(n):
                v = m[i][j]
                if (i == j) != (v is None) or (v is not None and not v > 0):
                    fails.append(f"{name}[{i}][{j}] = {v}")
                if m[i][j] != m[j][i]:
                    fails.append(f"{name} not symmetric at {i},{j}")
    everyone = WORLD.allgather(links)
    if any(x != everyone[0] for x in everyone):
        fails.append("ranks got different matrices")
    topo = probes.detect(WORLD, measure=True, message_bytes=1024, repetitions=1)
    if topo.links is None or len(topo.links.bandwidth_gbps) != n:
        fails.append("detect(measure=True) did not attach links")
    elif sorted(topo.ring_order()) != list(range(n)):
        fails.append(f"ring order {topo.ring_order()} not a permutation")
    agree(fails)


def _shared_path(name: str) -> str:
    """A file name every rank agrees on (rank 0 picks the folder)."""
    folder = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-probes-") if WORLD.Get_rank() == 0
                         else None)
    return os.path.join(folder, name)


def test_topology_file_hosts_only_and_malformed() -> None:
    detected = probes.detect(WORLD)
    good = _shared_path("hosts.yaml")
    bad = _shared_path("bad.yaml")
    if WORLD.Get_rank() == 0:
        hosts_only = probes.Topology(hosts=detected.hosts[:1])
        with open(good, "w") as fh:
            fh.write(hosts_only.to_yaml())
        with open(bad, "w") as fh:
            fh.write("hosts:\n- {cores: many}\n")
    WORLD.Barrier()
    fails = []
    t = probes.detect(WORLD, topology_file=good)
    if [p.local_rank for p in t.ranks] != [p.local_rank for p in detected.ranks]:
        fails.append(f"layout from file {t.ranks} != detected {detected.ranks}")
    if t.source != good:
        fails.append(f"source {t.source}")
    try:
        probes.detect(WORLD, topology_file=bad)
        fails.append("malformed file accepted")
    except probes.TopologyError as exc:
        if "bad.yaml" not in str(exc) or "hosts[0].cores" not in str(exc):
            fails.append(f"unclear error: {exc}")
    agree(fails)
    WORLD.Barrier()
    if WORLD.Get_rank() == 0:
        for f in (good, bad):
            os.unlink(f)
        os.rmdir(os.path.dirname(good))


@pytest.mark.parametrize("rings", [1, 3])
def test_allreduce_with_topology_orders(rings: int) -> None:
    import numpy as np

    from collectives import Communicator

    topo = probes.detect(WORLD)
    comm = Communicator(WORLD, topology=topo)
    n, rank = WORLD.Get_size(), WORLD.Get_rank()
    buf = np.arange(1000, dtype=np.float64) + rank
    comm.allreduce(buf, algorithm="multiring", rings=rings, chunk_bytes=1024, order="topology")
    want = n * np.arange(1000, dtype=np.float64) + n * (n - 1) / 2
    comm.close()
    agree([] if np.array_equal(buf, want) else [f"wrong result, first {buf[:3]}"])
