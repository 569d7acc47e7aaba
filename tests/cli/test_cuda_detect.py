"""GPU probes that need processes: ``import collectives`` stays light in a fresh
interpreter (no GPU or tuner modules), and the MPICH wheel's mpiexec sets the local-rank
variables that device binding reads. The in-process tests are in
``tests/unit/test_cuda_detect.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def test_import_collectives_loads_no_gpu_or_tuner_modules() -> None:
    code = ("import sys, collectives, collectives.cuda, collectives.transport, "
            "collectives.backend, collectives.registry\n"
            "collectives.registry.transport_names()\n"
            "heavy = [m for m in ('cupy', 'cupyx', 'pynvml', 'optuna', 'torch') "
            "if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "", f"imported: {out.stdout.strip()}"


def test_hydra_sets_the_local_rank_variables(tmp_path: Path) -> None:
    """The mpiexec of the MPICH wheel sets MPI_LOCALRANKID/MPI_LOCALNRANKS, which device
    binding reads."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        pytest.skip("no mpiexec next to the interpreter")
    # Each rank writes its own file: the launcher merges the ranks' stdout streams in
    # arbitrary pieces, so printed records can interleave mid-line.
    code = ("import os; from collectives.mpi.launcher import local_rank, local_size; "
            f"r = local_rank(); p = os.path.join({str(tmp_path)!r}, os.environ['PMI_RANK']); "
            "open(p, 'w').write(f'{r[0]} {r[1]} {local_size()}')")
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", code],
                         capture_output=True, text=True, timeout=120)
    found = sorted((tmp_path / name).read_text() for name in os.listdir(tmp_path))
    assert out.returncode == 0 and found == ["0 MPI_LOCALRANKID 2", "1 MPI_LOCALRANKID 2"], (
        out.stdout + out.stderr + repr(found))[-2000:]
