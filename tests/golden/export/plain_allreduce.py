"""A plain mpi4py program (no ringtune import): MPI_Allreduce of float32 inputs with a wide
spread of exponents at the sizes given on the command line; rank 0 prints one line per size,
``SIZE SHA256`` of the result. MPICH's algorithms add in different orders, so the digest
says which algorithm ran (at 3 ranks and more)."""

import hashlib
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
for arg in sys.argv[1:]:
    nbytes = int(arg)
    rng = np.random.default_rng(comm.rank + 1)
    count = nbytes // 4
    buf = (rng.standard_normal(count) * 10.0 ** rng.integers(-4, 4, count)).astype(np.float32)
    comm.Allreduce(MPI.IN_PLACE, buf)
    if comm.rank == 0:
        print(nbytes, hashlib.sha256(buf.tobytes()).hexdigest())
