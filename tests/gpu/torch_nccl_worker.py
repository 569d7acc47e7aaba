"""The torch engine's NCCL side on real GPUs, one rank per GPU, started by torchrun from
``tests/gpu/test_torch_engine.py``::

    python -m torch.distributed.run --standalone --nproc-per-node K \\
        tests/gpu/torch_nccl_worker.py MODE        # MODE: nccl | cpu:gloo,cuda:nccl | gloo

What it checks (every rank; the failures of all ranks are gathered, rank 0 prints them):
the group's backends as the engine reads them; the ``torch`` transport's coalesced NCCL
sends/receives on CuPy arrays (a ring, or a send to itself on one rank) and its
``native_allreduce`` (NCCL's allreduce, called directly so it runs on one rank too); the
contract of every algorithm on CUDA tensors through ``Communicator(group.WORLD)`` with
closed-form results and bitwise agreement across ranks, also on a ``Dup()`` and a
``Split()`` (NCCL groups of ringtune's own, from the job's store); a result read on
torch's current stream right after the call; the refusals: a CPU buffer on an NCCL-only
group, a CUDA buffer on a gloo group. Exit 0 and a last line ``OK …``, else 1.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from collectives import Communicator  # noqa: E402
from collectives.engines.torch import TorchComm  # noqa: E402
from collectives.testing import contract  # noqa: E402
from collectives.testing.results import check_input, mismatches  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "cpu:gloo,cuda:nccl"
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))


def _refused(fn: Any, *words: str) -> list[str]:
    try:
        fn()
    except ValueError as exc:
        missing = [w for w in words if w not in str(exc)]
        return [f"refusal lacks {missing}: {exc}"] if missing else []
    return [f"no ValueError (expected one naming {words})"]


def check_transport(comm: Any) -> list[str]:
    """The transport alone: a ring of coalesced NCCL sends/receives and NCCL's allreduce."""
    import cupy

    from collectives.registry import get_backend
    from collectives.transports.torch import make_torch_transport

    be = get_backend("cupy")
    t = make_torch_transport(comm.comm, be)
    r, n = comm.rank, comm.size
    fails = []
    send = cupy.arange(1000, dtype=cupy.float32) + r
    recv = cupy.zeros(1000, dtype=cupy.float32)
    t.start([(send, (r + 1) % n, 3)], [(recv, (r - 1) % n, 3)]).wait()
    if not bool((recv == cupy.arange(1000, dtype=cupy.float32) + (r - 1) % n).all()):
        fails.append(f"ring step received {cupy.asnumpy(recv[:3])}")
    for dtype in ("float32", "float16", "int64"):
        buf = cupy.full(333, r + 1, dtype=dtype)
        t.native_allreduce(buf, "sum")
        if not bool((buf == n * (n + 1) // 2).all()):
            fails.append(f"native_allreduce {dtype}: {cupy.asnumpy(buf[:3])}")
    return fails


def check_contract(c: Any, label: str, light: bool) -> list[str]:
    setup = contract.Setup(upload=lambda a: torch.from_numpy(a).cuda(),
                           download=lambda x: x.cpu().numpy(), label=f"cuda over torch {label}")
    cfgs = contract.configs(c.size, contract.contract_algorithms(gpu=True), light=True,
                            gpu=True)
    if light:
        cfgs = [cfg for cfg in cfgs if not cfg[1]]
    return contract.run_configs(c, cfgs, setup, density="ops", family_density="sparse")


def check_current_stream(c: Any) -> list[str]:
    """Written on torch's current stream just before, read there just after: no sync by
    the caller (the runtime orders its work after the writer and before the reader)."""
    t = torch.empty(1 << 20, device="cuda")
    t.fill_(float(c.rank + 1))
    c.allreduce(t, op="sum", algorithm="multiring", rings=2)
    got = float(t.sum().item())
    want = float(c.size * (c.size + 1) // 2) * (1 << 20)
    return [] if got == want else [f"current stream read {got}, expected {want}"]


def main() -> int:
    torch.cuda.set_device(LOCAL)
    dist.init_process_group(MODE, timeout=datetime.timedelta(seconds=120))
    fails: list[str] = []
    c = Communicator(dist.group.WORLD)
    backends = c.comm.backends
    if MODE == "gloo":
        fails += _refused(lambda: c.allreduce(torch.ones(8, device="cuda")), "CUDA buffer",
                          "backend is gloo")
    else:
        if backends.get("cuda") != "nccl":
            fails.append(f"the engine read backends {backends} for mode {MODE}")
        if MODE == "nccl":
            fails += _refused(lambda: c.allreduce(np.ones(8, dtype=np.float32)), "CPU buffer",
                              "backend is nccl", "tensor.cuda()")
        fails += check_transport(c)
        fails += check_contract(c, "WORLD", light=False)
        fails += check_current_stream(c)
        world = TorchComm(dist.group.WORLD)
        for kind in ("dup", "split"):
            with contract.communicator_of(world, kind) as (sub, label):
                fails += check_contract(sub, label, light=True)
        x = check_input(4099, "float32", "sum", c.rank)
        y = torch.from_numpy(x.copy()).cuda()
        c.allreduce(y, algorithm="native")
        fails += mismatches(y.cpu().numpy(), 4099, "float32", "sum", c.size, "native (NCCL)")
    everyone = c.comm.allgather(fails[:8])
    c.close()
    dist.destroy_process_group()
    lines = [f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs]
    if c.rank == 0:
        for line in lines:
            print("FAIL", line, flush=True)
        if not lines:
            print(f"OK {MODE}: {c.size} rank(s), backends {backends}", flush=True)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
