"""Size limits of the product code: no module over 600 lines, no class over 300.

A module or class past these holds more than one concept (CONTRIBUTING.md, "one owner per
concept"): split it by concept into modules of their own (collaborators, mixins) rather
than raise a limit. Counted over every ``.py`` file of the product packages, tests and
benchmarks aside; a class from its first decorator to its last line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("collectives", "autotune", "probes", "ringtune", "safefiles")
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 300


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES if (ROOT / pkg).is_dir()
                  for p in (ROOT / pkg).rglob("*.py"))


def test_the_product_packages_are_there() -> None:
    assert [pkg for pkg in PACKAGES[:4] if not (ROOT / pkg).is_dir()] == []
    assert len(_files()) > 50


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_module_over_600_lines(pkg: str) -> None:
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p in _files()
            if p.relative_to(ROOT).parts[0] == pkg
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES]
    assert not over, (f"modules over {MAX_FILE_LINES} lines (split them by concept):\n"
                      + "\n".join(over))


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_class_over_300_lines(pkg: str) -> None:
    over = []
    for p in _files():
        if p.relative_to(ROOT).parts[0] != pkg:
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p))):
            if isinstance(node, ast.ClassDef):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                n = (node.end_lineno or node.lineno) - first + 1
                if n > MAX_CLASS_LINES:
                    over.append(f"{p.relative_to(ROOT)}: class {node.name}: {n} lines")
    assert not over, (f"classes over {MAX_CLASS_LINES} lines (split them by concept into "
                      "collaborators or mixins in modules of their own):\n" + "\n".join(over))

