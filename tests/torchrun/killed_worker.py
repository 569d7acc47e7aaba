"""A torchrun job whose rank 1 is killed (SIGKILL) between two allreduces; the others must
end the job with a line naming rank 1 (``test_killed_rank.py`` starts it)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from collectives import Communicator  # noqa: E402

dist.init_process_group("gloo")
c = Communicator(dist.group.WORLD)
a = np.ones(1 << 14, np.float32)
algorithm = sys.argv[1] if len(sys.argv) > 1 else "multiring"
c.allreduce(a, algorithm=algorithm)  # its plan (and shm's segment) set up before the kill
print(f"rank {c.rank}: first allreduce done", flush=True)
if c.rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
for _ in range(100000):
    c.allreduce(a, algorithm=algorithm)
print(f"rank {c.rank}: still running: the dead rank went unnoticed", flush=True)
