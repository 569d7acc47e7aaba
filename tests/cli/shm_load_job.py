"""Shared-memory allreduces of many sizes and ops, each result checked against its closed
form and compared bitwise across ranks (``test_shm_kill.py`` runs it beside CPU hogs)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from collectives import Communicator  # noqa: E402

c = Communicator(MPI.COMM_WORLD)
n, rank = c.size, c.rank
bad = []
for i in range(60):
    count = (1, 97, 4099, 65537, 262147)[i % 5]
    op = ("sum", "max", "avg")[i % 3]
    x = (np.arange(count) % 7 + rank + 1).astype(np.float64)
    c.allreduce(x, op, algorithm="shm", chunk_bytes=(4096, 65536)[i % 2])
    base = np.arange(count) % 7
    want = {"sum": n * base + n * (n + 1) / 2, "max": base + n,
            "avg": base + (n + 1) / 2}[op]
    if not np.array_equal(x, want):
        bad.append(f"call {i} ({count} {op}): {int(np.count_nonzero(x != want))} wrong")
    digests = MPI.COMM_WORLD.allgather(hashlib.sha256(x.tobytes()).hexdigest())
    if len(set(digests)) != 1:
        bad.append(f"call {i} ({count} {op}): results differ bitwise across ranks")
print(f"rank {rank}: {'; '.join(bad) if bad else 'all 60 calls right'}", flush=True)
sys.exit(1 if bad else 0)
