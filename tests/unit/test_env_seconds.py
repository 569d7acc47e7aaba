"""Seconds-valued environment variables (``RINGTUNE_STALL_TIMEOUT``,
``RINGTUNE_EMULATE_WAIT``) share one parser: unset is 0, a bad value is one line naming the
variable and its value."""

from __future__ import annotations

import pytest

from collectives.plumbing.stall import env_seconds
from ringtune.commands.emulate import WAIT_ENV, _wait_seconds
from ringtune.errors import UsageError


@pytest.mark.parametrize("text, want", [("", 0.0), ("  ", 0.0), ("0", 0.0), ("2.5", 2.5),
                                        (" 10 ", 10.0)])
def test_good_values(text: str, want: float) -> None:
    assert env_seconds("RINGTUNE_X", "why", {"RINGTUNE_X": text}) == want
    assert env_seconds("RINGTUNE_X", "why", {}) == 0.0


@pytest.mark.parametrize("text", ["soon", "-1", "inf", "-inf", "nan", "1e999"])
def test_bad_values_name_the_variable(text: str) -> None:
    with pytest.raises(ValueError) as err:
        env_seconds("RINGTUNE_X", "what it is for", {"RINGTUNE_X": text})
    msg = str(err.value)
    assert msg.startswith(f"RINGTUNE_X={text!r}: expected a number of seconds >= 0")
    assert "what it is for" in msg and "\n" not in msg


def test_emulate_wait_flag_wins_and_env_errors_are_usage_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(WAIT_ENV, "later")
    assert _wait_seconds(3.0) == 3.0  # --wait wins: the variable is not read
    with pytest.raises(UsageError, match=f"{WAIT_ENV}='later'"):
        _wait_seconds(None)
    with pytest.raises(UsageError, match="--wait -1"):
        _wait_seconds(-1.0)
    monkeypatch.setenv(WAIT_ENV, "7")
    assert _wait_seconds(None) == 7.0
    assert _wait_seconds(float("inf")) == float("inf")  # --wait alone: no limit
