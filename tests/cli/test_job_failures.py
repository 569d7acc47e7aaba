"""A user job (``mpiexec -n 2 python job.py``, the plain form, no ``-m mpi4py``) in which one
rank fails must end, never hang: a failure inside ``Communicator.allreduce`` ends every
rank with a line naming the failing rank (``collectives.plumbing.abort``), or reaches the
caller with ``RINGTUNE_ON_ERROR=raise``; a rank that dies outright ends the job through the
launcher. Each job runs under a timeout: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
ROOT = Path(__file__).resolve().parents[2]

JOB = r'''
import os, signal, sys
import numpy as np
from mpi4py import MPI
from collectives import Communicator

mode, algo = sys.argv[1], sys.argv[2]
comm = Communicator(MPI.COMM_WORLD)
kw = {} if algo == "auto" else {"algorithm": algo}
if algo == "hierarchical":
    kw.update(dims=[comm.size], inner=["rhd"])
buf = np.ones(1000, np.float32)
comm.allreduce(buf, **kw)                      # a good call first: plans are cached
if comm.rank == 1 and mode == "exit":
    os._exit(3)
if comm.rank == 1 and mode == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if comm.rank == 1 and mode == "outside":
    open(os.path.join(os.path.dirname(__file__), "raised.1"), "w").close()
    raise RuntimeError("failed outside ringtune")
if mode in ("size", "raise"):
    buf = np.ones(1000 + 77 * comm.rank, np.float32)   # ranks disagree on the size
try:
    comm.allreduce(buf, **kw)
except Exception as exc:
    # Recorded in a file, not only on stderr: Hydra may end the job on MPI_Abort before it
    # forwards what a rank wrote just before (seen on CI: an empty stderr, status 7).
    with open(os.path.join(os.path.dirname(__file__), f"caught.{comm.rank}"), "w") as f:
        f.write(type(exc).__name__)
    print(f"caller caught on rank {comm.rank}: {type(exc).__name__}", file=sys.stderr,
          flush=True)
    MPI.COMM_WORLD.Abort(7)
print(f"rank {comm.rank} finished", flush=True)
'''


def _job(tmp_path: Path, mode: str, algo: str, *, mpi4py: bool = False, np: int = 2,
         **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "RINGTUNE_"))}
    clean.update(env, PYTHONPATH=str(ROOT))
    python = [sys.executable, "-m", "mpi4py"] if mpi4py else [sys.executable]
    try:
        return subprocess.run([MPIEXEC, "-n", str(np), *python, str(script), mode, algo],
                              env=clean, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the job hung ({mode}, {algo}): {exc.stderr!r}") from None


@pytest.mark.parametrize("np", [2, 3])
@pytest.mark.parametrize("algo", ["multiring", "rhd", "hierarchical"])
def test_size_mismatch_ends_every_rank_naming_the_rank(tmp_path: Path, algo: str,
                                                       np: int) -> None:
    res = _job(tmp_path, "size", algo, np=np)
    assert res.returncode != 0, res.stdout
    lines = [ln for ln in res.stderr.splitlines()
             if re.match(r"ringtune: rank \d: allreduce of \d+ B with ", ln)]
    assert lines, res.stderr
    assert algo in lines[0] and "ending every rank" in lines[0], lines[0]
    assert "finished" not in res.stdout


def test_size_mismatch_in_native_ends_the_job(tmp_path: Path) -> None:
    """MPI_Allreduce itself: the job ends and no rank goes on. Which rank sees the error
    first is a race: a rank whose call returns the error to Python names itself and ends
    the job through ringtune's abort (exit status 1, its line written past the launcher
    first); a rank whose MPICH meets it inside its progress engine aborts there, before any
    Python runs, with MPICH's error code as the exit status (seen: 142) and a report that
    Hydra may drop (an empty stderr). So ringtune's line is asserted where ringtune ended
    the job, and the ending itself always."""
    res = _job(tmp_path, "size", "native")
    assert res.returncode != 0 and "finished" not in res.stdout, (res.returncode, res.stdout)
    named = re.search(r"^ringtune: rank \d: allreduce of \d+ B with native failed: .*"
                      "ending every rank", res.stderr, re.M)
    if res.returncode == 1:  # ringtune's abort_world(code=1) ended the job
        assert named, res.stderr


def test_on_error_raise_hands_the_failure_to_the_caller(tmp_path: Path) -> None:
    res = _job(tmp_path, "raise", "multiring", RINGTUNE_ON_ERROR="raise")
    assert res.returncode == 7, (res.returncode, res.stderr)   # the caller's own Abort(7)
    caught = {p.name: p.read_text() for p in tmp_path.glob("caught.*")}
    assert caught and set(caught.values()) == {"Exception"}, (caught, res.stderr)
    assert "ringtune: rank" not in res.stderr


@pytest.mark.parametrize("mode, code", [("exit", 3), ("kill", None)])
def test_a_rank_that_dies_ends_the_job(tmp_path: Path, mode: str, code: int | None) -> None:
    """``os._exit`` or SIGKILL on rank 1 while rank 0 waits inside allreduce: Hydra ends
    the job (with the rank's exit status). Hydra's own report names a rank it killed
    afterwards, so for ``os._exit`` ringtune writes the line naming rank 1 first
    (``collectives.plumbing.abort.name_abrupt_exits``); a SIGKILL leaves nothing to run in it."""
    res = _job(tmp_path, mode, "multiring")
    assert res.returncode != 0 and "finished" not in res.stdout
    if code is not None:
        assert res.returncode == code
        assert "ringtune: rank 1: os._exit(3) ends this rank" in res.stderr, res.stderr


@pytest.mark.parametrize("mpi4py", [False, True])
def test_os_exit_on_one_of_three_ranks_is_named(tmp_path: Path, mpi4py: bool) -> None:
    """The issue's case: ``mpiexec -n 3 python -m mpi4py job.py`` (and plain ``python``),
    rank 1 calls ``os._exit(3)`` between allreduces: the job ends (Hydra kills the other
    ranks within the test's timeout) and exactly one line names rank 1."""
    res = _job(tmp_path, "exit", "multiring", mpi4py=mpi4py, np=3)
    assert res.returncode != 0 and "finished" not in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune: rank")]
    assert lines == ["ringtune: rank 1: os._exit(3) ends this rank without MPI_Finalize "
                     "(nothing else runs, not even atexit); the launcher ends the other "
                     "ranks"], res.stderr


def test_os_exit_elsewhere_stays_silent(tmp_path: Path) -> None:
    """Only the rank's own process is named: ``os._exit`` in a forked child (a data-loader
    worker's normal end) and in a one-rank world print nothing."""
    script = tmp_path / "fork.py"
    script.write_text(
        "import os\n"
        "from mpi4py import MPI\n"
        "from collectives import Communicator\n"
        "comm = Communicator(MPI.COMM_WORLD)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print('rank', comm.rank, 'finished', flush=True)\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "RINGTUNE_"))}
    clean.update(PYTHONPATH=str(ROOT))
    for np in ("1", "2"):
        res = subprocess.run([MPIEXEC, "-n", np, sys.executable, str(script)], env=clean,
                             capture_output=True, text=True, timeout=90)
        assert res.returncode == 0, res.stderr
        assert "os._exit" not in res.stderr and res.stdout.count("finished") == int(np)


def test_an_uncaught_exception_outside_ringtune_ends_the_job_under_m_mpi4py(
        tmp_path: Path) -> None:
    """The README's launch form for jobs: ``python -m mpi4py`` turns an uncaught exception
    on one rank into an abort of all (plain ``python`` would leave rank 0 waiting): the job
    ends within the timeout, after rank 1 raised (its marker file). mpi4py prints the
    traceback on the rank's stderr just before MPI_Abort, where Hydra may drop it, so the
    text is not asserted."""
    res = _job(tmp_path, "outside", "multiring", mpi4py=True)
    assert res.returncode != 0 and "finished" not in res.stdout
    assert (tmp_path / "raised.1").exists(), res.stderr


def test_on_error_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.plumbing.abort import on_error_mode

    monkeypatch.delenv("RINGTUNE_ON_ERROR", raising=False)
    assert on_error_mode() == "abort"
    monkeypatch.setenv("RINGTUNE_ON_ERROR", " Raise ")
    assert on_error_mode() == "raise"
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "ignore")
    with pytest.warns(RuntimeWarning, match="RINGTUNE_ON_ERROR='ignore': use one of abort, raise"):
        assert on_error_mode() == "abort"
