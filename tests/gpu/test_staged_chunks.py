"""A gradient set larger than free device memory, exchanged chunk by chunk through the
``staged`` transport by ``allreduce_many`` (GeePS's host-staged state): on the simulated GPU,
whose memory a test can make small (``RINGTUNE_FAKE_GPU_MEM_BYTES``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from .conftest import GPU_OK, agree

pytestmark = pytest.mark.skipif(os.environ.get("RINGTUNE_FAKE_GPU") != "1",
                                reason="sets the device memory size: simulated GPU only")


def _profile(world: int) -> Any:
    from collectives.profile import profile_from_dict

    # rhd keeps a scratch copy of the whole message on the device: the algorithm that needs
    # the most device memory.
    return profile_from_dict({
        "format": "ringtune-profile", "version": 1, "topology": {"world_size": world},
        "backend": "cupy", "transport": "staged",
        "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "rhd"}]},
        "<staged rhd>", world_size=world)


@pytest.mark.skipif(not GPU_OK, reason="no GPU")
def test_gradients_larger_than_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy
    from mpi4py import MPI

    from collectives import Communicator
    from collectives.registry import get_backend

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    # The whole-tensor allreduce below must fail on every rank and reach this test, not
    # end the job (the default on a failed collective).
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    comm = Communicator(world, profile=_profile(n))
    backend = get_backend("cupy")  # binds this rank's GPU: allocate after it
    cupy.cuda.Device(backend.device).use()
    sizes = [300, 262144, 5000, 40000, 7]  # 1.2 MiB of float32, one tensor of 1 MiB
    hosts = [(np.arange(s) % 1000 + rank + 1).astype(np.float32) for s in sizes]
    grads = [cupy.asarray(h) for h in hosts]
    want = [sum((np.arange(s) % 1000 + r + 1).astype(np.float32) for r in range(n))
            for s in sizes]
    used = cupy.cuda.runtime.memGetInfo()[1] - cupy.cuda.runtime.memGetInfo()[0]
    monkeypatch.setenv("RINGTUNE_FAKE_GPU_MEM_BYTES", str(used + (600 << 10)))
    bad = []
    free = backend.free_bytes()
    if not free < sum(g.nbytes for g in grads):
        bad.append(f"free device memory {free} B is not below the gradients' size")
    if n > 1:  # (one rank has nothing to exchange and needs no scratch)
        # One allreduce of the 1 MiB tensor needs a 1 MiB scratch: more than is free.
        try:
            comm.allreduce(grads[1])
            bad.append("the whole-tensor allreduce fitted: the test proves nothing")
        except Exception as exc:  # noqa: BLE001 - the simulated cudaMalloc failure
            if "out of memory" not in str(exc):
                bad.append(f"unexpected error {exc!r}")
        comm.clear_plans()  # the failed call reduced nothing: grads[1] is untouched
    comm.allreduce_many(grads)
    for i, (g, w) in enumerate(zip(grads, want)):
        got = cupy.asnumpy(g)
        if not np.array_equal(got, w):
            bad.append(f"tensor {i}: {np.flatnonzero(got != w)[:4]} wrong")
    comm.close()
    agree(bad)
