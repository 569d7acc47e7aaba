"""No import cycles in the product packages.

The graph is read from the source (``ast``), every ``import`` counted — at the top of a
module, inside a function, or under ``TYPE_CHECKING`` — because a function-level import that
closes a circle still ties the two modules into one concept. ``from . import x`` depends on
the package and on ``x`` (the package's ``__init__`` runs first).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("safefiles", "probes", "collectives", "autotune", "ringtune")


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(module: str, is_pkg: bool, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target, *(f"{target}.{a.name}" for a in node.names)]


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """module → the modules of ``packages`` it imports anywhere in its source."""
    mods = _modules(root, packages)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        deps: set[str] = set()
        for node in ast.walk(tree):
            deps.update(t for t in _targets(name, path.name == "__init__.py", node)
                        if t in mods)
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_product_packages_have_no_import_cycles() -> None:
    graph = import_graph(ROOT, PACKAGES)
    assert "collectives.registry" in graph and "autotune.model" in graph  # walked them
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_finds_a_cycle_through_a_package_reexport(tmp_path: Path) -> None:
    """The shape the product had: a package importing its submodule, the submodule
    importing a name from the package (inside a function, even)."""
    _write(tmp_path, {
        "pkg/__init__.py": "from .algo import run\n",
        "pkg/algo.py": "def run():\n    from . import helper\n    return helper\n",
        "pkg/leaf.py": "import os\n",
        "other/__init__.py": "",
        "other/a.py": "from other.b import x\n",
        "other/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from .a import y\nx = 1\n",
        "other/c.py": "from pkg.leaf import os\n",
    })
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert cycles(graph) == [["other.a", "other.b"], ["pkg", "pkg.algo"]]


def test_acyclic_synthetic_package_passes(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "from .registry import register\nfrom . import algo\n",
        "pkg/registry.py": "def register(c):\n    return c\n",
        "pkg/algo.py": "from .registry import register\n",
    })
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.algo"] == {"pkg.registry"}
    assert cycles(graph) == []


def _private_imports(root: Path, packages: tuple[str, ...]) -> list[str]:
    """``from M import _name`` where ``M`` is another product module: a reach into an
    underscored name, which ruff's SLF001 (attribute access) does not see."""
    modules = _modules(root, packages)
    found = []
    for module, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.module == "__future__":
                continue
            target = _targets(module, is_pkg, node)
            if not target or target[0].split(".")[0] not in packages:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(root)}:{node.lineno}: "
                                 f"{alias.name} from {target[0]}")
    return found


def test_no_product_module_imports_another_ones_private_names() -> None:
    assert _private_imports(ROOT, PACKAGES) == []


def test_finds_a_private_import(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def _helper() -> None: ...\n")
    (pkg / "b.py").write_text("from .a import _helper\nfrom . import a as _a\n")
    assert _private_imports(tmp_path, ("pkg",)) == ["pkg/b.py:1: _helper from pkg.a"]
