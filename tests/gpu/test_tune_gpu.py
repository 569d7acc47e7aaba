"""``ringtune tune --backend cupy`` end to end on a GPU: a tiny tuning run over GPU buffers
writes a profile with ``backend: cupy`` and transports from those every rank can use.

Runs in a world of one process only (it launches its own ranks with ``-np``; starting
mpiexec from inside an mpiexec world is not portable); skipped without a GPU by conftest.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _world_size() -> int:
    from mpi4py import MPI

    return int(MPI.COMM_WORLD.Get_size())


def test_tune_backend_cupy_end_to_end(tmp_path: Any) -> None:
    if _world_size() > 1:
        pytest.skip("launches its own ranks: run in a world of one process")
    from collectives.cuda import available_transports
    from collectives.profile import load_profile

    local = available_transports()
    assert local, "a GPU is present, so at least 'staged' must be available"
    out = tmp_path / "gpu.yaml"
    env = {k: v for k, v in os.environ.items() if k != "RINGTUNE_LAUNCHED"
           and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    # Two ranks share the one GPU of a single-GPU machine: nccl is left out, staged stays.
    proc = subprocess.run(
        [sys.executable, "-m", "ringtune.cli", "tune", "--backend", "cupy", "-np", "2",
         "--out", str(out), "--buckets", "64K,1M", "--trials", "3", "--budget", "30",
         "--trial-timeout", "60", "--no-progress", "--fresh"],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    prof = load_profile(str(out), world_size=2)
    assert prof.backend == "cupy"
    assert prof.transport in local
    for rule in prof.rules:
        assert rule.transport in (None, *local)
    assert prof.tuning["transports"] and set(prof.tuning["transports"]) <= set(local)
    assert "-cupy." in prof.tuning["study"]
