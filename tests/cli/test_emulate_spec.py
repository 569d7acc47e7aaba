"""Cluster files for ``ringtune emulate``: the shipped ones load (and simulate), bad ones
are one line naming the file and key with exit code 2 — before anything is built."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ringtune.emulate.spec import load_emulated

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "profiles" / "clusters"

BASE = """name: t
ranks: {ranks}
ranks_per_host: {per}
memory_gbs: 10
levels:
  - {{name: shm, size: {per}, bandwidth_gbs: 2, latency_us: 1}}
  - {{name: uplink, size: {hosts}, bandwidth_gbs: {bw}, links_per_rank: {lpr}, latency_us: 50}}
"""


def _file(tmp_path: Path, text: str) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_shipped_files_load_for_emulation_and_simulation() -> None:
    two = load_emulated(str(CLUSTERS / "emulated-2x2.yaml"), cores=2)
    assert (two.hosts, two.ranks_per_host, two.racks) == (2, 2, 1)
    assert [t.rate_bps for t in two.tiers] == [10**9]
    three = load_emulated(str(CLUSTERS / "emulated-3x1.yaml"), cores=2)
    assert (three.hosts, three.ranks_per_host) == (3, 1)
    pair = load_emulated(str(CLUSTERS / "emulated-2x1.yaml"), cores=2)
    assert (pair.hosts, pair.ranks_per_host, pair.ranks) == (2, 1, 2)
    assert [t.rate_bps for t in pair.tiers] == [10**9]
    racks = load_emulated(str(CLUSTERS / "emulated-2r2x1.yaml"), cores=2)
    assert (racks.hosts, racks.racks, racks.hosts_per_rack) == (4, 2, 2)
    assert [t.rate_bps for t in racks.tiers] == [10**9, 5 * 10**8]
    jumbo = load_emulated(str(CLUSTERS / "emulated-2x2-jumbo-throttle.yaml"), cores=2)
    assert (jumbo.mtu, jumbo.progress, jumbo.ranks) == (9000, "throttle", 4)
    for name in ("emulated-2x2", "emulated-3x1", "emulated-2x1", "emulated-2r2x1",
                 "emulated-2x2-jumbo-throttle"):
        res = subprocess.run([sys.executable, "-m", "ringtune.cli", "simulate", "--cluster",
                              str(CLUSTERS / f"{name}.yaml"), "-b", "1M", "-e", "4M"],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert f"# cluster {name}:" in res.stdout, res.stdout


@pytest.mark.parametrize("text,message", [
    (BASE.format(ranks=4, per=2, hosts=2, bw=0, lpr=0.5),
     "levels[1].bandwidth_gbs: expected a positive number, got 0"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=-1, lpr=0.5),
     "levels[1].bandwidth_gbs: expected a positive number, got -1"),
    (BASE.format(ranks=12, per=6, hosts=2, bw=0.125, lpr=1),
     "12 ranks on 2 CPU core(s) is more than 4 per core"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "emulate: {racks: 2}\n",
     "emulate.racks: unknown key"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "colour: red\n",
     "colour: unknown key"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5)
     + "emulate: {hostname_prefix: 'Bad Name'}\n", "emulate.hostname_prefix"),
    (BASE.format(ranks=4, per=2, hosts=2, bw="0.0001", lpr=0.5), "at least 1 Mbit/s"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "emulate: {mtu: 100}\n",
     "emulate.mtu: expected an integer 576..65535"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "emulate: {mtu: 9000.0}\n",
     "emulate.mtu"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "emulate: {mtu: true}\n",
     "emulate.mtu"),
    (BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5) + "emulate: {progress: poll}\n",
     "emulate.progress: expected one of spin, throttle"),
    ("name: t\nranks: 2\nmemory_gbs: 10\nlevels:\n"
     "  - {name: shm, size: 2, bandwidth_gbs: 2, latency_us: 1}\n",
     "emulation needs a network level"),
])
def test_bad_cluster_file_is_one_line_exit_2(tmp_path: Path, text: str, message: str) -> None:
    path = _file(tmp_path, text)
    with pytest.raises(ValueError, match=None) as info:
        load_emulated(path, cores=2)
    assert message in str(info.value) and path in str(info.value), str(info.value)
    res = subprocess.run([sys.executable, "-m", "ringtune.cli", "emulate", "--cluster", path,
                          "--", "true"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], res.stderr


def test_mtu_defaults_to_ethernet_and_takes_jumbo_frames(tmp_path: Path) -> None:
    text = BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5)
    assert load_emulated(_file(tmp_path, text), cores=2).mtu == 1500
    assert load_emulated(_file(tmp_path, text + "emulate: {mtu: 9000}\n"), cores=2).mtu == 9000


def test_progress_spins_unless_throttle_is_asked_for(tmp_path: Path) -> None:
    from collectives.training.exchange import QUIET_PROGRESS_ENV

    text = BASE.format(ranks=4, per=2, hosts=2, bw=0.125, lpr=0.5)
    default = load_emulated(_file(tmp_path, text), cores=2)
    assert default.progress == "spin" and not default.throttled
    assert default.progress_env({}) == {}
    thr = load_emulated(_file(tmp_path, text + "emulate: {progress: throttle}\n"), cores=2)
    assert thr.throttled and thr.progress_env({}) == QUIET_PROGRESS_ENV
    # What the user set wins, variable by variable.
    mine = {"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "0"}
    assert "MPIR_CVAR_CH4_PROGRESS_THROTTLE" not in thr.progress_env(mine)
    assert len(thr.progress_env(mine)) == len(QUIET_PROGRESS_ENV) - 1


def test_oversubscribe_is_an_explicit_choice(tmp_path: Path) -> None:
    text = BASE.format(ranks=12, per=6, hosts=2, bw=0.125, lpr=1)
    spec = load_emulated(_file(tmp_path, text + "emulate: {oversubscribe: true}\n"), cores=2)
    assert spec.ranks == 12


def test_usage_errors_exit_2() -> None:
    for argv in (["emulate", "--", "true"], ["emulate", "--cluster",
                                              str(CLUSTERS / "emulated-2x2.yaml")],
                 ["emulate", "--cleanup", "--", "true"],
                 ["emulate", "--cluster", str(CLUSTERS / "emulated-2x2.yaml"),
                  "--hostname-prefix", "a;b", "--", "true"]):
        res = subprocess.run([sys.executable, "-m", "ringtune.cli", *argv], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and res.stderr.startswith("ringtune: error: emulate"), (
            argv, res.stderr)


def test_without_root_it_exits_77_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from ringtune import cli
    from ringtune.emulate import netns

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    code = cli.main(["emulate", "--cluster", str(CLUSTERS / "emulated-2x2.yaml"), "--", "true"])
    err = capsys.readouterr().err
    assert code == 77 and "emulate unavailable here: needs root" in err, err
    if os.path.exists("/run/netns"):  # nothing half-built (this process's run id)
        assert not [n for n in netns.namespaces() if n.startswith(f"rtemu-{os.getpid()}-")]
