"""Hostile values for every ``RINGTUNE_*`` variable and every numeric flag of every verb,
through the real CLI entry point in this process: each that cannot be meant is refused with
exit 2 and one stderr line naming it, before anything is launched (issue 35).

The lists come from the code, not from here: the variables from the table
(``probes.environment.VARIABLES``), the flags from the parser (every action whose type
``ringtune.cli.bound_numbers`` made a ``NumberFlag`` or ``SizeFlag``), the verbs from
``ringtune.cli.COMMANDS`` — a variable or flag added tomorrow is fed the same values the
day it is added. Values are drawn per class (empty, garbage, huge, inf/nan, negative,
path-like) with a fixed seed (``RINGTUNE_FUZZ_SEED`` picks another), so a failure
reproduces. Launching (``mpiexec``, a subprocess, MPI itself) raises here: a value that
got that far was not refused in time.
"""

from __future__ import annotations

import argparse
import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import ringtune.launch as launch
from probes.environment import VARIABLES, EnvValueError, Variable, check_value
from ringtune import cli

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "profiles" / "examples" / "cpu-2core-vm-2ranks.yaml"
CLUSTER = ROOT / "profiles" / "clusters" / "dgx-h100-32.yaml"
SEED = int(os.environ.get("RINGTUNE_FUZZ_SEED", "35"))

#: Classes of hostile text for any variable; numeric kinds must refuse all but "empty".
GARBAGE = ["bogus", "yes please", "0x1F", "1,2", "--help", "\u2603", "'; rm -rf /", "1 2"]
HUGE = ["9" * 30, "1e30", "9" * 5000, "2147483648" * 3]
NONFINITE = ["inf", "-inf", "nan", "NaN", "1e400", "-1e400", "infinity", "infK"]
NEGATIVE = ["-1", "-0.5", "-1e9"]


class Launched(BaseException):
    """Raised by every way of starting something: a value that reaches it was accepted."""


