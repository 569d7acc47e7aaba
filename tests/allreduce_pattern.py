"""One ``MPI_Allreduce`` of float64 with a logging (user-defined, commutative) sum, for the
tests that prove which algorithm a library ran (``tests/unit/test_export_openmpi.py``).

Run as ``mpiexec -n N python tests/allreduce_pattern.py COUNT``; rank 0 prints one JSON
line: ``{"calls": [[sizes of rank 0's reduction calls], …], "ok": bool}``: every algorithm
leaves its own pattern (ring: pieces of about COUNT/N, recursive doubling: the whole buffer,
Rabenseifner: halves, basic linear: the whole buffer on the root only). A failing call
prints ``{"error": "…"}`` and exits 3. No ringtune import: this is a plain job.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from mpi4py import MPI


def main() -> int:
    count = int(sys.argv[1])
    world = MPI.COMM_WORLD
    calls: list[int] = []

    def logged_sum(inbuf: object, inoutbuf: object, datatype: object) -> None:
        a = np.frombuffer(inbuf, dtype=np.float64)  # type: ignore[call-overload]
        b = np.frombuffer(inoutbuf, dtype=np.float64)  # type: ignore[call-overload]
        calls.append(int(a.size))
        b += a

    op = MPI.Op.Create(logged_sum, commute=True)
    buf = np.full(count, world.Get_rank() + 1.0)
    try:
        world.Allreduce(MPI.IN_PLACE, buf, op=op)
    except MPI.Exception as exc:
        print(json.dumps({"error": exc.Get_error_string()}), flush=True)
        return 3
    n = world.Get_size()
    ok = bool((buf == n * (n + 1) / 2).all())
    everyone = world.gather(calls)
    if world.Get_rank() == 0:
        print(json.dumps({"calls": everyone, "ok": ok}), flush=True)
    op.Free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
