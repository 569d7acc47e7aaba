"""The benchmark harness times every candidate the same way: one prepared plan, then
``Communicator.run_prepared`` per call — ``native`` included — under either timing method
(per-iteration slowest-rank median, or nccl-tests' back-to-back total / iterations)."""

from __future__ import annotations

from typing import Any

import pytest
from mpi4py import MPI

from collectives import Communicator
from collectives.bench import TIMINGS, run_bench, time_allreduce

WORLD = MPI.COMM_WORLD


@pytest.mark.parametrize("timing", sorted(TIMINGS))
@pytest.mark.parametrize("algorithm,params", [
    ("native", {}), ("multiring", {"rings": 2, "chunk_bytes": 4096}), ("rhd", {}), (None, {})])
def test_every_candidate_takes_the_prepared_path(monkeypatch: pytest.MonkeyPatch,
                                                 timing: str, algorithm: str | None,
                                                 params: dict[str, Any]) -> None:
    comm = Communicator(WORLD)
    calls = {"run_prepared": 0, "allreduce": 0}
    real_run, real_allreduce = comm.run_prepared, comm.allreduce

    def run_prepared(prepared: Any, flat: Any) -> None:
        calls["run_prepared"] += 1
        real_run(prepared, flat)

    def allreduce(*a: Any, **k: Any) -> Any:
        calls["allreduce"] += 1
        return real_allreduce(*a, **k)

    monkeypatch.setattr(comm, "run_prepared", run_prepared)
    monkeypatch.setattr(comm, "allreduce", allreduce)
    m = time_allreduce(comm, 1000, "float32", "sum", algorithm, params, warmup=2, iters=5,
                       timing=timing)
    assert calls == {"run_prepared": 7, "allreduce": 0}
    assert m.timing == timing and m.time_us > 0 and m.busbw_gbps >= 0
    assert len(m.samples_us) == (5 if timing == "per-iter" else 1)
    # Every rank reports the same figure (a reduction over ranks).
    assert WORLD.allgather(m.time_us) == [m.time_us] * WORLD.Get_size()
    comm.close()


def test_run_bench_carries_the_timing_and_checks_it() -> None:
    comm = Communicator(WORLD)
    rows = run_bench(comm, [64, 4096], algorithm="rhd", warmup=0, iters=2,
                     timing="back-to-back")
    assert [r.timing for r in rows] == ["back-to-back"] * 2 and all(r.wrong == 0 for r in rows)
    with pytest.raises(ValueError, match="timing 'mean': use one of per-iter, back-to-back"):
        time_allreduce(comm, 16, timing="mean")
    comm.close()
