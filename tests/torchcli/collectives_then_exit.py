"""One rank of a 2-rank gloo job over a FileStore: ``ROUNDS`` rounds of the torch
engine's host collectives (Barrier, allreduce) and of the torch transport's native
allreduce (through a ``Communicator``), a bcast, ``destroy_process_group``, then
the interpreter's own exit, the moment a gloo worker still holding a finished collective's
tensors used to abort the process (tests/torchcli/test_exit_after_collectives.py)::

    python tests/torchcli/collectives_then_exit.py RANK STORE_FILE ROUNDS
"""

from __future__ import annotations

import sys

import numpy as np
import torch.distributed as dist

from collectives import Communicator
from collectives.engines.torch import TorchComm


def main() -> None:
    rank, path, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", store=dist.FileStore(path, 2), rank=rank, world_size=2)
    comm = TorchComm(dist.group.WORLD)
    runtime = Communicator(dist.group.WORLD, profile=None)
    buf = np.ones(16, np.float32)
    for _ in range(rounds):
        comm.Barrier()
        assert comm.allreduce(1.0) == 2.0
        runtime.allreduce(buf, algorithm="native")
    assert buf[0] == 2.0 ** rounds
    assert comm.bcast("from rank 0") == "from rank 0"
    runtime.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
