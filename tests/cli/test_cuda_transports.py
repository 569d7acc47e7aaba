"""The GPU transports at 3 MPI ranks: ``tests/unit/test_cuda_transports.py`` run as a
script under ``mpiexec -n 3`` (``python -m mpi4py``; its ``main``): set-up errors agreed over
MPI and ``Communicator`` on simulated GPU buffers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "unit" / "test_cuda_transports.py"


def test_multirank_under_mpiexec() -> None:
    """The GPU transports' set-up errors and ``Communicator`` on GPU buffers at 3 MPI
    ranks; see ``main`` there."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        pytest.skip("no mpiexec next to the interpreter")
    out = subprocess.run([mpiexec, "-n", "3", sys.executable, "-m", "mpi4py", str(SCRIPT)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "multi-rank GPU transport checks passed" in out.stdout, out.stdout[-2000:]
