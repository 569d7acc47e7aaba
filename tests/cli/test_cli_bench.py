"""Launcher tests: the CLI runs `ringtune bench` under mpiexec through subprocess and checks
exit codes and output, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _run(args: list[str], timeout: int = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA"))}
    return subprocess.run(RINGTUNE + args, capture_output=True, text=True, timeout=timeout,
                          env=env)


def _mpiexec() -> str:
    exe = VENV_BIN / "mpiexec"
    if not exe.exists():
        pytest.skip("mpiexec from the mpich wheel is not installed next to this Python")
    return str(exe)


def test_bench_check_under_mpiexec() -> None:
    mpiexec = _mpiexec()
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "ringtune.cli", "bench",
           "-b", "1K", "-e", "256K", "-f", "4", "-w", "1", "-n", "3", "-c", "1",
           "--algo", "multiring", "--param", "rings=2", "--param", "chunk_bytes=4K"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "#wrong" in out and "busbw(GB/s)" in out and "# Avg bus bandwidth" in out
    rows = [ln.split() for ln in out.splitlines() if ln and not ln.startswith("#")]
    assert [int(r[0]) for r in rows] == [1024, 4096, 16384, 65536, 262144]
    assert all(r[-1] == "0" for r in rows)  # #wrong
    assert all(r[4].startswith("multiring") for r in rows)
    # Only rank 0 prints: one header.
    assert out.count("# ringtune bench:") == 1


def test_bench_self_launch_and_json(tmp_path: Path) -> None:
    _mpiexec()
    target = tmp_path / "rows.json"
    proc = _run(["bench", "-np", "2", "-b", "8", "-e", "64", "-f", "8", "-n", "2", "-w", "0",
                 "--algo", "rhd", "--json", str(target)])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(target.read_text())
    assert data["ranks"] == 2
    assert [r["size"] for r in data["rows"]] == [8, 64]
    assert all(r["wrong"] == 0 and r["algo"] == "rhd" for r in data["rows"])


def test_params_are_checked_against_the_launched_world_size() -> None:
    """dims must multiply to the number of ranks launched (-np), not some stand-in."""
    _mpiexec()
    ok = _run(["bench", "-np", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0",
               "--algo", "hierarchical", "--param", "dims=[2]"])
    assert ok.returncode == 0, ok.stderr
    assert "hierarchical" in ok.stdout
    bad = _run(["bench", "-np", "2", "-b", "1K", "-e", "1K", "--algo", "hierarchical",
                "--param", "dims=[3]"], timeout=60)
    lines = bad.stderr.strip().splitlines()
    assert bad.returncode == 2 and len(lines) == 1 and "dims" in lines[0], bad.stderr


@pytest.mark.parametrize("args,word", [
    (["bench", "--algo", "tree"], "unknown algorithm 'tree'"),
    (["bench", "--algo", "multiring", "--param", "rings=0"], "rings"),
    (["bench", "--param", "rings=2"], "--algo"),
    (["bench", "-b", "lots"], "lots"),
    (["bench", "-d", "complex64"], "complex64"),
    (["bench", "--bogus"], "--bogus"),
    (["nosuchverb"], "nosuchverb"),
])
def test_bad_flags_exit_2_one_line(args: list[str], word: str) -> None:
    proc = _run(args, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and word in lines[0], proc.stderr


def test_bench_says_which_timing_its_figures_use(tmp_path: Path) -> None:
    mpiexec = _mpiexec()
    target = tmp_path / "rows.json"
    cmd = [mpiexec, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "ringtune.cli", "bench",
           "-b", "1K", "-e", "4K", "-f", "4", "-w", "1", "-n", "3", "--algo", "native",
           "--timing", "back-to-back", "--json", str(target)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert "# time: back-to-back, iterations run back to back" in proc.stdout
    assert json.loads(target.read_text())["timing"] == "back-to-back"
    proc = _run(["bench", "-np", "1", "-b", "8", "-e", "8", "--timing", "mean"])
    assert proc.returncode == 2 and "--timing" in proc.stderr
    proc = _run(["bench", "-np", "1", "-b", "8", "-e", "8", "-n", "1", "-w", "0"])
    assert proc.returncode == 0, proc.stderr
    assert "# time: per-iter, median over iterations of the slowest rank" in proc.stdout
