"""A flag a verb does not have is answered by that verb, naming the flag, the verb's closest
flag and its usage, in one line (exit 2): not argparse's top-level ``unrecognized arguments
… (see `ringtune --help`)``, which names neither the verb nor what was meant."""

from __future__ import annotations

import argparse

import pytest

from ringtune.cli import build_parser, main


@pytest.mark.parametrize("argv,meant", [
    (["tune", "--budjet", "10"], "--budget"),
    (["tune", "--trails=3"], "--trials"),
    (["tune", "--no_progress"], "--no-progress"),
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


#: nccl-tests' names (short, long) of the ideas several verbs take.
VOCABULARY = [("-b", "--minbytes"), ("-e", "--maxbytes"), ("-f", "--stepfactor"),
              ("-d", "--datatype"), ("-o", "--op"), ("-n", "--iters"),
              ("-w", "--warmup_iters"), ("-c", "--check"), (None, "--algo"), ("-np", None)]
#: Spellings of those ideas a verb used before: kept, as aliases only.
FORMER = {"--min-bytes", "--max-bytes", "--dtype", "--algorithms", "--repetitions"}


def _verbs() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no verbs")


def test_one_spelling_per_idea_on_every_verb() -> None:
    from ringtune.flags import aliases_of

    verbs = _verbs()
    for name in ("tune", "bench", "simulate", "probe"):
        for action in verbs[name]._actions:
            opts = set(action.option_strings)
            for short, long in VOCABULARY:
                if (short in opts or long in opts) and short and long:
                    assert {short, long} <= opts, (name, action.option_strings)
            assert not (opts & FORMER) - set(aliases_of(action)), (name, opts)
    for name in ("tune", "bench", "probe"):  # the verbs that launch themselves
        assert "-np" in verbs[name]._option_string_actions, name
    assert "-n" in verbs["probe"]._option_string_actions


@pytest.mark.parametrize("new,old", [
    (["tune", "-b", "4K", "-e", "1M", "-d", "float64", "-o", "max", "--algo", "rhd",
      "--algo", "native"],
     ["tune", "--min-bytes", "4K", "--max-bytes", "1M", "--dtype", "float64", "--op", "max",
      "--algorithms", "rhd,native"]),
    (["probe", "-n", "3"], ["probe", "--repetitions", "3"]),
])
def test_a_former_spelling_means_the_same(new: list[str], old: list[str]) -> None:
    from ringtune.flags import algo_list

    a, b = build_parser().parse_args(new), build_parser().parse_args(old)
    for ns in (a, b):
        if hasattr(ns, "algorithms"):
            ns.algorithms = algo_list(ns.algorithms)
    assert vars(a) == vars(b)


def test_a_former_spelling_is_shown_as_an_alias_in_help() -> None:
    text = _verbs()["tune"].format_help()
    assert "(alias: --min-bytes, the former spelling)" in " ".join(text.split()), text


@pytest.mark.parametrize("verb", [["tune"], ["emulate", "--cluster", "c.yaml"]])
def test_wait_is_one_flag_with_one_meaning_on_every_verb(verb: list[str]) -> None:
    """``--wait [SECONDS]``: ``tune --wait`` (once an on/off switch) and ``emulate --wait
    SECONDS`` (once seconds only) are two spellings of it, both still accepted: given alone
    it waits without a limit, with SECONDS up to SECONDS; not given, the verb's default."""
    import math

    tail = ["--", "true"] if verb[0] == "emulate" else []
    parse = build_parser().parse_args
    assert parse([*verb, *tail]).wait is None
    assert parse([*verb, "--wait", *tail]).wait == math.inf  # tune's former switch
    assert parse([*verb, "--wait", "30", *tail]).wait == 30.0  # emulate's former seconds
    assert parse([*verb, "--wait=0.5", *tail]).wait == 0.5
    if tail:  # the command after -- is still the command
        assert parse([*verb, "--wait", *tail]).command == tail
    action = _verbs()[verb[0]]._option_string_actions["--wait"]
    assert (action.nargs, action.metavar) == ("?", "SECONDS")
    assert "--wait alone waits without a limit" in " ".join(str(action.help).split())


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_wait_refuses_what_is_not_seconds(capsys: pytest.CaptureFixture[str],
                                          value: str) -> None:
    for verb in (["tune"], ["emulate", "--cluster", "c.yaml"]):
        assert main([*verb, "--wait", value]) == 2
        assert "argument --wait: expected seconds >= 0" in capsys.readouterr().err
