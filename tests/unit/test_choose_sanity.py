"""``autotune.choose.check_against_search``: an A/B re-measurement that disagrees with the
same run's search by more than ``DISAGREEMENT`` times is measured again; a one-off passes
(the new time is used), a persistent one stops the tune with the likely cause."""

from __future__ import annotations

import pytest

from autotune.choose import DISAGREEMENT, check_against_search
from autotune.records import BucketSummary, TuneError
from collectives.plan import Config

NATIVE = Config("native")
RING = Config("multiring", {"rings": 1, "chunk_bytes": 0, "order": "topology"})


def summary() -> BucketSummary:
    return BucketSummary(nbytes=65536, study="s", reason="exhausted", evaluated=4,
                         top=[(RING, 10.0), (NATIVE, 12.0)],
                         best_by_algorithm={"native": (NATIVE, 12.0), "multiring": (RING, 10.0)})


def test_agreeing_times_are_not_measured_again() -> None:
    calls: list[Config] = []
    out = check_against_search(summary(), [NATIVE, RING], [12.0 * DISAGREEMENT * 0.9, 9.0],
                               lambda c: calls.append(c) or 1.0)
    assert out == {} and calls == []


def test_a_one_off_disagreement_is_measured_again_and_replaced() -> None:
    calls: list[Config] = []

    def again(c: Config) -> float:
        calls.append(c)
        return 13.0

    out = check_against_search(summary(), [NATIVE, RING], [16000.0, 10.5], again)
    assert calls == [NATIVE] and out == {0: 13.0}


@pytest.mark.parametrize("first,second", [(16000.0, 15800.0), (0.5, 0.6)])
def test_a_persistent_disagreement_stops_the_tune(first: float, second: float,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RINGTUNE_TIMING_CHECK", raising=False)
    with pytest.raises(TuneError) as info:
        check_against_search(summary(), [NATIVE, RING], [first, 10.0], lambda c: second)
    msg = str(info.value)
    assert "bucket 65536 B: native" in msg and "12.0 us in this run's search" in msg
    assert "unpinned or oversubscribed ranks" in msg and "no profile was written" in msg
    assert not info.value.usage and "\n" not in msg


def test_configurations_the_search_did_not_measure_here_are_not_compared() -> None:
    other = Config("rhd")
    out = check_against_search(summary(), [other], [1e9], lambda c: pytest.fail("timed"))
    assert out == {}


def test_warn_mode_keeps_the_times_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTUNE_TIMING_CHECK", "warn")
    with pytest.warns(RuntimeWarning, match="unpinned or oversubscribed.*=warn: kept"):
        out = check_against_search(summary(), [NATIVE], [16000.0], lambda c: 15000.0)
    assert out == {}
    monkeypatch.setenv("RINGTUNE_TIMING_CHECK", "maybe")
    with pytest.raises(TuneError, match="expected stop or warn") as info:
        check_against_search(summary(), [NATIVE], [16000.0], lambda c: 15000.0)
    assert info.value.usage
