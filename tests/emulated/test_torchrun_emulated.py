"""``ringtune emulate --launcher torchrun``: a torchrun job across emulated hosts, one
torchrun agent per host inside its namespace (needs torch: run with .venv-torch's python,
``make torch-test``). On 2 hosts x 2 ranks: the contract of every algorithm over the torch
engine with the ranks on two hosts; DDP over ``init_process_group("ringtune")`` tracking DDP
over gloo; online tuning settling on the tier-aware grid for a large message; a killed rank
ending the job in bounded time with the rank named; and the bad input of the option."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ..child_signals import SIGNALLED_CHILD
from .conftest import RINGTUNE, ROOT, cluster, emulate, emulate_cmd, last_json

pytest.importorskip("torch")

WORKER = "tests/emulated/torch_worker.py"
TORCHRUN = ("--launcher", "torchrun")


def _ok(res: subprocess.CompletedProcess[str], what: str) -> dict:
    assert res.returncode == 0, f"{what}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    out = last_json(res.stdout)
    assert out["fails"] == [], "\n".join(out["fails"])
    return out


def test_contract_across_two_hosts() -> None:
    out = _ok(emulate("2x2", [WORKER, "contract"], *TORCHRUN, timeout=240), "contract")
    assert out["hosts"] == ["emu0", "emu0", "emu1", "emu1"]  # block placement, 2 hosts
    assert out["engine"] == "torch"
    assert {"hierarchical", "multiring", "native", "rhd"} <= set(out["algorithms"])
    assert out["dims"] == [2, 2]  # hierarchical's default grid: ranks per host x hosts


def _hierarchical_profile(path: Path) -> Path:
    """A profile for the torch engine on 2 x 2 that runs the tier-aware grid at every size
    (so that DDP's buckets go through ringtune's own algorithm, not gloo's allreduce)."""
    data = {"format": "ringtune-profile", "version": 1,
            "engine": {"name": "torch", "backend": "gloo"},
            "topology": {"world_size": 4, "hosts": 2, "ranks_per_host": 2,
                         "summary": "2 hosts x 2 ranks, cpu"},
            "backend": "numpy", "transport": "torch", "dtype": "float32", "op": "sum",
            "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "hierarchical",
                       "params": {"dims": [2, 2]}}]}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_ddp_over_the_ringtune_backend_tracks_gloo(tmp_path: Path) -> None:
    env = dict(os.environ, RINGTUNE_PROFILE=str(_hierarchical_profile(tmp_path / "h.yaml")))
    out = _ok(emulate("2x2", [WORKER, "ddp", "12"], *TORCHRUN, timeout=240, env=env), "ddp")
    assert out["backend"] == "ringtune" and out["steps"] == 12
    assert out["hosts"] == ["emu0", "emu0", "emu1", "emu1"]
    assert out["algorithms"] == ["hierarchical"]


def _slow_2x2(path: Path, mbits: int) -> str:
    """emulated-2x2 with ``mbits`` Mbit/s host uplinks."""
    data = yaml.safe_load(Path(cluster("2x2")).read_text())
    data["name"] = f"emulated-2x2-{mbits}m"
    data["levels"][1]["bandwidth_gbs"] = mbits / 8000
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_online_tuning_settles_on_the_tier_aware_grid(tmp_path: Path) -> None:
    """A 2 MiB message over 200 Mbit/s uplinks: the uplinks take most of a call's time, and
    the tier-aware grid sends a third less over them than any flat ring (gloo's own
    allreduce included: its ring crosses each uplink with 3/2 of the message, the grid with
    one), a margin that a loaded machine's noise does not close."""
    count = 1 << 19
    slow = _slow_2x2(tmp_path / "slow.yaml", 200)
    out = _ok(emulate(slow, [WORKER, "online", str(count)], *TORCHRUN, timeout=240), "online")
    choice = out["settled"][str(count)]
    # ``shm`` on hosts of equal ranks is that grid too, with shared memory inside the hosts
    # (dims [ranks per host, hosts] = [2, 2], inner [shm, multiring]): the torch defaults'
    # choice on this layout, so online tuning may keep it.
    assert choice["algorithm"] in ("hierarchical", "shm"), choice
    if choice["algorithm"] == "hierarchical":
        assert choice["params"]["dims"] == [2, 2], choice


