"""What the ranks run in tests/emulated (``python tests/emulated/worker.py WHAT …`` as the
command of ``ringtune emulate``); rank 0 prints one JSON line, the tests read it.

- ``rings ORDER:RINGS …``: the ring successors multiring builds, and each rank's host;
- ``fingerprint``: this world's topology fingerprint and host layout;
- ``profile PATH``: load a profile; whether it was used, the warnings, the error if strict;
- ``pids DIR``: write this rank's process id to DIR and sleep (teardown tests);
- ``allreduce N R [ALGO]``: R float32 allreduces of N elements, checked (fault tests).
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import numpy as np
from mpi4py import MPI

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def out(obj: object) -> None:
    if RANK == 0:
        print(json.dumps(obj), flush=True)


def rings(specs: list[str]) -> None:
    """For each ``ORDER:RINGS`` spec, every rank's ring successors as multiring builds them
    (and a checked allreduce with that plan)."""
    from collectives import Communicator

    comm = Communicator(WORLD)
    result: dict[str, object] = {"hosts": WORLD.allgather(MPI.Get_processor_name())}
    for spec in specs:
        order, count = spec.split(":")
        buf = np.ones(1 << 12, dtype=np.float32)
        prep = comm.prepared(buf, algorithm="multiring", rings=int(count), order=order)
        succ = [r.nxt for r in prep.algo.schedule.rings]
        comm.allreduce(buf, algorithm="multiring", rings=int(count), order=order)
        result[spec] = {"next": WORLD.allgather(succ),
                        "ok": all(WORLD.allgather(bool(np.all(buf == WORLD.Get_size()))))}
    comm.close()
    out(result)


def fingerprint() -> None:
    import probes

    topo = probes.detect(WORLD)
    out({"fingerprint": topo.fingerprint(), "summary": topo.summary(),
         "hostnames": WORLD.allgather(MPI.Get_processor_name())})


def profile(path: str) -> None:
    from collectives import Communicator

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = Communicator(WORLD, profile=path)
    used = not comm.profile.builtin
    comm.close()
    strict = "no error"
    try:
        Communicator(WORLD, profile=path, strict=True).close()
    except Exception as exc:  # noqa: BLE001 - the test reads the class name
        strict = f"{type(exc).__name__}: {exc}"
    out({"used": used, "strict": strict,
         "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]})


def pids(folder: str) -> None:
    with open(os.path.join(folder, f"pid.{RANK}"), "w", encoding="utf-8") as f:
        f.write(f"{os.getpid()} {os.getppid()}\n")
    WORLD.Barrier()
    out({"ready": True})
    time.sleep(120)


def allreduce(count: int, repeat: int, algorithm: str | None) -> None:
    from collectives import Communicator

    comm = Communicator(WORLD)
    buf = np.empty(count, dtype=np.float32)
    for i in range(repeat):
        buf[:] = RANK + 1
        comm.allreduce(buf, algorithm=algorithm)  # None: the built-in rule for this size
        n = WORLD.Get_size()
        if not np.all(buf == n * (n + 1) / 2):
            raise SystemExit(f"rank {RANK}: wrong result in round {i}")
        if RANK == 0:
            print(f"round {i} done", flush=True)
    comm.close()
    out({"ok": True})


if __name__ == "__main__":
    what, rest = sys.argv[1], sys.argv[2:]
    if what == "rings":
        rings(rest)
    elif what == "fingerprint":
        fingerprint()
    elif what == "profile":
        profile(rest[0])
    elif what == "pids":
        pids(rest[0])
    elif what == "allreduce":
        allreduce(int(rest[0]), int(rest[1]), rest[2] if len(rest) > 2 else None)
    else:
        raise SystemExit(f"worker: unknown {what!r}")
