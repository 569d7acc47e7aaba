"""Every ``ringtune …`` command line the README and docs/ show in a code block parses: a
reader who copies one gets the command run, not ``unrecognized arguments`` (as `probe -np`
and `bench … -c` once did). Parse only, through the CLI's own parser: nothing runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ringtune.cli import COMMANDS, build_parser
from ringtune.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Where a shell command line ends and another program's begins.
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}
FENCE = re.compile(r"^\s*```")


def _code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the fenced code blocks, ``\\`` continuations joined."""
    out: list[tuple[int, str]] = []
    inside, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    return out


def _commands(line: str) -> list[list[str]]:
    """The argument lists of every ``ringtune VERB …`` in a shell line (also one nested in
    ``ringtune emulate … -- ringtune tune …``), up to the first shell operator."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return []
    found = []
    for i, word in enumerate(words):
        is_cli = word == "ringtune" or word.endswith("/ringtune") or (
            word == "ringtune.cli" and i > 0 and words[i - 1] == "-m")
        if is_cli and i + 1 < len(words) and words[i + 1] in COMMANDS:
            args: list[str] = []
            for w in words[i + 1:]:
                if w in OPERATORS:
                    break
                args.append(w)
            found.append(args)
    return found


def _all() -> list[tuple[str, list[str]]]:
    out = []
    for page in PAGES:
        if page.name == "cli.md":
            continue  # generated from the parser itself (test_docs.py holds it to it)
        for number, line in _code_lines(page.read_text(encoding="utf-8")):
            for args in _commands(line):
                out.append((f"{page.relative_to(ROOT)}:{number}", args))
    return out


COMMAND_LINES = _all()


def test_the_pages_show_commands_of_every_kind() -> None:
    """The premise: the scan finds the pages' commands (a broken scan passes anything)."""
    verbs = {args[0] for _, args in COMMAND_LINES}
    assert {"tune", "bench", "probe", "show", "validate", "simulate", "export"} <= verbs, verbs
    assert any(a[:2] == ["probe", "-np"] for _, a in COMMAND_LINES)


@pytest.mark.parametrize("where,args", COMMAND_LINES,
                         ids=[f"{w} {' '.join(a)[:40]}" for w, a in COMMAND_LINES])
def test_a_command_line_of_the_docs_parses(where: str, args: list[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Syntax only: an output path of the reader's cluster (/shared/profiles/…) need not
    # exist here (the CLI looks at output paths while parsing, safefiles.outfile).
    monkeypatch.setattr("safefiles.outfile.check_output", lambda *a, **k: None)
    try:
        build_parser().parse_args(args)
    except UsageError as exc:
        pytest.fail(f"{where}: `ringtune {' '.join(args)}`: {exc}", pytrace=False)
