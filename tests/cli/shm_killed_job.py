"""An MPI job whose rank 1 is SIGKILLed in the middle of shared-memory allreduces
(``test_shm_kill.py`` and ``test_shm_kill_openmpi.py`` start it). After the first allreduce
each rank names its pid and the files of /dev/shm it maps (its MPI library's segments and
ringtune's, already unlinked), so that the test can tell this job's segments from a
concurrent job's (a ringtune segment's name holds its creator's pid)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from collectives import Communicator  # noqa: E402

c = Communicator(MPI.COMM_WORLD)
buf = np.ones(1 << 20, np.float32)  # 4 MiB: 16 steps of the default chunk
c.allreduce(buf, algorithm="shm")
with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
    mapped = sorted({ln.split("/dev/shm/", 1)[1].strip() for ln in maps if "/dev/shm/" in ln})
print(f"rank {c.rank} (pid {os.getpid()}): maps in /dev/shm: {' | '.join(mapped)}",
      flush=True)
print(f"rank {c.rank}: first allreduce done", flush=True)
if c.rank == 1:
    # From another thread, so that the kill lands inside an allreduce, not between two.
    threading.Thread(target=lambda: (time.sleep(0.3), os.kill(os.getpid(), signal.SIGKILL)),
                     daemon=True).start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    c.allreduce(buf, algorithm="shm")
print(f"rank {c.rank}: still running: the dead rank went unnoticed", flush=True)
