"""The engine registry and the torch engine's refusals, without torch: which engine claims
which communicator object, and the one-line errors for groups and buffers ringtune cannot
move (the rank, the group's backend and the fix)."""

from __future__ import annotations

from typing import Any

import pytest

from collectives import Communicator
from collectives.engines import engine_for, engine_names, get_engine
from collectives.engines.torch import TorchComm, describe_backends
from collectives.transports.torch import make_torch_transport
from tests.inproc import run_ranks, topology


def _fake_group_comm(backends: dict[str, str], rank: int = 1) -> TorchComm:
    """A ``TorchComm`` as the engine would make over a group with these backends (no
    torch needed: only the recorded facts are read)."""
    comm = object.__new__(TorchComm)
    comm.rank, comm.size, comm.backends = rank, 3, dict(backends)
    comm.groups = dict.fromkeys(backends)
    comm.world_ranks = (0, 1, 2)
    comm.label, comm.freed = "WORLD", False
    return comm


class _FakeGroup:
    """Shaped like a c10d process group, from a torch module."""

    __module__ = "torch.distributed.fake"

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def allreduce(self, *a: Any) -> None: ...
    def send(self, *a: Any) -> None: ...
    def recv(self, *a: Any) -> None: ...


class _Backend:
    def __init__(self, gpu: bool) -> None:
        self.name, self.on_gpu = ("cupy" if gpu else "numpy"), gpu


def test_engines_claim_their_objects_torch_first() -> None:
    assert engine_names() == ["torch", "mpi"]
    assert engine_for(_FakeGroup()).name == "torch"
    assert engine_for(_fake_group_comm({"cpu": "gloo"})).name == "torch"
    assert run_ranks(2, lambda comm: engine_for(comm).name) == ["mpi", "mpi"]
    with pytest.raises(ValueError, match="unknown engine 'gloo': use one of torch, mpi"):
        get_engine("gloo")


def test_no_group_and_unknown_objects_are_one_clear_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Under torchrun, None is group.WORLD read before init_process_group (outside it,
    # Communicator(None) is MPI's world: tests/unit/test_world_mismatch.py).
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    with pytest.raises(TypeError, match=r"None.*init_process_group has run") as err:
        Communicator(None)
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="unsupported communicator builtins.object"):
        engine_for(object())


def test_each_engine_runs_its_own_transports() -> None:
    mpi, torch = get_engine("mpi"), get_engine("torch")
    assert mpi.runs_transport("mpi") and mpi.runs_transport("inproc")
    assert mpi.runs_transport("staged") and not mpi.runs_transport("torch")
    assert torch.runs_transport("torch") and not torch.runs_transport("mpi")
    assert torch.default_transport(None, _Backend(False)) == "torch"


@pytest.mark.parametrize("backends,gpu,words", [
    ({"cuda": "nccl"}, False, ["CPU buffer", "backend is nccl", "tensor.cuda()"]),
    ({"cpu": "gloo", "cuda": "gloo"}, True, ["CUDA buffer", "backend is gloo", "NCCL"]),
    ({"cpu": "ucc"}, False, ["backend is ucc", "only over gloo", "new_group(backend='gloo')"]),
])
def test_buffers_a_group_cannot_move_are_refused(backends: dict[str, str], gpu: bool,
                                                 words: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        make_torch_transport(_fake_group_comm(backends), _Backend(gpu))
    msg = str(err.value)
    assert msg.startswith("rank 1: "), msg
    assert all(w in msg for w in words), msg
    assert "\n" not in msg


def test_a_group_without_gloo_or_nccl_is_refused_at_construction() -> None:
    comm = _fake_group_comm({"cpu": "ringtune"})
    with pytest.raises(ValueError, match=r"rank 1: ringtune cannot move bytes over a "
                       r"torch.distributed group whose backend is ringtune: .*gloo"):
        get_engine("torch").check_world(comm)
    get_engine("torch").check_world(_fake_group_comm({"cpu": "gloo", "cuda": "nccl"}))


def test_the_torch_transport_wants_a_process_group() -> None:
    def call(comm: Any) -> str:
        with pytest.raises(ValueError) as err:
            Communicator(comm, topology=topology(2)).allreduce(
                __import__("numpy").ones(4), algorithm="native", transport="torch")
        return str(err.value)

    for msg in run_ranks(2, call):
        assert "transport 'torch' moves bytes over torch.distributed groups" in msg


def test_backends_are_described_as_people_write_them() -> None:
    assert describe_backends({"cpu": "gloo", "cuda": "gloo"}) == "gloo"
    assert describe_backends({"cuda": "nccl", "cpu": "gloo"}) == "cpu:gloo,cuda:nccl"


def _stand_in_torch(version: str, with_shutdown: bool) -> Any:
    """A module shaped like torch as far as ``missing_torch_feature`` looks (no torch
    needed): ``torch._C._distributed_c10d.ProcessGroup`` with or without ``shutdown``."""
    import types

    group = type("ProcessGroup", (), {"shutdown": lambda self: None} if with_shutdown else {})
    torch = types.ModuleType("torch")
    torch.__version__ = version  # type: ignore[attr-defined]
    torch._C = types.SimpleNamespace(  # type: ignore[attr-defined]
        _distributed_c10d=types.SimpleNamespace(ProcessGroup=group))
    return torch


def test_a_torch_below_the_floor_is_one_line_naming_the_fix(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from collectives.engines.torch import TORCH_FLOOR, missing_torch_feature

    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch("2.2.2+cu121", False))
    msg = missing_torch_feature()
    assert msg is not None and "\n" not in msg
    assert "torch 2.2.2+cu121 has no ProcessGroup.shutdown" in msg
    assert f"pip install 'torch>={TORCH_FLOOR}'" in msg
    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch("2.13.0", True))
    assert missing_torch_feature() is None


def test_the_floor_is_the_one_pyproject_states() -> None:
    import re
    from pathlib import Path

    from collectives.engines.torch import TORCH_FLOOR

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.findall(r'"torch>=([0-9.]+)"', text) == [TORCH_FLOOR]
