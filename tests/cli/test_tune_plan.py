"""A bare ``ringtune tune`` says what it will do before it starts anything: how many ranks,
which sizes, the budget, the two files it writes (by their full paths), and how to stop and
resume it. The launcher here is a stand-in (``RINGTUNE_MPIEXEC``) that only records that it
was started, so the test sees the order, and no tune runs."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _fake_launcher(tmp: Path) -> Path:
    path = tmp / "bin" / "mpiexec"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\necho \"LAUNCHER STARTED: $*\"\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _bare_tune(tmp: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_", "RINGTUNE_"))}
    env["RINGTUNE_MPIEXEC"] = str(_fake_launcher(tmp))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    work = tmp / "work"
    work.mkdir()
    return subprocess.run([*RINGTUNE, "tune", *extra], env=env, cwd=work,
                          capture_output=True, text=True, timeout=120)


def test_a_bare_tune_says_what_it_will_do_and_how_to_stop_it_first(tmp_path: Path) -> None:
    res = _bare_tune(tmp_path)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    started = [i for i, line in enumerate(lines) if line.startswith("LAUNCHER STARTED")]
    assert started, res.stdout
    plan = "\n".join(lines[:started[0]])
    work = tmp_path / "work"
    assert plan.startswith("ringtune tune: "), plan
    assert " ranks over mpi, " in plan and "1 KiB .. 64 MiB" in plan, plan
    assert "budget 200 s" in plan and "up to 30 trials each" in plan, plan
    assert f"the profile {work / 'ringtune-profile.yaml'}" in plan, plan
    assert str(work / "ringtune-profile.db") in plan, plan
    # The process to signal is the `ringtune` one (it forwards to mpiexec and the ranks).
    assert "Ctrl-C" in plan and re.search(r"`kill \d+` \(SIGTERM\)", plan), plan
    assert "the same command resumes" in plan, plan
    assert "--fresh" in plan, plan
    assert list(work.iterdir()) == [], "nothing may be written before the ranks run"


def test_the_plan_follows_the_flags(tmp_path: Path) -> None:
    res = _bare_tune(tmp_path, "-np", "3", "--buckets", "4K", "--budget", "30", "--out",
                     "p.yaml", "--storage", "sqlite:///elsewhere.db")
    assert res.returncode == 0, res.stderr
    plan = res.stdout.split("LAUNCHER STARTED")[0]
    work = tmp_path / "work"
    assert plan.startswith("ringtune tune: 3 ranks over mpi, 1 message size(s) 4 KiB "), plan
    assert "budget 30 s" in plan and str(work / "p.yaml") in plan, plan
    assert str(work / "elsewhere.db") in plan, plan
    assert "LAUNCHER STARTED: -n 3 " in res.stdout, res.stdout
