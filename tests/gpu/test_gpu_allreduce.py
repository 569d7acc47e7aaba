"""The allreduce contract (``collectives/testing/contract.py``) on GPU buffers: every registered
algorithm and parameter family × every GPU transport available on all ranks, on the world
communicator (defaults: every size × op, each dtype × op pair at some size), a ``Dup()`` and a
``Split()`` with non-contiguous ranks; closed-form results and bitwise agreement across ranks. Plus
the GPU errors: NCCL with two ranks on one GPU, mixed host/GPU buffers under ``RINGTUNE_CHECK=1``.
Works at any world size; skipped without a GPU.

Run: ``mpiexec -n K python -m mpi4py -m pytest tests/gpu`` (K = 1, 2, …; on a one-GPU
machine the ranks share the GPU, so NCCL's multi-rank tests skip with that reason while
``staged`` and CUDA-aware ``mpi`` run).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from collectives.testing import contract

from .conftest import GPU_OK, agree

WORLD: Any = None
N = 1
if GPU_OK:
    from mpi4py import MPI

    WORLD = MPI.COMM_WORLD
    N = WORLD.Get_size()


def common_transports(comm: Any = None) -> list[str]:
    """GPU transports available on every rank (each rank probes; all must agree to use)."""
    from collectives.cuda import available_transports

    comm = comm if comm is not None else WORLD
    everyone = comm.allgather(available_transports(comm))
    return [t for t in everyone[0] if all(t in e for e in everyone)]


def gpu_setup(transport: str) -> contract.Setup:
    """Check inputs copied to the GPU, results copied back."""
    import cupy

    return contract.Setup(transport=transport, upload=cupy.asarray, download=cupy.asnumpy,
                          label=f"cupy over {transport}")


@pytest.fixture(scope="module")
def comm() -> Any:
    from collectives import Communicator

    c = Communicator(WORLD)
    yield c
    c.close()


#: (Communicator, kind, label) over the world, a ``Dup()`` and a ``Split()`` of it.
kind_comm = contract.kind_comm_fixture(lambda: WORLD)


SIMULATED = os.environ.get("RINGTUNE_FAKE_GPU") == "1"


def gpu_configs(n: int, algo: str) -> list[contract.Config]:
    """The contract's light families. On the simulated GPU, without hierarchical grids
    with a ``native`` dimension: the simulation progresses a GPU only while its own host
    polls it, so a rank blocked in MPI (``staged``'s ring after the grid's native step)
    while its peer waits for this rank's queued NCCL allreduce hangs there. A real GPU
    runs it; the in-process sweep of tests/unit/test_cuda_transports.py drives its
    simulated GPU while blocked and runs these."""
    cfgs = contract.configs(n, [algo], light=True, gpu=True)
    if SIMULATED:
        cfgs = [(a, p) for a, p in cfgs if "native" not in (p.get("inner") or [])]
    return cfgs


@pytest.mark.parametrize("algo", contract.contract_algorithms(gpu=True))
def test_contract(kind_comm: tuple[Any, str, str], algo: str) -> None:
    c, kind, label = kind_comm
    fails: list[str] = []
    for transport in common_transports(c.comm):
        if kind == "world":
            # Defaults: every size x op, each (dtype, op) pair at some size (the simulated
            # GPU is slow: the full product runs on host buffers, tests/mpi).
            fails += contract.run_configs(c, gpu_configs(c.size, algo), gpu_setup(transport),
                                          density="ops", family_density="sparse")
        else:
            fails += contract.run_configs(c, gpu_configs(c.size, algo), gpu_setup(transport),
                                          density="sparse")
    agree([f"{label}: {line}" for line in fails])


def test_contract_large_with_chunks(comm: Any) -> None:
    fails: list[str] = []
    for transport in common_transports():
        for algo, params in [(a, {}) for a in contract.contract_algorithms(gpu=True)] + [
                ("multiring", {"rings": 4, "chunk_bytes": 1 << 16})]:
            for dtype, op in (("float32", "sum"), ("int64", "max"), ("float16", "avg")):
                fails += contract.check_one(comm, algo, params, (1 << 20) + 3, dtype, op,
                                            gpu_setup(transport))
    agree(fails)


def test_default_choice_on_gpu(comm: Any) -> None:
    """No algorithm or transport named: the built-in profile's choice over the default
    GPU transport."""
    import cupy

    setup = contract.Setup(upload=cupy.asarray, download=cupy.asnumpy, label="cupy")
    agree(contract.check_default_choice(comm, setup, counts=(5, 1 << 18)))


def test_bfloat16_allreduce_if_supported(comm: Any) -> None:
    import cupy

    from collectives.registry import get_backend

    be: Any = get_backend("cupy")
    if "bfloat16" not in be.extra_dtypes:
        pytest.skip("this CuPy has no bfloat16 (needs CuPy ≥ 14 with ml_dtypes)")
    fails = []
    for transport in common_transports():
        for algo in contract.contract_algorithms(gpu=True):
            buf = cupy.asarray(np.full(1001, comm.rank + 1, dtype=np.float32).astype(
                be.dtype("bfloat16")))
            comm.allreduce(buf, op="sum", algorithm=algo, transport=transport)
            want = N * (N + 1) / 2
            got = cupy.asnumpy(buf).astype(np.float32)
            if not np.all(got == want):
                fails.append(f"bfloat16 {algo} over {transport}: {got[:4]} != {want}")
    agree(fails)


def test_nccl_refuses_two_ranks_on_one_gpu() -> None:
    from collectives.cuda import GpuError, nccl_status
    from collectives.cuda.binding import shared_gpus
    from collectives.registry import get_backend, make_transport

    be: Any = get_backend("cupy")
    ok = WORLD.allgather(nccl_status()[0])
    if not all(ok):
        pytest.skip("NCCL is not installed on every rank")
    records = WORLD.allgather((MPI.Get_processor_name(), be.binding.pci_bus_id))
    if not shared_gpus(records):
        pytest.skip("every rank has its own GPU here (nothing shared to refuse)")
    msg = ""
    try:
        make_transport("nccl", WORLD, be)
    except GpuError as exc:
        msg = str(exc)
    agree([] if "one GPU per rank" in msg and "ranks 0, 1" in msg else
          [f"expected the shared-GPU error, got {msg!r}"])


def test_transports_move_data_to_self() -> None:
    """Point-to-point through each GPU transport on a one-rank communicator (NCCL too:
    one rank owns its GPU), several pieces per message for ``staged``."""
    import cupy

    from collectives.cuda import nccl_status
    from collectives.cuda.nccl import NcclTransport
    from collectives.cuda.staged import StagedTransport
    from collectives.registry import get_backend

    be: Any = get_backend("cupy")
    kinds: list[Any] = [lambda: StagedTransport(MPI.COMM_SELF, be, piece_bytes=1000)]
    if nccl_status()[0]:
        kinds.append(lambda: NcclTransport(MPI.COMM_SELF, be))
    fails = []
    for make in kinds:
        t = make()
        for n in (0, 1, 999, 1000, 1001, 12345):
            src = cupy.arange(n, dtype=cupy.uint8)
            dst = cupy.zeros(n, dtype=cupy.uint8)
            # Written on CuPy's current stream, which the backend's non-blocking stream does
            # not follow: allreduce orders them (as_flat), a bare transport call does not.
            cupy.cuda.get_current_stream().synchronize()
            p = t.start([(src, 0, 3)], [(dst, 0, 3)])
            p.wait_recv()
            p.wait()
            be.synchronize()
            if not bool((dst == src).all()):
                fails.append(f"{t.name}: {n} bytes to self arrived wrong")
        buf = cupy.arange(7, dtype=cupy.float32)
        cupy.cuda.get_current_stream().synchronize()
        t.native_allreduce(buf, "sum")
        be.synchronize()
        if cupy.asnumpy(buf).tolist() != list(range(7)):
            fails.append(f"{t.name}: native allreduce on one rank changed the data")
        t.close()
    agree(fails)


def test_mixed_host_and_gpu_buffers_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    from collectives import AgreementError, Communicator

    if N < 2:
        pytest.skip("needs two ranks")
    monkeypatch.setenv("RINGTUNE_CHECK", "1")
    c = Communicator(WORLD)
    buf: Any = np.ones(16, np.float32) if WORLD.Get_rank() == 0 else cupy.ones(16, cupy.float32)
    msg = ""
    try:
        c.allreduce(buf)
    except AgreementError as exc:
        msg = str(exc)
    c.close()
    agree([] if "numpy" in msg and "cupy" in msg else [f"no clear error: {msg!r}"])


def test_torch_tensor_allreduce(comm: Any) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from collectives.registry import get_backend

    be: Any = get_backend("cupy")
    t = torch.full((3, 5), float(comm.rank + 1), device=f"cuda:{be.device}")
    out = comm.allreduce(t, op="sum")
    agree([] if out is t and bool((t == N * (N + 1) / 2).all()) else
          ["torch tensor not reduced in place"])
