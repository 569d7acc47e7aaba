"""A complete plug-in module outside ``collectives/``: one algorithm, one backend, one
transport, one engine and one MPI library, each registered when the module is imported
(what ``RINGTUNE_PLUGINS=tests.plugin_example`` or an installed package's
``ringtune.plugins`` entry point does: ``collectives.plugins``).

Nothing imports it by default: ``tests/unit/test_plugins.py`` loads it through the plug-in
mechanism with the registries saved and restored around each test.

- algorithm ``plug_native``: the library's own allreduce (the smallest ``run``);
- backend ``plug_host``: NumPy arrays under another name;
- transport ``plug_counted``: the ``mpi`` transport counting the messages it posts (host
  buffers of ``plug_host`` and ``numpy`` only);
- engine ``plug_engine``: claims objects marked ``plug_world`` (``PlugWorld``) only;
- MPI library ``PlugMPI``: two ``impl`` candidates.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from collectives.algorithms.base import Algorithm
from collectives.algorithms.registry import register
from collectives.backend import NumpyBackend
from collectives.engines.base import Engine
from collectives.engines.registry import register_engine
from collectives.natives.base import NativeLibrary
from collectives.natives.base import register as register_library
from collectives.registry import register_backend, register_transport
from collectives.transports.mpi import MpiTransport

IMPORTS: list[int] = []  # one entry per import of this module (a plug-in loads once)
IMPORTS.append(1)


@register
class PlugNative(Algorithm):
    """The library's own allreduce, registered by a plug-in."""

    name = "plug_native"

    def run(self, buf: Any) -> None:
        self.ctx.transport.native_allreduce(buf, self.op)


class PlugHost(NumpyBackend):
    name = "plug_host"


register_backend("plug_host", PlugHost)


class CountedTransport(MpiTransport):
    """``mpi`` that counts the sends and receives it posts."""

    name = "plug_counted"
    posted = 0

    def start(self, sends: Any, recvs: Any) -> Any:
        CountedTransport.posted += len(sends) + len(recvs)
        return super().start(sends, recvs)

    def sub(self, comm: Any) -> CountedTransport:
        return CountedTransport(comm, self.backend)


register_transport("plug_counted", CountedTransport, backends=("numpy", "plug_host"))


class PlugWorld:
    """The communicator object of the plug-in's engine (nothing else claims it)."""

    plug_world = True


class PlugEngine(Engine):
    name = "plug_engine"
    claim_order = 10

    def claims(self, obj: Any) -> bool:
        return getattr(obj, "plug_world", False) is True

    def host_name(self, comm: Any) -> str:
        return "plughost"

    def abort(self, comm: Any, code: int) -> None:
        raise SystemExit(code)

    def transports(self) -> tuple[str, ...]:
        return ("plug_counted",)

    def default_transport(self, comm: Any, backend: Any) -> str:
        return "plug_counted"

    def allreduce_array(self, comm: Any, arr: np.ndarray, op: str) -> None:
        pass

    def describe(self, comm: Any) -> dict[str, str]:
        return {"engine": self.name, "backend": "plug"}


register_engine(PlugEngine())


@register_library
class PlugMPI(NativeLibrary):
    name = "PlugMPI"
    export_format: ClassVar[str] = ""

    def unavailable_reason(self) -> str:
        return ""

    def algorithms(self) -> list[str]:
        return ["plug_ring", "plug_tree"]
