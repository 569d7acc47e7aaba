"""What importing ``probes`` loads, in a fresh interpreter: nothing of the runtime, the
tuner, NVML or MPI, and ``import collectives`` does not load ``probes``. (Which package may
import which is ``lint-imports``' contract in pyproject.toml; this checks what an import
actually loads, lazy imports included.) The in-process tests: ``tests/unit/test_probes.py``."""

from __future__ import annotations

import sys


def test_probes_import_nothing_from_runtime() -> None:
    import subprocess

    code = ("import sys, probes, probes.topology, probes.layout, probes.links, probes.gpu;"
            "bad=[m for m in sys.modules if m.split('.')[0] in "
            "('collectives','autotune','pynvml','mpi4py','optuna')];"
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = "import sys, collectives; sys.exit(1 if 'probes' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
