"""Under Open MPI (skips under another library; ``make ompi-test`` runs it in .venv-ompi):
where the coll/han component is not loaded (``--mca coll ^han``), ``native impl=han`` is a
``ValueError`` naming han, on every rank, and ``han`` is not among the offered algorithms.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtune.launch import library_family

pytestmark = pytest.mark.skipif(library_family() != "openmpi",
                                reason="mpi4py does not load Open MPI here")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """
import numpy as np
from collectives import Communicator
from collectives.natives import current
from mpi4py import MPI

lib = current()
assert "han" not in lib.algorithms(), lib.algorithms()
comm = Communicator(MPI.COMM_WORLD)
try:
    comm.allreduce(np.ones(8, np.float32), algorithm="native", impl="han")
except ValueError as exc:
    print("REFUSED", exc)
else:
    print("RAN")
"""


def test_han_where_the_component_is_absent_is_a_value_error() -> None:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "OMPI_", "PRTE_", "HYDRA_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_coll="^han",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    res = subprocess.run([str(mpiexec), "--oversubscribe", "-n", "2", sys.executable, "-c",
                          SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert res.returncode == 0, res.stderr[-1500:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(("REFUSED", "RAN"))]
    assert len(lines) == 2, res.stdout
    assert all(ln.startswith("REFUSED impl: 'han' needs Open MPI's coll/han") for ln in lines)
