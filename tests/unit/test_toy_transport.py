"""A transport is one module: ``tests/toy_transport.py`` registered, nothing else edited,
passes the transport contract and carries the allreduce contract in-process (threads as
ranks), and what the runtime asks of a transport it says as class attributes, never by
name: a GPU transport's place in the preference order (``gpu_preference``,
``usable_on_gpu``) and who chooses its native allreduce (``native_chooser``). Under
``mpiexec`` through ``RINGTUNE_PLUGINS``: ``tests/cli/test_toy_transport.py``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from collectives import registry
from collectives.testing import contract
from collectives.testing import transport_contract as tc
from collectives.transports import registry as table
from tests import inproc

TOY = "tests.toy_transport"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``tests/toy_transport.py`` imported (so registered) into copies of the transport
    registry: it is gone after the test (the plug-ins load first, into the originals)."""
    registry.transport_names()
    for name in ("_TRANSPORTS", "_TRANSPORT_BACKENDS", "_TEST_ONLY", "_TRANSPORT_CLASSES"):
        monkeypatch.setattr(table, name, type(getattr(table, name))(getattr(table, name)))
    inproc.register()
    sys.modules.pop(TOY, None)
    yield importlib.import_module(TOY)
    sys.modules.pop(TOY, None)


def test_the_registry_lists_it_with_its_class(toy: Any) -> None:
    assert "toy_transport" in registry.user_transport_names()
    assert registry.transport_class("toy_transport") is toy.ToyTransport
    assert "toy_transport" in registry.transports_for("numpy")
    assert "toy_transport" not in registry.gpu_transport_names()  # no gpu_preference


@pytest.mark.parametrize("check", list(tc.CHECKS))
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_transport_contract_passes(toy: Any, n: int, check: str) -> None:
    setup = tc.Setup(transport="toy_transport")

    def rank(world: Any) -> list[str]:
        why = tc.not_run(world, setup, check)
        if why:
            # Only what its class attributes rule out: tags (matched by order).
            return [] if check == "tags" and "interleaves" in why else [why]
        return tc.CHECKS[check](world, setup)

    fails = [f"rank {r}: {line}" for r, lines in enumerate(inproc.run_ranks(n, rank))
             for line in lines]
    assert not fails, "\n".join(fails[:12])


@pytest.mark.parametrize("n,kind", [(2, "world"), (3, "world"), (4, "split"), (3, "dup")])
def test_the_allreduce_contract_runs_over_it(toy: Any, n: int, kind: str) -> None:
    setup = contract.Setup(transport="toy_transport", label="toy_transport")

    def rank(world: Any) -> list[str]:
        with contract.communicator_of(world, kind, topology=inproc.topology) as (c, label):
            cfgs = contract.configs(c.size, light=True)
            return [f"{label}: {line}" for line in
                    contract.run_configs(c, cfgs, setup, density="sparse")]

    fails = [line for lines in inproc.run_ranks(n, rank) for line in lines]
    assert not fails, "\n".join(fails[:20])


def test_a_composition_over_it_warns_naming_its_chooser(toy: Any) -> None:
    from collectives.algorithms import native

    native._warned.clear()
    with pytest.warns(RuntimeWarning, match="toy_transport's gather chooses its own"):
        assert native._composition_selector("beta", "toy_transport") is None
    native._warned.clear()


def test_a_gpu_transport_takes_its_place_by_preference(
        toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives.cuda.availability as C
    from collectives.transport import Transport

    class ToyGpu(toy.ToyTransport):
        name = "toy_gpu"
        gpu_preference = 1  # after nccl; tied with CUDA-aware mpi, registered later

        @classmethod
        def usable_on_gpu(cls, here: Any) -> bool:
            return not here.cuda_aware_mpi()

    registry.register_transport("toy_gpu", ToyGpu, backends=("cupy",))
    assert issubclass(ToyGpu, Transport)
    monkeypatch.setattr(C, "cupy_status", lambda: (True, "1 GPU(s) visible"))
    monkeypatch.setattr(C, "nccl_status", lambda: (True, "NCCL 2.21.5"))
    monkeypatch.setattr(C, "gpus_shared_here", lambda: False)
    monkeypatch.setattr(C, "cuda_aware_mpi", lambda: False)
    assert C.available_transports() == ["nccl", "toy_gpu", "staged"]
    monkeypatch.setattr(C, "cuda_aware_mpi", lambda: True)
    assert C.available_transports() == ["nccl", "mpi", "staged"]
    assert registry.fallback_gpu_transport() == "staged"
