"""The allreduce contract (``collectives/testing/contract.py``) over the ``torch`` engine,
under torchrun: every registered algorithm and parameter family over gloo, sizes {0, 1, 2,
n−1, n·rings·3+1, 37, 97}, on ``Communicator(torch.distributed.group.WORLD)``, a ``Dup()``
and a ``Split()`` with non-contiguous ranks in reversed order (gloo groups of ringtune's
own, made from the job's store), results equal to the closed form of
``collectives/testing/results.py`` and bitwise identical on every rank; then a group from
``new_group``, larger buffers, a shaped buffer, the default choice and the plan cache. A new
algorithm is tested here the moment it is registered."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from collectives import Communicator
from collectives.ops import DTYPES, OPS
from collectives.testing import contract

from .conftest import RANK, SIZE, agree, world

#: (Communicator, kind, label) over the world group, a ``Dup()`` and a ``Split()`` of it.
kind_comm = contract.kind_comm_fixture(world)


@pytest.mark.parametrize("algo", contract.contract_algorithms())
def test_contract(kind_comm: tuple[Any, str, str], algo: str) -> None:
    c, kind, label = kind_comm
    assert c.engine.name == "torch"
    light = kind != "world"
    fails = contract.run_configs(c, contract.configs(c.size, [algo], light=light),
                                 density="ops" if light else "full",
                                 family_density="sparse" if light else "ops")
    agree([f"{label}: {line}" for line in fails])


def test_a_new_group_of_even_ranks() -> None:
    """``new_group`` (every rank calls it, in the same order); only members build the
    communicator, whose sub-groups (hierarchical) are made from the default store."""
    evens = list(range(0, SIZE, 2))
    group = dist.new_group(evens, timeout=None)
    fails: list[str] = []
    try:
        fails += _on_members(group, evens)
    except Exception as exc:  # noqa: BLE001 - every rank must reach agree()
        fails.append(f"{type(exc).__name__}: {exc}")
    finally:
        dist.destroy_process_group(group)
    agree(fails)


def _on_members(group: Any, evens: list[int]) -> list[str]:
    fails: list[str] = []
    if RANK in evens:
        c = Communicator(group)
        try:
            if c.size != len(evens) or c.rank != evens.index(RANK):
                fails.append(f"new_group rank/size {c.rank}/{c.size}, expected "
                             f"{evens.index(RANK)}/{len(evens)}")
            cfgs = [("native", {}), ("hierarchical", {"dims": [1, c.size]}),
                    ("multiring", {"rings": 2, "chunk_bytes": 8})]
            fails += contract.run_configs(c, cfgs, density="ops", where="new_group ")
            # A hook over the user's own sub-group is not refused: DDP may run over that
            # same group (process_group=group), which the hook cannot see.
            from collectives.torch import HookState

            HookState(c).close()
        finally:
            c.close()
    return fails


@pytest.mark.parametrize("algo", contract.contract_algorithms())
def test_larger_buffers_every_dtype_and_op(comm: Any, algo: str) -> None:
    fails: list[str] = []
    for dtype in DTYPES:
        for op in OPS:
            fails += contract.check_one(comm, algo, {}, (1 << 15) + 3, dtype, op)
    agree(fails)


def test_multichunk_pipeline_and_grid(comm: Any) -> None:
    """Many chunks per step, several rings, and the deepest grid of this world."""
    cfgs = [("multiring", {"rings": 3, "chunk_bytes": 4096}),
            ("hierarchical", {"dims": contract.grids(comm.size)[-1], "rings": 2,
                              "chunk_bytes": 1024, "pipeline": 2})]
    fails: list[str] = []
    for algo, params in cfgs:
        fails += contract.check_one(comm, algo, params, (1 << 16) + 5, "float32", "sum")
    agree(fails)


def test_shape_default_choice_plan_cache(comm: Any) -> None:
    agree(contract.check_shaped_in_place(comm) + contract.check_default_choice(comm)
          + contract.check_plan_cache(comm))


def test_torch_tensors_in_place_and_the_engine_in_explain(comm: Any) -> None:
    t = torch.full((3, 50), float(RANK + 1))
    out = comm.allreduce(t, op="avg")
    want = (SIZE + 1) / 2
    fails = [] if out is t and bool((t == want).all()) else [f"avg of tensors: {t[0, :3]}"]
    line = comm.explain(1000)
    if "over torch" not in line:
        fails.append(f"explain names another transport: {line}")
    if comm.engine.describe(comm.comm) != {"engine": "torch", "backend": "gloo"}:
        fails.append(f"describe: {comm.engine.describe(comm.comm)}")
    agree(fails)


def test_native_is_the_groups_own_allreduce(comm: Any) -> None:
    """``native`` under this engine is gloo's allreduce: the same bits as ``dist.all_reduce``
    on the same input."""
    x = np.linspace(-1, 1, 1001, dtype=np.float32) * (RANK + 1) / 3
    ref = torch.from_numpy(x.copy())
    dist.all_reduce(ref)
    comm.allreduce(x, algorithm="native")
    agree([] if np.array_equal(x, ref.numpy()) else ["native differs from dist.all_reduce"])


def test_probes_detect_and_measure_links_over_the_group() -> None:
    """The topology probes over a process group: one host, every rank placed, a link
    matrix measured with the group's gloo point-to-point (what ``ringtune probe`` needs)."""
    import probes

    topo = probes.detect(world(), measure=True, message_bytes=1 << 12, repetitions=1)
    bw = topo.links.bandwidth_gbps if topo.links is not None else ()
    fails = [] if len(topo.ranks) == SIZE and len(topo.hosts) == 1 else [
        f"{len(topo.ranks)} ranks on {len(topo.hosts)} hosts"]
    fails += [f"link {a}->{b} unmeasured" for a in range(SIZE) for b in range(SIZE)
              if a != b and not (len(bw) == SIZE and (bw[a][b] or 0) > 0)]
    agree(fails)


def test_the_mpi_like_surface_for_the_tools() -> None:
    """What the tuner and the CLI ask of a communicator besides allreduce: lower-case and
    buffer ``allreduce`` of host values, a ``bcast``, a ``Barrier``, a ``Split`` that
    leaves some ranks out (a negative color, as MPI.UNDEFINED)."""
    w = world()
    fails = []
    if w.allreduce(RANK + 1, op="max") != SIZE:
        fails.append("allreduce max of ranks")
    times = np.array([float(RANK), 1.0])
    w.Allreduce(times.copy(), times, op="sum")
    if list(times) != [SIZE * (SIZE - 1) / 2, float(SIZE)]:
        fails.append(f"Allreduce sum: {times}")
    if w.bcast(f"from {RANK}", root=SIZE - 1) != f"from {SIZE - 1}":
        fails.append("bcast")
    w.Barrier()
    sub = w.Split(0 if RANK == 0 else -32766, RANK)
    if (sub is None) != (RANK != 0) or (sub is not None and sub.Get_size() != 1):
        fails.append(f"Split with MPI.UNDEFINED gave {sub}")
    agree(fails)
