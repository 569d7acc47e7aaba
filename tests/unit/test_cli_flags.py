"""A flag a verb does not have is answered by that verb, naming the flag, the verb's closest
flag and its usage, in one line (exit 2): not argparse's top-level ``unrecognized arguments
… (see `ringtune --help`)``, which names neither the verb nor what was meant."""

from __future__ import annotations

import pytest

from ringtune.cli import main


@pytest.mark.parametrize("argv,meant", [
    (["tune", "--budjet", "10"], "--budget"),
    (["tune", "--trails=3"], "--trials"),
    (["tune", "-budget", "3"], "--budget"),
    (["tune", "--np", "2"], "-np"),
    (["bench", "--algorithms", "rhd"], "--algo"),
    (["simulate", "--cluster", "c.yaml", "--algos", "rhd"], "--algo"),
    (["probe", "--mesure"], "--measure"),
])
def test_a_mistyped_flag_names_the_verb_and_the_closest_flag(
        capsys: pytest.CaptureFixture[str], argv: list[str], meant: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    flag = argv[-2] if not argv[-1].startswith("-") else argv[-1]
    flag = flag.split("=")[0]
    assert err[0] == (f"ringtune: error: `ringtune {argv[0]}` has no flag {flag}: did you "
                      f"mean {meant}? (usage: `ringtune {argv[0]} --help`)"), err


def test_a_flag_like_nothing_the_verb_has_still_names_the_verb(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--zzzz"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("ringtune: error: `ringtune tune` has no flag --zzzz (usage: `ringtune "
                   "tune --help`)"), err


def test_a_stray_value_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "a.yaml", "b.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "`ringtune show` takes no argument 'b.yaml'" in err, err
