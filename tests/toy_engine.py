"""``toy``: an engine of threads as ranks, the proof that an engine is one module.

It wraps the in-process world of ``tests/inproc.py`` (``ToyComm``: an ``InprocComm`` marked
as this engine's, so the ``mpi`` engine's duck-typed claim does not take it) and moves
bytes over the ``inproc`` transport. Everything the runtime, the CLI and the profile ask of
an engine is answered here, nothing else in the tree names it: registered when imported,
as a plug-in (``RINGTUNE_PLUGINS=tests.toy_engine``), ``ringtune tune --help`` lists it,
``--engine toy`` runs a verb over a world of one rank (``world``), ``--engine auto`` takes
it when its "launcher" set ``TOY_ENGINE_RUN`` (``detect``), and online tuning and the
offline profile record it (``record``: name, backend, version).

Tests: ``tests/unit/test_toy_engine.py`` (the allreduce contract over it, the CLI's
parser and refusals, the profile's record), ``tests/cli/test_toy_engine.py`` (the CLI
through ``RINGTUNE_PLUGINS``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from collectives.engines.base import Engine
from collectives.engines.registry import register_engine
from tests import inproc

#: The variable its launcher sets (``detect``).
RUN_ENV = "TOY_ENGINE_RUN"


class ToyComm(inproc.InprocComm):
    """An in-process communicator that the ``toy`` engine claims."""

    toy_world = True

    @classmethod
    def of(cls, comm: inproc.InprocComm) -> ToyComm:
        """The same rank of the same world, as the toy engine's."""
        return cls(comm.world, comm.context, comm.members, comm.world_rank)

    def Dup(self) -> ToyComm:  # noqa: N802 - mpi4py's name
        return ToyComm.of(super().Dup())

    def Split(self, color: int = 0, key: int = 0) -> ToyComm:  # noqa: N802
        return ToyComm.of(super().Split(color, key))


class ToyEngine(Engine):
    name = "toy"
    claim_order = 50
    launcher = "toyrun"
    cli_help = "toy (threads as ranks, tests/toy_engine.py)"

    def claims(self, obj: Any) -> bool:
        return getattr(obj, "toy_world", False) is True

    def detect(self) -> bool:
        return bool(os.environ.get(RUN_ENV))

    def cli_refusal(self, verb: str, np: int | None) -> str | None:
        if np is not None:
            return "--engine toy: its ranks are threads of one process; drop -np"
        return None

    def world(self, gpu: bool = False) -> ToyComm:
        inproc.register()
        return ToyComm(inproc._World(1, inproc.DEFAULT_TIMEOUT), ("world",), (0,), 0)

    def host_name(self, comm: Any) -> str:
        return "toyhost"

    def abort(self, comm: Any, code: int) -> None:
        raise SystemExit(code)

    def transports(self) -> tuple[str, ...]:
        return ("inproc",)

    def default_transport(self, comm: Any, backend: Any) -> str:
        inproc.register()
        return "inproc"

    def allreduce_array(self, comm: Any, arr: np.ndarray, op: str) -> None:
        comm.Allreduce(None, arr, op)

    def describe(self, comm: Any) -> dict[str, str]:
        return {"engine": self.name, "backend": "threads"}

    def version(self) -> str | None:
        return "0.1"


TOY_ENGINE = register_engine(ToyEngine())
