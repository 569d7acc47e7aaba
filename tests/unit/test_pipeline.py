"""Pipelined ``hierarchical`` (``pipeline: P``): the interleaving driver
(``collectives.algorithms.steps``), the parameter's checks, its search space and its cost.

Its results (every dtype/op, odd sizes, fewer elements than pieces, world sizes 1..16) are
the contract's (``collectives/testing/contract.py`` families); here what the contract
cannot see: the driver's order and fallback, and the model's formula written out independently.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from autotune.cluster import load_cluster
from autotune.model import Model
from autotune.space import suggest
from collectives.algorithms import get_algorithm
from collectives.algorithms.hierarchical import PIPELINE_CHOICES
from collectives.algorithms.steps import Steps, interleave, run_blocking
from collectives.testing.results import check_input, mismatches
from collectives.transport import Pending
from tests import inproc

ROOT = __file__.rsplit("/tests/", 1)[0]
H = get_algorithm("hierarchical")


class _Fake(Pending):
    """A batch that is over after ``polls`` tests (or at once on ``wait``); ``pollable``
    False: ``test`` never says so (a transport that cannot poll)."""

    def __init__(self, log: list[str], name: str, polls: int, pollable: bool = True) -> None:
        self.log, self.name, self.left, self.pollable = log, name, polls, pollable
        self.done = False

    def wait(self) -> None:
        if not self.done:
            self.log.append(f"wait {self.name}")
        self.done = True

    def test(self, recv_only: bool = False) -> bool:
        if self.pollable and not self.done:
            self.left -= 1
            self.done = self.left <= 0
        return self.done


def _schedule(log: list[str], k: int, polls: tuple[int, ...], pollable: bool = True) -> Steps:
    log.append(f"start {k}")
    for s, p in enumerate(polls):
        yield _Fake(log, f"{k}.{s}", p, pollable), False
        log.append(f"done {k}.{s}")
        if s == 0:
            yield None  # the gate
    log.append(f"end {k}")


def test_interleave_starts_a_schedule_at_the_gate_and_resumes_whoever_is_ready() -> None:
    log: list[str] = []
    # Schedule 0's second wait is long; schedule 1 finishes meanwhile.
    interleave([_schedule(log, 0, (1, 6)), _schedule(log, 1, (1, 1))])
    assert log.index("start 1") > log.index("done 0.0")  # not before 0's gate
    assert log.index("end 1") < log.index("end 0")  # 1 overtook 0's long wait
    assert [x for x in log if x.startswith("end")] == ["end 1", "end 0"]
    # It blocks (these batches list no MPI requests to Waitany on) only once nothing else
    # can move: after schedule 1 has ended.
    assert [x for x in log if x.startswith("wait")] == ["wait 0.1"]
    assert log.index("wait 0.1") > log.index("end 1")


def test_interleave_waits_on_the_earliest_schedule_when_nothing_can_poll() -> None:
    log: list[str] = []
    interleave([_schedule(log, k, (1, 1), pollable=False) for k in range(3)])
    # Without polling it blocks on the earliest unfinished schedule, in order: the same
    # order on every rank, so no two ranks can wait on each other.
    waits = [x for x in log if x.startswith("wait")]
    assert waits[0] == "wait 0.0"
    assert [x for x in log if x.startswith("end")] == ["end 0", "end 1", "end 2"]
    assert log.count("start 2") == 1


def test_run_blocking_ignores_the_gate() -> None:
    log: list[str] = []
    run_blocking(_schedule(log, 0, (3, 3)))
    assert log == ["start 0", "wait 0.0", "done 0.0", "wait 0.1", "done 0.1", "end 0"]


def test_interleave_of_nothing_and_of_schedules_without_waits() -> None:
    interleave([])
    seen: list[int] = []

    def quiet(k: int) -> Iterator[Any]:
        seen.append(k)
        yield from ()

    interleave([quiet(0), quiet(1), quiet(2)])  # type: ignore[list-item]
    assert seen == [0, 1, 2]


def test_pipeline_parameter_checks() -> None:
    assert "pipeline" not in H.check_params({"dims": [2, 2]}, 4)
    assert "pipeline" not in H.check_params({"dims": [2, 2], "pipeline": 1}, 4)
    assert H.check_params({"dims": [2, 2], "pipeline": 8}, 4)["pipeline"] == 8
    assert H.check_params({"dims": [2, 2], "pipeline": 64, "inner": "rhd"}, 4)["pipeline"] == 64
    for bad in (0, 65, -1, True, 2.0, "4"):
        with pytest.raises(ValueError, match="pipeline: expected an integer 1..64"):
            H.check_params({"dims": [2, 2], "pipeline": bad}, 4)
    # native's collective calls cannot be interleaved: named, with the fix.
    with pytest.raises(ValueError, match="inner 'native' cannot run pipelined"):
        H.check_params({"dims": [2, 2], "pipeline": 2, "inner": ["multiring", "native"]}, 4)
    with pytest.raises(ValueError, match="inner 'native' cannot run pipelined"):
        H.check_params({"pipeline": 2, "inner": "native"}, 4)
    assert H.check_params({"dims": [2, 2], "pipeline": 1, "inner": "native"}, 4)


def test_search_space_pipelines_only_grids_whose_inners_can() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen: set[int] = set()
    for _ in range(200):
        trial = study.ask()
        cfg = suggest(trial, 8, 1 << 24, ["hierarchical"])
        checked = H.check_params(dict(cfg.params), 8)  # every suggestion is valid
        pieces = checked.get("pipeline", 1)
        seen.add(pieces)
        if pieces > 1:
            assert len(checked["dims"]) > 1 and "native" not in checked["inner"]
        study.tell(trial, 1.0)
    assert seen == set(PIPELINE_CHOICES)  # every piece count offered is sampled


def test_pipelined_cost_is_one_piece_through_every_dimension_then_the_slowest() -> None:
    m = Model(load_cluster(f"{ROOT}/profiles/clusters/emulated-2x2.yaml"))
    sizes = np.array([1 << 20, 1 << 24, 1 << 26], float)
    plain = m.time("hierarchical", {"dims": [2, 2]}, sizes)
    assert np.allclose(plain, m.time("hierarchical", {"dims": [2, 2], "pipeline": 1}, sizes))
    mr = get_algorithm("multiring")
    own = {"rings": 1, "chunk_bytes": 0}
    for p in (2, 4, 8):
        piece = sizes / p
        intra = mr.grid_cost(m, 1, 2, piece, own)
        inter = mr.grid_cost(m, 2, 2, piece / 2, own)
        want = intra + inter + (p - 1) * np.maximum(intra, inter)
        got = m.time("hierarchical", {"dims": [2, 2], "pipeline": p}, sizes)
        assert np.allclose(got, want, rtol=1e-12)
    # Across hosts the link is the slow stage: at 64 MiB hiding the host's phases wins.
    assert m.time("hierarchical", {"dims": [2, 2], "pipeline": 4}, sizes)[-1] < plain[-1]


def test_model_space_offers_pipelines_without_native() -> None:
    m = Model(load_cluster(f"{ROOT}/profiles/clusters/emulated-2x2.yaml"))
    sizes = np.array([1 << 26], float)
    found = set()
    for params, t in H.model_space(m, sizes):
        concrete = H.concrete(params, 0)
        pieces = concrete.get("pipeline", 1)
        found.add(pieces)
        if pieces > 1:
            assert "native" not in concrete["inner"]
        # The candidate's time is the model's time of its concrete parameters.
        assert float(t[0]) == pytest.approx(float(m.time("hierarchical", concrete, sizes)[0]),
                                            rel=1e-9)
    assert found == set(PIPELINE_CHOICES)


@pytest.mark.parametrize("pollable", [True, False])
def test_pipelined_grid_runs_where_the_transport_cannot_poll(
        pollable: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process ranks, with and without ``Pending.test`` (the blocking fallback): the
    result is the reference's and the same on every rank."""
    inproc.register()
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    monkeypatch.delenv("RINGTUNE_PROFILE", raising=False)
    if not pollable:
        monkeypatch.setattr(inproc._InprocPending, "test", Pending.test)
    from collectives import Communicator

    def rank(world: Any) -> list[str]:
        c = Communicator(world, topology=inproc.topology(world.Get_size()))
        out: list[str] = []
        try:
            for count in (0, 3, 7, 1001):
                for params in ({"dims": [2, 2], "pipeline": 4, "chunk_bytes": 16},
                               {"dims": [2, 2], "pipeline": 5, "inner": ["rhd", "multiring"]}):
                    buf = check_input(count, "float32", "sum", world.Get_rank())
                    c.allreduce(buf, op="sum", algorithm="hierarchical", transport="inproc",
                                **params)
                    out += mismatches(buf, count, "float32", "sum", 4, f"{params}")
        finally:
            c.close()
        return out

    fails = [line for lines in inproc.run_ranks(4, rank) for line in lines]
    assert not fails, "\n".join(fails[:8])


