"""The A/B choice after the search keeps a non-native configuration only when it really
beats native: by ``--margin`` in the interleaved rounds, by more than native's own noise,
and again in every round of a side-by-side confirmation. Timings here are deterministic
fakes (a scripted time per configuration and call), so each test knows what the old
choice (median over the A/B rounds, margin only) would have been and checks that the new
one differs where it must."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from autotune import choose, replay
from autotune.records import BucketSummary, TuneOptions
from collectives import bench
from collectives.plan import Config

RING = Config("multiring", {"rings": 2, "chunk_bytes": 0, "order": "topology"})
NBYTES = 1 << 20


class FakeRuntime:
    """What ``ab_choice`` uses of a ``Communicator``: its size and ``clear_plans``."""

    size = 4

    def clear_plans(self) -> None:
        pass


class Script:
    """Scripted timings: ``times[algorithm](k)`` is the k-th timing (from 0) of that
    algorithm in this A/B; every call is logged as ``(algorithm, iters)``."""

    def __init__(self, times: dict[str, Callable[[int], float]]) -> None:
        self.times = times
        self.calls: list[str] = []
        self.counts: dict[str, int] = {}

    def time_allreduce(self, comm: Any, count: int, dtype: str, op: str,
                       algorithm: str | None, params: Any, warmup: int, iters: int,
                       transport: Any = None, backend: str = "numpy") -> Any:
        assert algorithm is not None
        k = self.counts.get(algorithm, 0)
        self.counts[algorithm] = k + 1
        self.calls.append(algorithm)

        class M:
            time_us = self.times[algorithm](k)
        return M()


def _choose(monkeypatch: pytest.MonkeyPatch, times: dict[str, Callable[[int], float]],
            top: Sequence[tuple[Config, float]] = ((RING, 50.0),),
            margin: float = 0.03) -> tuple[Any, Script]:
    script = Script(times)
    monkeypatch.setattr(choose, "time_allreduce", script.time_allreduce)
    monkeypatch.setattr(bench, "check_allreduce", lambda *a, **k: pytest.fail(
        "no neighbour here: nothing to check"))
    opts = TuneOptions(out="p.yaml", buckets=[NBYTES], algorithms=["native", "multiring"],
                       margin=margin)
    summary = BucketSummary(NBYTES, "s", "trials", 5, list(top), {}, None, None, 0.0)
    return choose.ab_choice(FakeRuntime(), opts, [summary], 0), script  # type: ignore[arg-type]


def _old_choice(native: Sequence[float], cand: Sequence[float], margin: float) -> str:
    """What the A/B chose before the confirmation: the median over its rounds, margin only."""
    n, c = sorted(native)[len(native) // 2], sorted(cand)[len(cand) // 2]
    return "multiring" if c * (1 + margin) <= n else "native"


def test_a_clear_winner_is_kept_after_a_side_by_side_confirmation(
        monkeypatch: pytest.MonkeyPatch) -> None:
    choice, script = _choose(monkeypatch, {"native": lambda k: 100.0,
                                           "multiring": lambda k: 60.0})
    assert choice.config == RING and choice.note == ""
    # The sample, 3 interleaved rounds, then 3 confirmation rounds in alternating order.
    timed = script.calls[1:]
    assert timed[:6] == ["native", "multiring"] * 3
    assert timed[6:] == ["native", "multiring", "multiring", "native", "native", "multiring"]
    assert choice.speedup == pytest.approx(100 / 60)


def test_a_winner_that_loses_a_confirmation_round_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # In the A/B rounds multiring looks 10% faster; side by side afterwards it loses one
    # round of three (the machine's load moved, or the first rounds were lucky).
    native = [100.0] * 7
    ring = [90.0, 90.0, 90.0, 90.0, 104.0, 90.0]
    assert _old_choice(native[1:4], ring[:3], 0.03) == "multiring"
    choice, _ = _choose(monkeypatch, {"native": lambda k: native[k],
                                      "multiring": lambda k: ring[k]})
    assert choice.config == Config("native")
    assert "confirmation round(s) 2 of 3" in choice.note
    # The record says what native and the candidate measured over all rounds.
    assert dict((c.algorithm, t) for c, t in choice.candidates) == {
        "native": 100.0, "multiring": 90.0}


def test_a_win_smaller_than_natives_own_noise_is_not_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # multiring beats native in every round and by 9% over the medians, but native's own
    # timings spread +-20% over the rounds: a 9% lead is what chance gives.
    native = [100.0, 80.0, 100.0, 120.0, 100.0, 80.0, 120.0]
    ring = [92.0, 92.0, 92.0, 90.0, 72.0, 110.0]
    assert _old_choice(native[1:4], ring[:3], 0.03) == "multiring"
    choice, _ = _choose(monkeypatch, {"native": lambda k: native[k],
                                      "multiring": lambda k: ring[k]})
    assert choice.config == Config("native")
    assert "measurement noise" in choice.note


def test_no_confirmation_when_native_wins_the_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    choice, script = _choose(monkeypatch, {"native": lambda k: 100.0,
                                           "multiring": lambda k: 99.0})
    assert choice.config == Config("native") and "--margin" in choice.note
    assert len(script.calls) == 1 + 2 * choose.AB_ROUNDS  # sample + rounds, nothing more


@pytest.mark.parametrize("pairs, native, winner, margin, kept", [
    ([(100, 50)] * 3, [100] * 6, [50] * 6, 0.03, True),
    ([(100, 50), (100, 99), (100, 50)], [100] * 6, [50] * 6, 0.03, False),  # 1% < margin
    ([(100, 90)] * 3, [100, 100, 100, 130, 100, 70], [90] * 6, 0.03, False),  # noise 30%
    ([(100, 90)] * 3, [100, 100, 100, 104, 100, 96], [90] * 6, 0.03, True),  # noise 4%
])
def test_confirm_rule(pairs: list[tuple[float, float]], native: list[float],
                      winner: list[float], margin: float, kept: bool) -> None:
    assert (choose.confirm(native, winner, pairs, margin) == "") is kept


def test_choices_recorded_before_the_confirmation_are_measured_again() -> None:
    opts = TuneOptions(out="p.yaml", buckets=[NBYTES], algorithms=["native", "multiring"])
    summary = BucketSummary(NBYTES, "s", "trials", 5, [(RING, 50.0)], {}, None, None, 0.0)
    inputs = replay.choice_inputs(opts, [summary], 0, 4)
    assert inputs["confirm_rounds"] == choose.CONFIRM_ROUNDS
    before = {k: v for k, v in inputs.items() if k != "confirm_rounds"}
    record = {"inputs": before, "choice": {}}
    assert replay.reuse(record, inputs) is None
