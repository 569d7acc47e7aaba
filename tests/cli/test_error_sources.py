"""An error about a value that came from the environment names the variable, and a launcher
that is missing or cannot start says where ringtune looked and what installs one: one line,
exit status 1 or 2, no traceback. (A stop made by a signal, without the launcher's banner:
``tests/cli/test_signals.py``.)"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ringtune import launch
from ringtune.errors import CommandFailed

ROOT = Path(__file__).resolve().parents[2]
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]
BENCH = ["bench", "-np", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0"]
TUNE = ["tune", "-np", "2", "--buckets", "1K", "--trials", "1", "--no-progress"]


def _run(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_", "RINGTUNE_"))}
    return subprocess.run([*RINGTUNE, *args], env={**clean, **env}, cwd=tmp,
                          capture_output=True, text=True, timeout=120)


def _one_line(res: subprocess.CompletedProcess[str], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("ringtune: error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize("verb", [BENCH, TUNE], ids=["bench", "tune"])
def test_a_missing_profile_names_ringtune_profile(tmp_path: Path, verb: list[str]) -> None:
    missing = str(tmp_path / "nonexistent.yaml")
    line = _one_line(_run(verb, tmp_path, RINGTUNE_PROFILE=missing), 2)
    assert "RINGTUNE_PROFILE" in line and missing in line, line
    assert list(tmp_path.iterdir()) == [], "nothing may be written before the refusal"


def test_a_missing_launcher_names_ringtune_mpiexec(tmp_path: Path) -> None:
    line = _one_line(_run(TUNE, tmp_path, RINGTUNE_MPIEXEC="/nonexistent/mpiexec"), 2)
    assert "RINGTUNE_MPIEXEC" in line and "/nonexistent/mpiexec" in line, line


def test_a_launcher_that_cannot_start_names_where_it_came_from(tmp_path: Path) -> None:
    """An executable file that the kernel cannot run (its interpreter is missing): not the
    bare ``[Errno 2] No such file or directory`` of ``exec``."""
    broken = tmp_path / "mpiexec"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(broken.stat().st_mode | stat.S_IXUSR)
    line = _one_line(_run(BENCH, tmp_path, RINGTUNE_MPIEXEC=str(broken)), 1)
    assert f"cannot start the launcher {broken} (from RINGTUNE_MPIEXEC)" in line, line
    assert "ringtune[mpich]" in line, line


def test_no_launcher_anywhere_names_the_variable_the_path_and_the_extra(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RINGTUNE_MPIEXEC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(launch.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(CommandFailed) as info:
        launch.find_mpiexec()
    msg = str(info.value)
    for part in ("RINGTUNE_MPIEXEC", "PATH", "pip install 'ringtune[mpich]'",
                 str(tmp_path / "python")):
        assert part in msg, msg
    assert "\n" not in msg
