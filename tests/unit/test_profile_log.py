"""``RINGTUNE_LOG=info`` with ``RINGTUNE_PROFILE``: a job's stderr says, per message size,
which rule and algorithm it got and the busbw measured for it (a one-rank MPI job started
as a subprocess, so the environment is read at import as in a real job)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from collectives.profile import write_profile

from .test_profile import base

SCRIPT = """
import numpy as np
from mpi4py import MPI
from collectives import Communicator
comm = Communicator(MPI.COMM_WORLD)
for n in (256, 1 << 16):
    comm.allreduce(np.ones(n, dtype="float32"))
comm.allreduce(np.ones(1 << 16, dtype="float32"))  # same plan: not logged again
print(comm.explain(1024))
"""


def test_log_info_names_rule_algorithm_and_busbw(tmp_path: Any) -> None:
    prof = base()
    prof["topology"] = {"world_size": 1}
    prof["rules"][1]["params"]["order"] = "identity"
    path = str(tmp_path / "p.yaml")
    write_profile(prof, path)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env.update(RINGTUNE_LOG="info", RINGTUNE_PROFILE=path)
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("ringtune:")]
    assert len(lines) == 2, res.stderr
    assert "1024 B" in lines[0] and "native" in lines[0] and "rule 0" in lines[0]
    assert "measured busbw 1.21 GB/s" in lines[0]
    assert "262144 B" in lines[1] and "multiring" in lines[1] and "rule 1" in lines[1]
    assert "measured busbw 7.8 GB/s" in lines[1] and "1.90x native" in lines[1]
    assert path in res.stdout and "rule 0 [0..65535]" in res.stdout