@pytest.fixture(autouse=True)
def _nothing_launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    def refuse(*_a: object, **_k: object) -> None:
        raise Launched("launched")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    monkeypatch.setattr(launch.subprocess, "run", refuse)
    monkeypatch.setattr(launch, "relaunch", refuse)
    import collectives.mpi.mpilib

    monkeypatch.setattr(collectives.mpi.mpilib, "load_mpi", refuse)
    for var in [v.name for v in VARIABLES] + ["PMI_RANK", "PMI_SIZE", "PMI_FD", "RANK",
                                              "WORLD_SIZE", "OMPI_COMM_WORLD_RANK"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    yield


def _verb_args(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each verb with the least arguments that parse: every positional and required option
    given an existing file (the check under test comes before any file is read)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out: dict[str, list[str]] = {}
    for verb, p in sub.choices.items():
        args = [verb]
        for a in p._actions:
            if a.option_strings and a.required:
                args += [a.option_strings[-1], str(CLUSTER if "cluster" in a.dest
                                                   else PROFILE)]
            elif not a.option_strings and a.nargs not in (argparse.REMAINDER, "?", "*"):
                args.append(str(PROFILE))
        out[verb] = args
    return out


def _numeric_flags(parser: argparse.ArgumentParser) -> list[tuple[str, str, object]]:
    """(verb, flag, its type) for every bounded numeric flag of every verb."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for verb, p in sub.choices.items():
        for a in p._actions:
            if isinstance(a.type, (cli.NumberFlag, cli.SizeFlag)):
                found.append((verb, a.option_strings[0], a.type))
            else:
                assert a.type not in (int, float), f"{verb} {a.option_strings}: unbounded"
    return found


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        code = cli.main(argv)
    except Launched:  # only reachable if main let it through; never expected
        code = -1
    err = capsys.readouterr().err
    return code, err.strip().splitlines()


def _assert_refused(code: int, lines: list[str], what: str, name: str) -> None:
    assert code == 2, f"{what}: exit {code}, not refused: {lines}"
    assert len(lines) == 1, f"{what}: {len(lines)} lines: {lines}"
    line = lines[0]
    assert line.startswith("ringtune: error: ") and "Traceback" not in line, line
    assert "OverflowError" not in line and "launched" not in line, line
    assert name in line, f"{what}: the line does not name {name}: {line}"


def _path_values(tmp: Path) -> dict[str, str]:
    """Path-like hostile values, made under ``tmp``."""
    tmp.mkdir()
    (tmp / "dir").mkdir()
    os.mkfifo(tmp / "fifo")
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "loop").symlink_to(tmp / "loop2")
    (tmp / "loop2").symlink_to(tmp / "loop")
    return {"directory": str(tmp / "dir"), "fifo": str(tmp / "fifo"),
            "dangling": str(tmp / "dangling"), "loop": str(tmp / "loop"),
            "missing folder": str(tmp / "no" / "such" / "file"), "root": "/",
            "proc": "/proc/self/nope/x", "long": "/" + "a" * 5000}


def _must_refuse(var: Variable, cls: str, value: str) -> bool:
    """Whether ``value`` of class ``cls`` cannot be meant for ``var`` (the test's own
    reading of the kinds, independent of ``check_value``)."""
    if cls == "empty":
        return False
    numeric = var.kind in ("int", "float", "seconds", "pid")
    if var.kind in ("flag", "choice") or numeric:
        if cls == "negative":
            return numeric and (var.lo is None or float(value) < var.lo)
        return True
    if var.kind == "file":
        return cls in ("path", "nonfinite", "huge", "garbage")
    if var.kind == "out":  # a FIFO is written through (with a bounded wait)
        return cls == "path" and not (os.path.exists(value)
                                      and stat.S_ISFIFO(os.stat(value).st_mode))
    if var.kind == "modules":
        return cls in ("path", "nonfinite", "huge", "negative") and not value.isidentifier()
    if var.kind == "command":
        return cls in ("path", "nonfinite", "huge")
    return cls == "path" and value.startswith("/" + "a" * 100)  # text: one line only


def _env_cases(tmp: Path) -> list[tuple[Variable, str, str]]:
    rng = random.Random(SEED)
    paths = _path_values(tmp)
    cases = []
    for var in VARIABLES:
        pool = {"empty": [""], "garbage": rng.sample(GARBAGE, 3), "huge": rng.sample(HUGE, 2),
                "nonfinite": rng.sample(NONFINITE, 3), "negative": rng.sample(NEGATIVE, 1),
                "path": list(paths.values())}
        for cls, values in pool.items():
            cases += [(var, cls, v) for v in values]
    return cases


def test_every_variable_refuses_hostile_values_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    verbs = _verb_args(parser)
    assert set(verbs) == set(cli.COMMANDS)
    rng = random.Random(SEED)
    cases = _env_cases(tmp_path / "paths")
    refused = 0
    for var, cls, value in cases:
        what = f"{var.name}={value[:40]!r} ({cls})"
        try:
            check_value(var, value)
            accepted = True
        except EnvValueError as exc:
            accepted = False
            assert str(exc).startswith(f"{var.name}=") and "\n" not in str(exc), what
        if _must_refuse(var, cls, value):
            assert not accepted, f"{what}: accepted by probes/environment.py's table"
        if accepted:
            continue
        refused += 1
        verb = rng.choice(sorted(verbs))
        monkeypatch.setenv(var.name, value)
        code, lines = _run(verbs[verb], capsys)
        monkeypatch.delenv(var.name)
        _assert_refused(code, lines, f"ringtune {verb} with {what}", var.name)
    assert refused > len(VARIABLES) * 5  # the generator generated
    # Every verb checks at its start: one bad variable, each verb.
    monkeypatch.setenv("RINGTUNE_TIMING_CHECK", "bogus")
    for verb, argv in verbs.items():
        code, lines = _run(argv, capsys)
        _assert_refused(code, lines, f"ringtune {verb}", "RINGTUNE_TIMING_CHECK")


def test_every_numeric_flag_refuses_hostile_values_before_anything(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    verbs = _verb_args(parser)
    flags = _numeric_flags(parser)
    assert {"-b", "-e", "-f", "-n", "-w", "-np", "--trials", "--budget"} <= {f for _, f, _
                                                                                 in flags}
    rng = random.Random(SEED)
    for verb, flag, kind in flags:
        values = rng.sample(NONFINITE, 3) + ["inf", "nan", "1e400"] + rng.sample(HUGE, 2)
        if not (isinstance(kind, cli.NumberFlag) and kind.lo is None):
            values += rng.sample(NEGATIVE, 1)  # else the command's own check refuses it
        else:
            values += ["-1"]
        for value in dict.fromkeys(values):
            argv = [*verbs[verb], flag, value]
            code, lines = _run(argv, capsys)
            _assert_refused(code, lines, " ".join(argv[:1] + argv[-2:]), flag)


def test_a_special_output_in_the_environment_is_accepted_not_replaced(tmp_path: Path) -> None:
    """A FIFO or device as RINGTUNE_TUNE_OUT is written through later: accepted, and
    checking it opens nothing (a FIFO without a reader does not block the check)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    out = next(v for v in VARIABLES if v.kind == "out")
    assert check_value(out, str(fifo)) == str(fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_every_output_flag_refuses_what_cannot_hold_output_before_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--out``/``--json FILE`` of every verb (found in the parser): a directory, a
    dangling link, a link loop, a missing folder are one line before anything runs."""
    parser = cli.build_parser()
    verbs = _verb_args(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    outputs = [(verb, a.option_strings[0]) for verb, p in sub.choices.items()
               for a in p._actions if isinstance(a.type, cli.OutputFlag)]
    assert {("probe", "--out"), ("tune", "--out"), ("export", "--out"), ("bench", "--json"),
            ("simulate", "--json")} <= set(outputs)
    paths = _path_values(tmp_path / "paths")
    for verb, flag in outputs:
        for name in ("directory", "dangling", "loop", "missing folder", "root"):
            argv = [*verbs[verb], flag, paths[name]]
            code, lines = _run(argv, capsys)
            _assert_refused(code, lines, f"{verb} {flag} ({name})", paths[name])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["paths"]  # nothing written


def test_every_algorithm_parameter_refuses_hostile_numbers_before_anything(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``bench --algo A --param K=V`` for every parameter of every registered algorithm
    (its schema): non-finite, huge and negative values are one line naming the parameter,
    before launching."""
    from collectives.algorithms import algorithm_names, get_algorithm

    rng = random.Random(SEED)
    seen = 0
    for name in algorithm_names():
        keys = (get_algorithm(name).params_schema().get("properties") or {}).keys()
        for key in keys:
            for value in ["inf", ".inf", "nan", "1e400", "infK"] + rng.sample(HUGE, 1) + [
                    "-1"]:
                argv = ["bench", "-b", "8", "-e", "8", "--algo", name, "--param",
                        f"{key}={value}"]
                code, lines = _run(argv, capsys)
                _assert_refused(code, lines, f"--param {key}={value} ({name})", key)
                seen += 1
    assert seen > 20
