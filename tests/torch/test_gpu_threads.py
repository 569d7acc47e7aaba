"""The communication thread's GPU path on the simulated GPU (tests/fakegpu), in a child
process: CUDA's current device belongs to each host thread, so a rank bound to GPU 1 whose
``allreduce_many`` reduces on the communication thread (which starts on device 0) must make
its GPU current there. The simulated GPU keeps one current device per process; the child
makes it per thread, as CUDA's is, so that the test fails where a real GPU would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import WORLD, agree

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import threading
from cupy.cuda import runtime

local = threading.local()
runtime.getDevice = lambda: getattr(local, "device", 0)
def _set(device):
    if not 0 <= int(device) < runtime.getDeviceCount():
        raise runtime.CUDARuntimeError(f"cudaErrorInvalidDevice: device {device}")
    local.device = int(device)
runtime.setDevice = _set

import cupy
import numpy as np
from mpi4py import MPI
from collectives import Communicator
from collectives.cuda import bind_device

bind_device(1)
comm = Communicator(MPI.COMM_SELF.Dup())
with cupy.cuda.Device(1):
    bufs = [cupy.asarray(np.arange(n, dtype=np.float32)) for n in (5, 3000, 7)]
    comm.allreduce_many(bufs, op="sum", bucket_bytes=4096)
    got = [cupy.asnumpy(b) for b in bufs]
assert all(np.array_equal(g, np.arange(g.size, dtype=np.float32)) for g in got), got
print("ok", threading.active_count())
comm.close()
"""


@pytest.mark.skipif(WORLD.Get_size() > 1, reason="one child process is enough (run at -n 1)")
def test_allreduce_many_on_gpu_1_from_the_comm_thread() -> None:
    env = dict(os.environ, RINGTUNE_FAKE_GPU="1", RINGTUNE_FAKE_GPUS="2",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "fakegpu"), str(ROOT)]))
    for k in [k for k in env if k.startswith(("PMI_", "HYDRA_", "MPIR_CVAR_", "OMPI_"))]:
        del env[k]  # a singleton MPI in the child, not a rank of this job
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         env=env, timeout=300, cwd=ROOT)
    agree([] if out.returncode == 0 and out.stdout.startswith("ok") else
          [f"exit {out.returncode}: {out.stdout[-800:]} {out.stderr[-1500:]}"])
