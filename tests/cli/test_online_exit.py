"""Online tuning's profile at the end of a job, as a launched job ends (``mpiexec -n 2``
through ``subprocess``): a job that exits without closing its communicator writes it at
interpreter exit (valid, loadable); a job killed while exploring leaves no file at all,
not even a temporary one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from collectives.profile import load_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")

JOB = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from mpi4py import MPI
    from collectives import Communicator

    mode, out = sys.argv[1], sys.argv[2]
    c = Communicator(MPI.COMM_WORLD, tune="online", tune_out=out,
                     tune_options={"samples": 2, "candidates": 4, "share": 1})
    for step in range(12):
        x = np.full(1000, c.rank + 1, dtype=np.float32)
        c.allreduce(x)
        assert (x == sum(range(1, c.size + 1))).all()
        if mode == "kill" and step == 3 and c.rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-exploration
    # "exit": no close(): the profile is written at interpreter exit
""")


def _launch(tmp_path: Any, mode: str) -> tuple[subprocess.CompletedProcess[str], str]:
    if not os.path.exists(MPIEXEC):
        pytest.skip(f"no mpiexec beside {sys.executable}")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    out = str(tmp_path / "tuned.yaml")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDRA_", "RINGTUNE_"))}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi4py", str(script),
                          mode, out], capture_output=True, text=True, timeout=240, env=env)
    return run, out


def test_a_job_that_exits_writes_its_profile_at_exit(tmp_path: Any) -> None:
    run, out = _launch(tmp_path, "exit")
    assert run.returncode == 0, run.stderr
    prof = load_profile(out, world_size=2)
    assert prof.tuning["mode"] == "online" and prof.tuning["online_settled"] == [4000]
    assert not os.path.exists(out + ".lock")  # released at exit


def test_a_job_killed_while_exploring_leaves_no_file(tmp_path: Any) -> None:
    run, out = _launch(tmp_path, "kill")
    assert run.returncode != 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "job.py")
    # The lock file of the killed holder may stay (its flock died with it); nothing else.
    assert left in ([], ["tuned.yaml.lock"]), left
