"""``Communicator.allreduce_many`` on NumPy arrays (no torch needed): the same bits as one
``allreduce`` per array, whatever the bucket size, and the tuned size taken from the
profile."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import Communicator
from collectives.profile import builtin_profile, profile_from_dict
from collectives.training.fusion import DEFAULT_BUCKET_BYTES, resolve_bucket_bytes

from .conftest import WORLD, agree

RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
SIZES = [1, 9, 300, 5000, 3, 70000, 64, 2]


def arrays(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 7919 * RANK)
    out = []
    for i, n in enumerate(SIZES):
        if i % 2:
            out.append(rng.integers(-10**6, 10**6, n, dtype=np.int64))
        elif SIZE <= 2:
            out.append(rng.standard_normal(n).astype(np.float32))  # a + b: any order
        else:
            # Exact partial sums in any order, so the bits cannot depend on the algorithm.
            out.append((rng.integers(-512, 512, n) / 8).astype(np.float64))
    return out


@pytest.mark.parametrize("bucket_bytes", [8, 1000, 1 << 16, 1 << 24, None])
@pytest.mark.parametrize("op", ["sum", "avg", "min"])
def test_matches_one_allreduce_per_array(comm: Communicator, bucket_bytes, op) -> None:
    fused, single = arrays(1), arrays(1)
    ptrs = [a.ctypes.data for a in fused]
    ret = comm.allreduce_many(fused, op=op, bucket_bytes=bucket_bytes)
    for a in single:
        comm.allreduce(a, op=op)
    bad = [f"array {i}: not in place" for i, a in enumerate(ret) if a.ctypes.data != ptrs[i]]
    bad += [f"array {i} ({f.dtype}, {f.size}) differs at {np.flatnonzero(f != s)[:4]}"
            for i, (f, s) in enumerate(zip(fused, single)) if f.tobytes() != s.tobytes()]
    agree(bad)


def test_empty_and_zero_size(comm: Communicator) -> None:
    assert comm.allreduce_many([]) == []
    z = np.zeros(0, dtype=np.float32)
    assert comm.allreduce_many([z, np.ones(3)])[0] is z


def test_bucket_bytes_from_profile() -> None:
    base = builtin_profile(SIZE).to_dict()
    tuned = profile_from_dict(dict(base, fusion={"bucket_bytes": 12345}), world_size=SIZE)
    c = Communicator(WORLD, profile=tuned)
    try:
        agree([] if resolve_bucket_bytes(c, None) == 12345 else ["profile's size ignored"])
    finally:
        c.close()


def test_default_without_tuned_size(comm: Communicator) -> None:
    assert resolve_bucket_bytes(comm, None) == DEFAULT_BUCKET_BYTES
    with pytest.raises(ValueError, match=f"rank {RANK}: bucket_bytes must be a positive"):
        comm.allreduce_many([np.ones(2)], bucket_bytes=0)


def test_not_a_list(comm: Communicator) -> None:
    with pytest.raises(TypeError, match=f"rank {RANK}: allreduce_many takes a list"):
        comm.allreduce_many(np.ones(3))  # type: ignore[arg-type]
