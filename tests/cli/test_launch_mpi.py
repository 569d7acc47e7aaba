"""Which MPI a launcher or a library is, and what ringtune's self-launch passes to each
(``ringtune.launch``, ``collectives.mpi.mpilib``): pure functions, no MPI started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from collectives.mpi import mpilib
from ringtune import launch
from ringtune.errors import UsageError

HYDRA = "HYDRA build details:\n    Version:                                 5.0.2\n"
PRTERUN = "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/"
IMPI = "Intel(R) MPI Library for Linux* OS, Version 2021.14 Build 20241121 (id: e7829d6)"


@pytest.mark.parametrize("text,family", [
    (HYDRA, "mpich"), (PRTERUN, "openmpi"), (IMPI, "impi"),
    ("MPICH Version:      5.0.2\nMPICH Release date: ...", "mpich"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution", "openmpi"),
    ("Intel(R) MPI Library 2021.14 for Linux* OS", "impi"),
    ("slurm 23.02.7", ""), ("", "")])
def test_family_from_version_text(text: str, family: str) -> None:
    assert mpilib.family(text) == family


def test_which_launchers_fit_which_libraries() -> None:
    assert mpilib.launcher_fits("openmpi", "openmpi")
    assert mpilib.launcher_fits("mpich", "mpich") and mpilib.launcher_fits("mpich", "impi")
    assert not mpilib.launcher_fits("mpich", "openmpi")
    assert not mpilib.launcher_fits("openmpi", "mpich")
    assert mpilib.launcher_fits("", "openmpi") and mpilib.launcher_fits("openmpi", "")


def test_a_launcher_of_another_library_is_one_line_naming_the_fix() -> None:
    with pytest.raises(UsageError) as info:
        launch.check_launcher("/x/bin/mpiexec", "mpich", "openmpi")
    msg = str(info.value)
    assert "/x/bin/mpiexec is MPICH's launcher but mpi4py loads Open MPI" in msg
    assert "RINGTUNE_MPIEXEC" in msg and "ringtune[openmpi]" in msg and "\n" not in msg
    launch.check_launcher("/x/bin/mpiexec", "openmpi", "openmpi")  # fits: nothing raised


def test_open_mpi_gets_oversubscribe_above_the_cores_and_the_root_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "usable_cores", lambda: 2)
    monkeypatch.setattr(launch.os, "geteuid", lambda: 0)
    cmd, env = launch.launch_command("mpiexec", 2, False, "openmpi")
    assert cmd == ["mpiexec", "-n", "2"]
    assert env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert launch.launch_command("mpiexec", 3, False, "openmpi")[0][-1] == "--oversubscribe"
    assert launch.launch_command("mpiexec", 2, True, "openmpi")[0][-1] == "--oversubscribe"
    monkeypatch.setattr(launch.os, "geteuid", lambda: 1000)
    assert launch.launch_command("mpiexec", 2, False, "openmpi")[1] == {}
    # Hydra takes neither: no Hydra flag is invented, and no Open MPI flag is passed to it.
    assert launch.launch_command("mpiexec", 8, True, "mpich") == (["mpiexec", "-n", "8"], {})


def test_no_mpi_library_is_one_line_naming_the_extras() -> None:
    code = ("import os; os.environ['MPI4PY_LIBMPI'] = '/nonexistent/libmpi.so'\n"
            "from collectives.mpi.mpilib import load_mpi, NoMpiError\n"
            "try:\n    load_mpi()\nexcept NoMpiError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    line = out.stdout.strip()
    assert line.startswith("mpi4py found no MPI library"), (out.stdout, out.stderr)
    assert "ringtune[mpich]" in line and "ringtune[openmpi]" in line
    assert "\n" not in line


def test_cli_without_an_mpi_library_says_what_to_install() -> None:
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(MPI4PY_LIBMPI="/nonexistent/libmpi.so", PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-m", "ringtune.cli", "bench", "-np", "2", "-b",
                          "4K", "-e", "4K"], capture_output=True, text=True, timeout=120,
                         env=env, cwd=root)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "mpi4py found no MPI library" in lines[0], lines
    assert "ringtune[mpich]" in lines[0]


def _fake_open_mpi_launcher(tmp_path: Path) -> Path:
    """An 'mpiexec' that says it is Open MPI's; run as a launcher it would start nothing."""
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.11'\nexit 0\n")
    fake.chmod(0o755)
    return fake


def _cli(*args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    import os

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(PYTHONPATH=str(root), **env_extra)
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=root)


@pytest.mark.skipif(launch.library_family() == "openmpi", reason="needs a non-Open MPI mpi4py")
def test_self_launch_with_another_librarys_launcher_is_refused(tmp_path: Path) -> None:
    out = _cli("bench", "-np", "2", "-b", "4K", "-e", "4K",
               RINGTUNE_MPIEXEC=str(_fake_open_mpi_launcher(tmp_path)))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "is Open MPI's launcher but mpi4py loads" in lines[0], lines


def test_emulate_refuses_open_mpis_launcher_naming_what_to_install(tmp_path: Path) -> None:
    out = _cli("emulate", "--cluster", "profiles/clusters/emulated-2x2.yaml", "--", "true",
               RINGTUNE_MPIEXEC=str(_fake_open_mpi_launcher(tmp_path)))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "is Open MPI's launcher" in lines[0] and "ringtune[mpich]" in lines[0]
    assert "-hosts" not in lines[0]  # nothing of Hydra's was passed to it
