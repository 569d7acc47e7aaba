"""``ringtune tune --workload``: the fused bucket size is searched on the workload's tensors,
the same on every rank, stored as ``fusion.bucket_bytes`` and used by ``allreduce_many``."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

from autotune.fusion import candidates
from autotune.tuning import TuneOptions, tune
from collectives import Communicator
from collectives.profile import load_profile
from collectives.training.fusion import resolve_bucket_bytes

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()
TENSORS = [40, 2560, 256, 16384, 256, 16384]  # the digits MLP (digits-mlp-64x2.yaml)


def test_tune_stores_the_fused_bucket_size() -> None:
    folder = WORLD.bcast(tempfile.mkdtemp(prefix="ringtune-fusion-") if RANK == 0 else None)
    try:
        out = os.path.join(folder, "p.yaml")
        opts = TuneOptions(out=out, buckets=[4096], trials=2, budget_s=30.0, sampler="random",
                           seed=1, algorithms=["native"], progress=False,
                           tensor_bytes=TENSORS)
        result = tune(WORLD, opts)
        fusion = result.profile.get("fusion") or {}
        fails = []
        if len({repr(x) for x in WORLD.allgather(fusion)}) > 1:
            fails.append("ranks stored different fusion records")
        if fusion.get("bucket_bytes") not in candidates(sum(TENSORS)):
            fails.append(f"bucket_bytes {fusion.get('bucket_bytes')} is not a candidate")
        if sorted(fusion.get("measured", {}).get("time_us", {})) != sorted(
                str(c) for c in candidates(sum(TENSORS))):
            fails.append(f"not every candidate measured: {fusion.get('measured')}")
        prof = load_profile(out, world_size=N)
        comm = Communicator(WORLD, profile=prof)
        try:
            if resolve_bucket_bytes(comm, None) != fusion.get("bucket_bytes"):
                fails.append("allreduce_many does not take the profile's size")
            bufs = [np.full(b // 4, RANK + 1, dtype=np.float32) for b in TENSORS]
            comm.allreduce_many(bufs)
            want = N * (N + 1) / 2
            if not all(np.all(b == want) for b in bufs):
                fails.append("allreduce_many with the tuned size gave a wrong sum")
        finally:
            comm.close()
        agree(fails)
    finally:
        WORLD.Barrier()
        if RANK == 0:
            shutil.rmtree(folder, ignore_errors=True)
