"""DDP's gloo process group set up across emulated hosts the way examples/train_digits.py and
benchmarks/bench_training.py do it (the store address broadcast over MPI): it must come up
and reduce correctly, not hang, when the ranks talk over libfabric between hosts."""

from __future__ import annotations

import pytest

from .conftest import emulate

pytest.importorskip("torch")

SCRIPT = """
import sys
sys.path.insert(0, "examples")
import torch, torch.distributed as dist
from mpi4py import MPI
from train_digits import init_gloo
w = MPI.COMM_WORLD
init_gloo(w)
x = torch.full((1000,), float(w.rank + 1))
dist.all_reduce(x)
n = w.size
assert torch.equal(x, torch.full((1000,), float(n * (n + 1) // 2))), x[:4]
hosts = len(set(w.allgather(MPI.Get_processor_name())))
dist.destroy_process_group()
if w.rank == 0:
    print(f"gloo ok across {hosts} hosts")
"""


def test_gloo_group_across_hosts() -> None:
    res = emulate("2x2", ["python", "-c", SCRIPT], timeout=180)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "gloo ok across 2 hosts" in res.stdout, res.stdout[-2000:]
