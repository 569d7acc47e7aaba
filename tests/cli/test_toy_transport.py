"""A plug-in transport (``tests/toy_transport.py`` through ``RINGTUNE_PLUGINS``, no product
file edited) is run by the MPI runner of the transport contract
(``tests/mpi/test_transport_contract.py``, which asks the registry) under ``mpiexec`` at 2
and 3 ranks, and passes every check its class attributes allow (``tags`` is skipped: it
matches by order). The in-process checks: ``tests/unit/test_toy_transport.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ranks", [2, 3])
def test_the_mpi_runner_runs_the_plugin_transport(ranks: int) -> None:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        pytest.skip("no mpiexec next to the interpreter")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_"))}
    env.update(PYTHONPATH=str(ROOT), RINGTUNE_PLUGINS="tests.toy_transport")
    out = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m",
                          "pytest", "-q", "-p", "no:cacheprovider", "-rs", "-k",
                          "toy_transport", "tests/mpi/test_transport_contract.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    from collectives.testing.transport_contract import CHECKS

    # Rank 0 reports (tests/mpi's conftest; every rank agrees on each outcome first).
    summary = [line for line in out.stdout.splitlines() if " passed" in line]
    assert summary and summary[-1].startswith(f"{len(CHECKS) - 1} passed, 1 skipped"), \
        out.stdout
