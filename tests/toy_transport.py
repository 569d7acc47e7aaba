"""``toy_transport``: a transport of our own, the proof that a transport is one module.

Host buffers over any communicator object with ``Isend``/``Irecv`` (an mpi4py ``Comm``, the
in-process world of ``tests/inproc.py``): every message on one tag, so messages match by
posting order alone (``interleaves = False``, as NCCL), and a native allreduce of its own,
an ``allgather`` reduced in rank order on every rank, whose algorithm no MPI library
chooses (``native_chooser``, ``native_impls = False``). It says all of that as class
attributes, and nothing else in the tree names it: registered when imported
(``RINGTUNE_PLUGINS=tests.toy_transport``), the transport contract runs it under
``mpiexec`` (``tests/mpi/test_transport_contract.py`` asks the registry) and in-process
(``tests/unit/test_toy_transport.py``, with the allreduce contract over it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives.registry import register_transport
from collectives.transport import Pending, Transport

#: The one tag every message travels on.
TAG = 77
_REDUCE = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _bytes(a: Any) -> np.ndarray:
    return np.asarray(a).reshape(-1).view(np.uint8)


class _Pending(Pending):
    def __init__(self, recvs: list[Any], sends: list[Any]) -> None:
        self.recvs, self.sends = recvs, sends

    def wait_recv(self) -> None:
        for r in self.recvs:
            r.Wait()

    def wait(self) -> None:
        self.wait_recv()
        for s in self.sends:
            s.Wait()

    def test(self, recv_only: bool = False) -> bool:
        reqs = self.recvs if recv_only else self.recvs + self.sends
        return all([r.Test() for r in reqs])


class ToyTransport(Transport):
    name = "toy_transport"
    interleaves = False  # one tag: matched by posting order
    native_chooser = "toy_transport's gather"
    native_impls = False

    def start(self, sends: Sequence[tuple[Any, int, int]],
              recvs: Sequence[tuple[Any, int, int]]) -> Pending:
        rreqs = [self.comm.Irecv(_bytes(a), src, TAG) for a, src, _ in recvs]
        sreqs = [self.comm.Isend(_bytes(a), dst, TAG) for a, dst, _ in sends]
        return _Pending(rreqs, sreqs)

    def native_allreduce(self, buf: Any, op: str) -> None:
        parts = self.comm.allgather(np.array(buf, copy=True))
        buf[...] = functools.reduce(lambda x, y: _REDUCE[op](x, y, dtype=buf.dtype), parts)

    def sub(self, comm: Any) -> Transport:
        return ToyTransport(comm, self.backend)


register_transport("toy_transport", ToyTransport, backends=("numpy",))
