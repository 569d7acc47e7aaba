"""Run under Intel MPI's mpiexec: the bits of one float32 sum (they depend on the order of
the reduction, so on the algorithm), first as the job started, then after writing
``MPIR_CVAR_USE_ALLREDUCE`` (``I_MPI_ADJUST_ALLREDUCE``'s MPI_T variable) to each id given,
on COMM_WORLD and on a communicator ``Dup``-ed after the write. Rank 0 prints one JSON line:
{"start": digest, "written": {id: [world digest, dup digest]}}."""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
lib = ctypes.CDLL(str(MPI.__file__))
c_int, vp = ctypes.c_int, ctypes.c_void_p
lib.MPI_T_cvar_handle_alloc.argtypes = [c_int, vp, ctypes.POINTER(vp), ctypes.POINTER(c_int)]
lib.MPI_T_cvar_write.argtypes = [vp, vp]
provided, index, count, handle = c_int(), c_int(), c_int(), vp()
assert lib.MPI_T_init_thread(0, ctypes.byref(provided)) == 0
assert lib.MPI_T_cvar_get_index(b"MPIR_CVAR_USE_ALLREDUCE", ctypes.byref(index)) == 0
assert lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) == 0

rng = np.random.default_rng(comm.rank)
# Magnitudes 1e-6..1e6: float32 sums of these differ in their last bits by summation order.
x = (rng.standard_normal(1 << 16) * 10.0 ** rng.integers(-6, 6, 1 << 16)).astype(np.float32)


def digest(c: MPI.Comm) -> str:
    out = np.empty_like(x)
    c.Allreduce(x, out, op=MPI.SUM)
    return hashlib.sha1(out.tobytes()).hexdigest()[:12]


result: dict[str, object] = {"start": digest(comm), "written": {}}
for algorithm in map(int, sys.argv[1:]):
    value = c_int(algorithm)
    assert lib.MPI_T_cvar_write(handle, ctypes.byref(value)) == 0
    dup = comm.Dup()
    result["written"][str(algorithm)] = [digest(comm), digest(dup)]  # type: ignore[index]
    dup.Free()
if comm.rank == 0:
    print(json.dumps(result), flush=True)
