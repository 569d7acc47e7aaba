"""`ringtune probe` as a user runs it: alone, under mpiexec, with files in and out, and with
a malformed topology file (exit 2, one line naming the file and the key)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import probes
from probes import layout
from probes.topology import RankPlace, Topology
from tests.fixtures import materialize

RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PMI_", "HYDRA", "RINGTUNE_"))}


def _run(args: list[str], timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(RINGTUNE + args, capture_output=True, text=True, timeout=timeout,
                          env=_env())


def test_probe_alone_writes_yaml_and_json(tmp_path: Path) -> None:
    out = tmp_path / "topo.yaml"
    proc = _run(["probe", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ringtune probe: 1 host x 1 rank, ")
    assert "ranks:" in proc.stdout and f"wrote {out}" in proc.stdout
    topo = probes.load_topology(out)
    assert topo.world_size == 1 and topo.fingerprint() in proc.stdout
    proc = _run(["probe", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["format"] == "ringtune-topology" and data["fingerprint"] == topo.fingerprint()
    j = tmp_path / "t.json"
    assert _run(["probe", "--out", str(j)]).returncode == 0
    assert probes.load_topology(j).fingerprint() == topo.fingerprint()


def test_probe_shows_a_recorded_machine(tmp_path: Path) -> None:
    root, nv = materialize("dgx1-v100", tmp_path)
    h = layout.read_host(root, responder=nv, name="dgx1")
    topo = Topology(hosts=(h,), ranks=(RankPlace(rank=0, gpu=0, numa_node=0),))
    f = tmp_path / "dgx1.yaml"
    f.write_text(topo.to_yaml())
    proc = _run(["probe", "--topology", str(f)])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(ln.split() for ln in lines if ln.split()[:2] == ["GPU0", "X"])
    assert row[1:9] == ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"]
    assert "Tesla V100-SXM2-32GB" in proc.stdout and "mlx5_3" in proc.stdout
    assert f"source: {f}" in proc.stdout


@pytest.mark.parametrize("text,key", [("hosts:\n- {cores: many}\n", "hosts[0].cores"),
                                      ("hosts: [\n", "not valid YAML"),
                                      ("hosts:\n- {gpus: [{name: x}]}\n",
                                       "hosts[0].gpus[0].index")])
def test_malformed_topology_exit_2_one_line(tmp_path: Path, text: str, key: str) -> None:
    f = tmp_path / "broken.yaml"
    f.write_text(text)
    proc = _run(["probe", "--topology", str(f)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and key in lines[0], proc.stderr
    env_proc = subprocess.run(RINGTUNE + ["probe"], capture_output=True, text=True,
                              timeout=60, env={**_env(), "RINGTUNE_TOPOLOGY": str(f)})
    assert env_proc.returncode == 2 and str(f) in env_proc.stderr


def test_probe_measure_under_mpiexec(tmp_path: Path) -> None:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    if not mpiexec.exists():
        pytest.skip("mpiexec from the mpich wheel is not installed next to this Python")
    out = tmp_path / "m.yaml"
    cmd = [str(mpiexec), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "ringtune.cli",
           "probe", "--measure", "--measure-bytes", "16K", "--repetitions", "2",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ringtune probe:") == 1  # rank 0 prints
    assert "measured bandwidth GB/s (16384 B messages, median of 2)" in proc.stdout
    topo = probes.load_topology(out)
    assert topo.world_size == 2 and topo.links is not None
    assert topo.links.bandwidth_gbps[0][1] and topo.links.bandwidth_gbps[0][1] > 0


def test_probe_np_launches_its_own_ranks(tmp_path: Path) -> None:
    """``ringtune probe -np 2`` (the README's): the same as under ``mpiexec -n 2``, the
    launcher started by ringtune itself; ``-n`` is the repetitions' nccl-tests name."""
    out = tmp_path / "m.yaml"
    proc = _run(["probe", "-np", "2", "--measure", "--measure-bytes", "16K", "-n", "2",
                 "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ringtune probe:") == 1  # rank 0 prints
    assert "measured bandwidth GB/s (16384 B messages, median of 2)" in proc.stdout
    assert probes.load_topology(out).world_size == 2