def test_a_killed_rank_ends_the_job_naming_it(tmp_path: Path) -> None:
    """Rank 1 (on emu0) SIGKILLs itself between two allreduces: the job ends, its status is
    not 0, and emulate's line names the host, its ranks and rank 1."""
    env = dict(os.environ, RINGTUNE_STALL_TIMEOUT="5")
    t0 = time.monotonic()
    res = emulate("2x2", ["tests/torchrun/killed_worker.py", "multiring"], *TORCHRUN,
                  timeout=180, env=env)
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "went unnoticed" not in out, out[-3000:]
    assert "first allreduce done" in out, out[-3000:]  # it was killed mid-job, not at start
    assert ("host emu0 (10." in res.stderr and "ranks 0, 1): a rank there ended first "
            "(rank 1)" in res.stderr), res.stderr[-3000:]
    assert took < 150, f"the job took {took:.0f} s to end"


def _bad(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RINGTUNE, "emulate", "--cluster", cluster("2x2"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


def test_round_robin_is_refused_with_torchrun() -> None:
    res = _bad(*TORCHRUN, "--placement", "round-robin", "--", WORKER, "contract")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--placement round-robin" in lines[0] \
        and "--placement block" in lines[0], res.stderr


def test_a_missing_script_or_command_is_one_line() -> None:
    for cmd in (["tests/emulated/no_such_worker.py"], ["no-such-program-here"]):
        res = _bad(*TORCHRUN, "--", *cmd)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and cmd[0] in lines[0], res.stderr


def test_torchrun_missing_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    """An interpreter with no torchrun beside it and none on PATH (a venv of its own)."""
    venv = tmp_path / "venv"
    os.makedirs(venv / "bin")
    os.symlink(sys.executable, venv / "bin" / "python")
    env = dict(os.environ, PATH=f"{venv / 'bin'}:/usr/bin:/bin",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    res = subprocess.run([str(venv / "bin" / "python"), "-m", "ringtune.cli", "emulate",
                          "--cluster", cluster("2x2"), *TORCHRUN, "--", WORKER, "contract"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "torchrun" in lines[0] and "ringtune[torch]" in lines[0], res.stderr


def test_a_failed_rank_fails_the_job_and_a_clean_one_passes() -> None:
    """Rank 3 (emu1) exits 5: the job's status is not 0 (torchrun's agent reports a failed
    worker as 1) and the line names emu1; every rank exiting 0 is a status of 0."""
    res = emulate("2x2", ["sh", "-c", "exit $((RANK == 3 ? 5 : 0))"], *TORCHRUN, timeout=120)
    assert res.returncode != 0, res.stderr[-2000:]
    assert "host emu1 (10." in res.stderr and "ranks 2, 3)" in res.stderr, res.stderr[-2000:]
    res = emulate("2x2", ["sh", "-c", "test \"$WORLD_SIZE\" = 4"], *TORCHRUN, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_sigterm_tears_the_agents_and_namespaces_down(tmp_path: Path) -> None:
    """SIGTERM to emulate mid-job: status 143, within seconds, no rank left running (the
    autouse fixture checks the namespaces)."""
    # Written then renamed: a file seen is a complete one. ($$$$: torchrun's agent reads
    # its arguments as string.Template, where $$ is one $.)
    script = f"echo $$$$ > {tmp_path}/t.$RANK && mv {tmp_path}/t.$RANK {tmp_path}/pid.$RANK " \
             "&& exec sleep 120"
    proc = subprocess.Popen(emulate_cmd("2x2", ["sh", "-c", script], *TORCHRUN), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **SIGNALLED_CHILD)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(tmp_path.glob("pid.*"))) < 4:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        pids = [int(f.read_text()) for f in tmp_path.glob("pid.*")]
        assert len(pids) == 4, "the ranks did not start"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # emulate tears down on SIGTERM
            proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - t0 < 15, "teardown took more than 15 s"
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")
                and open(f"/proc/{p}/stat").read().split()[2] != "Z"], "ranks survived"
