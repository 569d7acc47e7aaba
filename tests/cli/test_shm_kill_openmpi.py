"""The shared-memory allreduce under Open MPI: a rank SIGKILLed in the middle of an
allreduce ends the job, the survivors name it, and nothing of ringtune's is left in
/dev/shm (``test_shm_kill.py`` is the same under MPICH, ``tests/torchrun/test_killed_rank.py``
under torchrun).

The job runs under Open MPI's ``mpiexec`` from the Open MPI environment: this Python's
where its mpi4py loads Open MPI (``make ompi-test``), else ``$RINGTUNE_OMPI_PYTHON`` or
``.venv-ompi`` (``make test``'s CLI suite); it skips only where there is none.

Each rank names the files of /dev/shm it maps (``shm_killed_job.py``), so the test knows
this job's segments even while other jobs come and go there. ringtune's segment is unlinked
as soon as every rank has mapped it: none may be left, whatever killed whom. Open MPI's own
btl/sm backing files (``sm_segment.HOST.UID.JOB.RANK``) are its own business: its launcher
removes them when the job ends, a killed rank's included, in the runs seen with 5.0.x; should
a version leave some, the test says so (a warning naming them: Open MPI's leak, not
ringtune's) and removes them, as ``tests/shm_leftovers.py`` does after ``make test``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ringtune.launch import family

from .test_shm_kill import STALL_S, check_named, job_report, left_by_the_job, segments

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("shm_killed_job.py")
SHM = Path("/dev/shm")


def _is_open_mpi(python: str) -> bool:
    code = ("import mpi4py; mpi4py.rc.initialize = mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI; print(MPI.Get_library_version())")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and family(out.stdout) == "openmpi"


def open_mpi_python() -> str | None:
    """A Python whose mpi4py loads Open MPI, with Open MPI's ``mpiexec`` beside it."""
    for python in (sys.executable, os.environ.get("RINGTUNE_OMPI_PYTHON"),
                   str(ROOT / ".venv-ompi" / "bin" / "python")):
        if (python and os.path.exists(python)
                and os.path.exists(os.path.join(os.path.dirname(python), "mpiexec"))
                and _is_open_mpi(python)):
            return python
    return None


PYTHON = open_mpi_python()

pytestmark = [
    pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm"),
    pytest.mark.skipif(PYTHON is None, reason=(
        "no Open MPI environment: neither this Python's mpi4py, $RINGTUNE_OMPI_PYTHON nor "
        ".venv-ompi loads Open MPI (make .venv-ompi/.installed)")),
]


def test_a_killed_rank_ends_the_job_naming_it_and_nothing_is_left_in_dev_shm() -> None:
    assert PYTHON is not None
    before = segments()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_", "RINGTUNE_"))}
    # Open MPI's launcher refuses root unless told twice (a container's root).
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=str(ROOT), RINGTUNE_STALL_TIMEOUT=str(STALL_S),
               OMP_NUM_THREADS="1")
    mpiexec = os.path.join(os.path.dirname(PYTHON), "mpiexec")
    proc = subprocess.run([mpiexec, "--oversubscribe", "-n", "3", PYTHON, str(JOB)],
                          env=env, capture_output=True, text=True, timeout=180, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "went unnoticed" not in out, out[-3000:]
    assert out.count("first allreduce done") == 3, out[-3000:]  # the segment was in use

    # Every file of /dev/shm the job mapped, as its ranks named them.
    mapped = job_report(out)[1]
    ours = {m for m in mapped if m.startswith("ringtune-")}
    assert ours, out[-3000:]  # the job's own segment, unlinked once mapped
    left = {m for m in mapped if (SHM / m).exists()}
    theirs = sorted(m for m in left if m.startswith("sm_segment."))
    if theirs:
        warnings.warn(f"Open MPI left its own btl/sm segments of the killed job in {SHM} "
                      f"(the library's, not ringtune's; removed): {', '.join(theirs)}",
                      stacklevel=1)
        for name in theirs:
            (SHM / name).unlink(missing_ok=True)
    assert not left - set(theirs), f"left in /dev/shm: {sorted(left - set(theirs))}"
    assert not left_by_the_job(out, before), f"left in /dev/shm: {left_by_the_job(out, before)}"

    # The survivors name the dead rank, as the cause (not the call's arguments). prterun
    # ends them too once it sees rank 1 gone, but later than they notice it.
    assert any(ln.startswith("ringtune: rank ") and " failed: " in ln
               for ln in out.splitlines()), out[-3000:]
    check_named(out)
