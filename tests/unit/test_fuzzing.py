"""``tests/fuzzing.py``: the default sample is a fixed, seeded part of a fuzz set,
``RINGTUNE_FUZZ=full`` is all of it, and a bad setting is one clear error."""

from __future__ import annotations

import pytest

from tests import fuzzing


def test_the_default_sample_is_the_same_every_time_and_a_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fuzzing.FUZZ_ENV, raising=False)
    monkeypatch.delenv(fuzzing.SEED_ENV, raising=False)
    items = list(range(2000))
    first = list(fuzzing.sample(items, "profile"))
    assert first == list(fuzzing.sample(items, "profile"))
    assert 0.15 * len(items) < len(first) < 0.25 * len(items)  # SAMPLE_PERCENT = 20
    # Each set draws its own: another name, or another seed, gives another sample.
    assert first != list(fuzzing.sample(items, "topology"))
    monkeypatch.setenv(fuzzing.SEED_ENV, "7")
    assert first != list(fuzzing.sample(items, "profile"))
    assert "RINGTUNE_FUZZ_SEED=7" in fuzzing.describe()


def test_full_keeps_every_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fuzzing.FUZZ_ENV, " Full ")
    assert list(fuzzing.sample(range(50), "x")) == list(range(50))
    assert fuzzing.describe().startswith("RINGTUNE_FUZZ=full")


@pytest.mark.parametrize("name, value, message", [
    (fuzzing.FUZZ_ENV, "most", "RINGTUNE_FUZZ='most': use one of sample, full"),
    (fuzzing.SEED_ENV, "x1", "RINGTUNE_FUZZ_SEED='x1': expected an integer")])
def test_a_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch, name: str, value: str,
                                message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        list(fuzzing.sample(range(3), "x"))