def test_a_silent_peer_hands_the_poll_to_the_watched_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``RINGTUNE_STALL_TIMEOUT`` the interleaved poll gives up after that long without
    a completed request and blocks in the earliest schedule's own wait, which is where the
    MPI transport's watchdog names the peers and raises: a dead peer never hangs a
    pipelined grid. (Without the timeout the poll would spin on this request forever.)"""
    import time

    from mpi4py import MPI

    from collectives.plumbing.stall import StallError

    monkeypatch.setenv("RINGTUNE_STALL_TIMEOUT", "0.2")
    req = MPI.COMM_SELF.Irecv(bytearray(1), source=0, tag=4242)  # never sent
    handed: list[float] = []

    class Silent(Pending):
        def wait(self) -> None:
            handed.append(time.monotonic())
            raise StallError("the watched wait gave up")

        def test(self, recv_only: bool = False) -> bool:
            return False

        def requests(self, recv_only: bool = False) -> list[Any] | None:
            return [req]

    def schedule() -> Steps:
        yield Silent(), False

    t0 = time.monotonic()
    try:
        with pytest.raises(StallError):
            interleave([schedule()])
    finally:
        req.Cancel()
        req.Wait()
    assert len(handed) == 1 and 0.2 <= handed[0] - t0 < 10, handed
