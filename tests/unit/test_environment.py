"""The table of ``RINGTUNE_*`` variables (probes/environment.py) is the one truth: the
docs page is generated from it, every variable the code reads is in it, the modules' own
parsers accept what it accepts, and it is checked before any verb or ``Communicator`` acts
(issue 35: ``RINGTUNE_TIMING_CHECK=bogus`` passed until the end of a tune)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collectives.cuda.detect import parse_cuda_aware_env
from collectives.online import resolve_mode, resolve_options
from collectives.plumbing.abort import ON_ERROR_MODES
from collectives.plumbing.logs import LOG_LEVELS
from probes.environment import (
    BEGIN,
    END,
    FLAG_OFF,
    FLAG_ON,
    PAGE,
    TABLE,
    VARIABLES,
    EnvValueError,
    check_environment,
    check_value,
    markdown_rows,
    render_page,
)
from tests.unit.test_docs import product_env_reads

ROOT = Path(__file__).resolve().parents[2]


def test_docs_table_is_generated_from_the_table() -> None:
    page = (ROOT / PAGE).read_text(encoding="utf-8")
    assert BEGIN in page and END in page, "docs/environment.md lost its generated block"
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert block == markdown_rows(), (
        "docs/environment.md's table of RINGTUNE_* variables is stale: run `make docs` "
        "(python -m probes.environment --write)")
    assert render_page(page) == page


def test_every_ringtune_variable_the_code_reads_is_in_the_table() -> None:
    reads = {n: w for n, w in product_env_reads().items() if n.startswith("RINGTUNE_")}
    missing = {n: w for n, w in reads.items() if n not in TABLE}
    assert not missing, ("RINGTUNE_* variables read by the code but not declared in "
                         "probes/environment.py's VARIABLES (add a row): "
                         + ", ".join(f"{n} ({w})" for n, w in sorted(missing.items())))
    unread = sorted(set(TABLE) - set(reads))
    assert not unread, f"rows of probes/environment.py that no code reads: {unread}"


def test_rows_are_complete() -> None:
    for v in VARIABLES:
        assert "|" not in v.meaning + v.default + v.accepts(markdown=True), v.name
        assert v.meaning and v.default and "\n" not in v.meaning, v.name
        assert v.kind in ("flag", "choice", "int", "float", "seconds", "file", "out",
                          "modules", "command", "pid", "text"), v.name
        assert (v.kind == "choice") == bool(v.choices), v.name
        if v.kind in ("int", "float", "seconds"):
            assert v.lo is not None and v.hi is not None, v.name


def test_choices_are_what_the_modules_accept() -> None:
    assert TABLE["RINGTUNE_LOG"].choices == LOG_LEVELS
    assert TABLE["RINGTUNE_ON_ERROR"].choices == ON_ERROR_MODES
    for value in TABLE["RINGTUNE_TUNE"].choices:
        resolve_mode(None, {"RINGTUNE_TUNE": value})
    for value in FLAG_ON + FLAG_OFF:
        assert parse_cuda_aware_env(value) is (value in FLAG_ON)


def test_lines_start_as_the_modules_own_do() -> None:
    """A value refused early reads as the module that uses it would say it (tests of
    those modules match these words)."""
    for env, start in [({"RINGTUNE_TUNE": "onlien"}, "RINGTUNE_TUNE='onlien': unknown tuning "
                        "mode"),
                       ({"RINGTUNE_LOG": "loud"}, "RINGTUNE_LOG='loud': unknown log level"),
                       ({"RINGTUNE_TUNE_CALLS": "many"}, "RINGTUNE_TUNE_CALLS='many': expected "
                        "an integer")]:
        with pytest.raises(EnvValueError) as info:
            check_environment(env)
        assert str(info.value).startswith(start), str(info.value)


def test_online_bounds_are_what_online_tuning_accepts() -> None:
    """Each RINGTUNE_TUNE_* row's range, tried on ``resolve_options``: its ends accepted,
    just beyond them refused by both."""
    rows = [v for v in VARIABLES if v.name.startswith("RINGTUNE_TUNE_") and v.kind != "out"]
    assert len(rows) == 9
    for v in rows:
        assert v.lo is not None and v.hi is not None
        step = 1 if v.kind == "int" else 1e-3 * max(1.0, abs(v.hi))
        for value in (v.lo, v.hi):
            text = str(int(value)) if v.kind == "int" else repr(float(value))
            resolve_options(None, {v.name: text})
            check_value(v, text)
        for value in (v.lo - step, v.hi + step):
            text = str(int(value)) if v.kind == "int" else repr(float(value))
            with pytest.raises(ValueError):
                resolve_options(None, {v.name: text})
            with pytest.raises(EnvValueError):
                check_value(v, text)


def test_empty_means_unset_and_good_values_pass(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    profile.write_text("x: 1\n")
    good = {"RINGTUNE_PROFILE": str(profile), "RINGTUNE_STRICT": "yes",
            "RINGTUNE_LOG": "INFO", "RINGTUNE_STALL_TIMEOUT": "2.5",
            "RINGTUNE_PLUGINS": "tests.sleep_algorithm, pkg.mod",
            "RINGTUNE_MPIEXEC": "true", "RINGTUNE_TUNE_OUT": str(tmp_path / "t.yaml"),
            "RINGTUNE_TIMING_CHECK": " warn ", "RINGTUNE_LAUNCHED": "1234",
            "RINGTUNE_MAX_RANKS": "64"}
    got = check_environment(good)
    assert got["RINGTUNE_STRICT"] is True and got["RINGTUNE_LOG"] == "info"
    assert got["RINGTUNE_STALL_TIMEOUT"] == 2.5 and got["RINGTUNE_MAX_RANKS"] == 64
    assert got["RINGTUNE_PLUGINS"] == ["tests.sleep_algorithm", "pkg.mod"]
    assert got["RINGTUNE_TIMING_CHECK"] == "warn"
    assert check_environment({v.name: "" for v in VARIABLES}) == {
        v.name: None for v in VARIABLES}
    assert not (tmp_path / "t.yaml").exists()  # checking an output creates nothing


@pytest.mark.parametrize("name, value, needle", [
    ("RINGTUNE_TIMING_CHECK", "bogus", "expected one of stop, warn"),
    ("RINGTUNE_TUNE_SHARE", "inf", "not a finite number"),
    ("RINGTUNE_TUNE_CALLS", "1e400", "expected an integer in 1..1000000"),
    ("RINGTUNE_STALL_TIMEOUT", "nan", "not a finite number"),
    ("RINGTUNE_STALL_TIMEOUT", "-1", "out of range"),
    ("RINGTUNE_STRICT", "maybe", "expected 1/true/yes/on or 0/false/no/off"),
    ("RINGTUNE_PROFILE", "/no/such/profile.yaml", "cannot read it"),
    ("RINGTUNE_TOPOLOGY", "/", "not a regular file"),
    ("RINGTUNE_TUNE_OUT", "/", "is a directory"),
    ("RINGTUNE_PLUGINS", "a b", "not a module name"),
    ("RINGTUNE_MPIEXEC", "/no/such/mpiexec", "not an executable"),
    ("RINGTUNE_MAX_RANKS", "0", "out of range"),
    ("RINGTUNE_LAUNCHED", "me", "not a process id"),
])
def test_bad_values_are_one_line_naming_the_variable(name: str, value: str,
                                                     needle: str) -> None:
    with pytest.raises(EnvValueError) as info:
        check_environment({name: value})
    line = str(info.value)
    assert line.startswith(f"{name}="), line
    assert needle in line and "\n" not in line, line


def test_communicator_checks_the_environment_before_anything(monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Before it looks at ``comm`` at all: a bad value fails the same on every rank, before
    any message."""
    from collectives import Communicator

    monkeypatch.setenv("RINGTUNE_TIMING_CHECK", "bogus")
    with pytest.raises(EnvValueError, match="RINGTUNE_TIMING_CHECK='bogus'"):
        Communicator(object())
