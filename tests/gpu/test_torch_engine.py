"""The torch engine's NCCL side (issue 21, item 6) on this machine's GPUs: torchrun starts
``tests/gpu/torch_nccl_worker.py`` with one rank per GPU, over an NCCL-only world, a
``cpu:gloo,cuda:nccl`` world and a gloo world (whose CUDA buffers are refused). Two ranks
need two GPUs (NCCL refuses two ranks on one GPU); one rank still runs the transport's
coalesced sends/receives (to itself) and NCCL's allreduce. Skipped without torch or CUDA,
and on all but one process when run under ``mpiexec -n K`` (the worker starts its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import GPU_OK

WORKER = Path(__file__).with_name("torch_nccl_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def _why_not() -> str | None:
    if not GPU_OK:
        return "no GPU here"
    try:
        import torch
    except ImportError:
        return "torch is not installed in this environment"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:
        return "run from one process (the worker is started by torchrun)"
    return None


WHY = _why_not()


@pytest.mark.skipif(WHY is not None, reason=WHY or "")
@pytest.mark.parametrize("mode", ["nccl", "cpu:gloo,cuda:nccl", "gloo"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_torch_engine_on_gpus(mode: str, ranks: int) -> None:
    import torch

    if ranks > torch.cuda.device_count():
        pytest.skip(f"{ranks} ranks need {ranks} GPUs (NCCL refuses two ranks on one GPU); "
                    f"{torch.cuda.device_count()} here")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    # Not mpiexec's environment: each worker is a torchrun rank, not an MPI singleton of
    # this test's world.
    for var in [v for v in env if v.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_LOCAL"))]:
        del env[var]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(ranks), str(WORKER), mode],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and f"OK {mode}:" in out, out[-4000:]
