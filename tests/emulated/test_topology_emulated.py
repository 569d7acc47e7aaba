"""What the topology code sees on emulated hosts: the probe's hosts and ranks per host,
fingerprints by shape (not by hostname), a profile from another shape refused, and ring
orders that cross hosts as little as possible under round-robin placement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import CLUSTERS, ROOT, emulate, last_json, worker


@pytest.mark.parametrize("shape,hosts,per_host", [("2x2", 2, 2), ("3x1", 3, 1)])
def test_probe_sees_hosts_and_ranks_per_host(shape: str, hosts: int, per_host: int) -> None:
    res = emulate(shape, ["ringtune", "probe", "--json"], timeout=120)
    assert res.returncode == 0, res.stderr
    topo = json.loads(res.stdout)
    names = [h["name"] for h in topo["hosts"]]
    assert names == [f"emu{i}" for i in range(hosts)], names
    assert topo["summary"].startswith(f"{hosts} hosts x {per_host} rank"), topo["summary"]
    layout = [r["host"] for r in topo["ranks"]]
    assert layout == [r // per_host for r in range(hosts * per_host)], layout


def test_fingerprint_by_shape_not_hostname() -> None:
    a = last_json(emulate("2x2", worker("fingerprint"), timeout=120).stdout)
    b = last_json(emulate("2x2", worker("fingerprint"), "--hostname-prefix", "node",
                          timeout=120).stdout)
    c = last_json(emulate("3x1", worker("fingerprint"), timeout=120).stdout)
    assert a["hostnames"] == ["emu0", "emu0", "emu1", "emu1"]
    assert b["hostnames"] == ["node0", "node0", "node1", "node1"]
    assert a["fingerprint"] == b["fingerprint"]
    assert c["fingerprint"] != a["fingerprint"]


def _one_host(command: list[str], env: dict[str, str] | None = None) -> dict:
    """``command`` at 4 ranks on this one host (1 x 4)."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    res = subprocess.run(["timeout", "120", mpiexec, "-n", "4", sys.executable, *command[1:]],
                         cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    return last_json(res.stdout)


def test_profile_tuned_on_2x2_is_refused_on_1x4(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "p.yaml"
    res = emulate("2x2", ["ringtune", "tune", "--out", str(out), "--buckets", "64K",
                          "--trials", "3", "--budget", "60", "--no-progress"], timeout=240)
    assert res.returncode == 0, res.stderr
    there = last_json(emulate("2x2", worker("profile", str(out)), timeout=120).stdout)
    assert there == {"used": True, "strict": "no error", "warnings": []}, there
    here = _one_host(worker("profile", str(out)))
    assert not here["used"], here
    # The warning names both layouts (same world size, other hosts).
    assert len(here["warnings"]) == 1 and \
        "tuned for 4 ranks on 2 hosts, this job has 4 ranks on 1 host" in here["warnings"][0], \
        here
    assert here["strict"].startswith("TopologyMismatchError"), here


def _crossings(hosts: list[str], nxt: list[list[int]]) -> list[int]:
    rings = len(nxt[0])
    return [sum(hosts[r] != hosts[nxt[r][k]] for r in range(len(hosts))) for k in range(rings)]


def test_topology_order_crosses_hosts_least_under_round_robin() -> None:
    specs = ["topology:1", "topology:2", "identity:1", "identity:2"]
    got = last_json(emulate("2x2", worker("rings", *specs), "--placement", "round-robin",
                            timeout=120).stdout)
    hosts = got["hosts"]
    assert hosts == ["emu0", "emu1", "emu0", "emu1"], hosts
    assert all(got[s]["ok"] for s in specs), got
    # A ring through 2 hosts must leave each host once: 2 crossings is the minimum.
    assert _crossings(hosts, got["topology:1"]["next"]) == [2], got
    assert _crossings(hosts, got["topology:2"]["next"]) == [2, 2], got
    # The identity ring 0-1-2-3 alternates hosts on every hop.
    assert _crossings(hosts, got["identity:1"]["next"]) == [4], got


def test_jumbo_frames_reach_every_host_and_carry_mpi(tmp_path: Path) -> None:
    """``emulate: {mtu: 9000}``: every host's link has that MTU (the bridges follow their
    ports), and MPI's traffic crosses it: checked allreduces of 4 MiB across 3 hosts."""
    import yaml

    data = yaml.safe_load((CLUSTERS / "emulated-3x1.yaml").read_text())
    data.setdefault("emulate", {})["mtu"] = 9000
    path = tmp_path / "jumbo-3x1.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    res = emulate(str(path), ["sh", "-c", 'echo "mtu $PMI_RANK $(cat /sys/class/net/eth0/mtu)"'],
                  timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(ln for ln in res.stdout.splitlines() if ln.startswith("mtu ")) == [
        "mtu 0 9000", "mtu 1 9000", "mtu 2 9000"], res.stdout
    got = last_json(emulate(str(path), worker("allreduce", str(1 << 20), "2"), timeout=120).stdout)
    assert got == {"ok": True}, got


def test_progress_setting_reaches_every_rank(tmp_path: Path) -> None:
    """``emulate: {progress: throttle}`` puts MPICH's quiet-progress variables in every
    rank's environment, a variable the user set keeps the user's value, and ``spin`` adds
    none."""
    import yaml

    from collectives.training.exchange import QUIET_PROGRESS_ENV

    data = yaml.safe_load((CLUSTERS / "emulated-3x1.yaml").read_text())
    show = ["sh", "-c", 'echo "env $PMI_RANK ${MPIR_CVAR_CH4_PROGRESS_THROTTLE:-unset} '
            '${MPIR_CVAR_POLLS_BEFORE_YIELD:-unset}"']
    env = {k: v for k, v in os.environ.items() if k not in QUIET_PROGRESS_ENV}
    seen = {}
    for mode in ("throttle", "spin"):
        data.setdefault("emulate", {})["progress"] = mode
        path = tmp_path / f"{mode}-3x1.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        res = emulate(str(path), show, timeout=60,
                      env={**env, "MPIR_CVAR_POLLS_BEFORE_YIELD": "7"})
        assert res.returncode == 0, res.stderr
        seen[mode] = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("env "))
    throttle = QUIET_PROGRESS_ENV["MPIR_CVAR_CH4_PROGRESS_THROTTLE"]
    assert seen["throttle"] == [f"env {r} {throttle} 7" for r in range(3)], seen
    assert seen["spin"] == [f"env {r} unset 7" for r in range(3)], seen
