"""The GPU tuning path end to end on the CPU, at 2 ranks: ``autotune.tuning.tune`` with
``backend="auto"`` where a fake ``available_transports`` gives each rank its own GPU
transports, and where the checks and timings are recorded (then run on host buffers over
``mpi``, since there is no GPU). Checks the plumbing a GPU run depends on: the backend and
the common transports are chosen collectively, every check and timing gets
``backend="cupy"`` and a transport from the common list, ``native`` is measured with the
best common transport, and the profile says ``backend: cupy`` with valid rule transports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from collectives.profile import load_profile

SCRIPT = textwrap.dedent('''
    import json, sys
    from mpi4py import MPI
    import collectives.bench as bench
    import collectives.cuda as cuda
    import autotune.choose, autotune.objective, autotune.tuning
    from autotune.records import TuneOptions

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    used = []

    def fake_available(c=None):
        assert c is comm, "the tuner must use the collective form"
        return ["nccl", "mpi", "staged"] if rank == 0 else ["staged", "mpi"]

    real_check, real_time = bench.check_allreduce, bench.time_allreduce

    def check(cm, count, dtype, op, algorithm, params, transport=None, backend="numpy"):
        used.append(("check", algorithm, sorted(params or {}), transport, backend))
        return real_check(cm, count, dtype, op, algorithm, params)

    def timed(cm, count, dtype, op, algorithm, params, warmup=5, iters=20, transport=None,
              backend="numpy"):
        used.append(("time", algorithm, sorted(params or {}), transport, backend))
        return real_time(cm, count, dtype, op, algorithm, params, warmup=warmup, iters=iters)

    cuda.available_transports = fake_available
    bench.check_allreduce = check
    autotune.objective.check_allreduce = check
    for mod in (bench, autotune.objective, autotune.choose, autotune.tuning):
        mod.time_allreduce = timed
    out, storage = sys.argv[1], sys.argv[2]
    opts = TuneOptions(out=out, buckets=[4096, 1 << 18], trials=6, budget_s=60,
                       storage=storage, backend="auto", progress=False, fresh=True,
                       trial_timeout_s=None)
    result = autotune.tuning.tune(comm, opts)
    everyone = comm.gather(used, root=0)
    if rank == 0:
        with open(out + ".calls.json", "w") as fh:
            json.dump({"calls": everyone, "backend": opts.backend,
                       "transports": opts.transports,
                       "studies": [s.study for s in result.buckets]}, fh)
''')


def test_gpu_tuning_plumbing_at_two_ranks(tmp_path: Any) -> None:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        pytest.skip(f"no mpiexec next to {sys.executable}")
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "gpu.yaml"
    env = {k: v for k, v in os.environ.items() if k != "RINGTUNE_LAUNCHED"
           and not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_"))}
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script), str(out),
                           f"sqlite:///{tmp_path / 'gpu.db'}"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(str(out) + ".calls.json", encoding="utf-8") as fh:
        got = json.load(fh)
    common = ["mpi", "staged"]  # rank 0's order, both ranks have them
    assert got["backend"] == "cupy" and got["transports"] == common
    assert all("-cupy.mpi.staged-" in s for s in got["studies"])
    for rank_calls in got["calls"]:
        assert rank_calls, "every rank checks and times"
        for kind, algorithm, param_names, transport, backend in rank_calls:
            assert backend == "cupy", (kind, algorithm)
            assert transport in common, (kind, algorithm, transport)
            assert "transport" not in param_names  # passed as transport=, not a param
        natives = {t for _, a, _, t, _ in rank_calls if a == "native"}
        assert "mpi" in natives  # the reference runs with the best common transport
    # Both ranks made the same calls in the same order (they stayed in step).
    assert got["calls"][0] == got["calls"][1]
    prof = load_profile(str(out), world_size=2)
    assert prof.backend == "cupy" and prof.transport in common
    assert all(r.transport in (None, *common) for r in prof.rules)
    assert prof.tuning["transports"] == common
