"""CONTRIBUTING.md's recipes are proven on toys that live outside the product: each toy (an
algorithm, a transport, an engine, an MPI library) is a module of ``tests/`` that only
registers itself through the public registration call, and no product file names it, so
the tests that run it (test_new_algorithm.py, test_toy_transport.py, test_toy_engine.py,
test_natives_registry.py) prove that the module and its registration are all it takes.
Each recipe's "Files touched" names files that exist and register what they say."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("safefiles", "probes", "collectives", "autotune", "ringtune")

#: toy module -> (its registered name, the registration it makes, what the toy is called).
TOYS = {
    "tests/toy_algorithm.py": ("toy", "registered", "Toy"),
    "tests/toy_transport.py": ("toy_transport", "register_transport", "ToyTransport"),
    "tests/toy_engine.py": ("toy", "register_engine", "ToyEngine"),
    "tests/unit/test_natives_registry.py": ("Zeta MPI", "register", "ZetaMpi"),
}


def _product_sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for pkg in PRODUCT
            for p in sorted((ROOT / pkg).rglob("*.py"))]


def _calls(tree: ast.AST) -> set[str]:
    """The names this code calls, decorators included."""
    names = set()
    for node in ast.walk(tree):
        funcs = [node.func] if isinstance(node, ast.Call) else []
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            funcs += node.decorator_list
        for f in funcs:
            f = f.func if isinstance(f, ast.Call) else f
            names.add(f.id if isinstance(f, ast.Name) else getattr(f, "attr", ""))
    return names


def _code(tree: ast.AST) -> tuple[set[str], set[str], set[str]]:
    """The identifiers, the string constants (not docstrings) and the imported modules of
    ``tree``: what its code names, leaving out what its prose mentions."""
    docs = {id(n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    idents: set[str] = set()
    strings: set[str] = set()
    modules: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            idents.add(n.id)
        elif isinstance(n, ast.Attribute):
            idents.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            strings.add(n.value)
        elif isinstance(n, ast.ImportFrom):
            modules.add("." * n.level + (n.module or ""))
            idents.update(a.name for a in n.names)
        elif isinstance(n, ast.Import):
            modules.update(a.name for a in n.names)
    return idents, strings, modules


@pytest.mark.parametrize("toy", sorted(TOYS))
def test_each_toy_lives_outside_the_product_and_registers_itself(toy: str) -> None:
    name, registration, cls = TOYS[toy]
    path = ROOT / toy
    assert path.parts[len(ROOT.parts)] == "tests", toy
    tree = ast.parse(path.read_text(encoding="utf-8"))
    assert cls in {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}, toy
    # The toy (or its test, for the algorithm, which registers it per test) registers it.
    where = tree if registration != "registered" else ast.parse(
        (ROOT / "tests/unit/test_new_algorithm.py").read_text(encoding="utf-8"))
    assert registration in _calls(where), (toy, registration)
    # Nothing in the product's code names it, imports tests/, or special-cases its name.
    module = Path(toy).stem
    for p, text in _product_sources():
        rel = p.relative_to(ROOT)
        idents, strings, modules = _code(ast.parse(text))
        assert cls not in idents and module not in idents, f"{rel} names {cls}/{module}"
        assert name not in strings, f"{rel} names {name!r}"
        assert not any(m.split(".")[0] == "tests" for m in modules), f"{rel} imports tests"


#: The one registration file of each recipe ("Files touched") and the built-in modules it
#: imports: a new one is added to that line.
REGISTRATION_LINES = {
    "collectives/algorithms/__init__.py": ("collectives/algorithms", "register"),
    "collectives/natives/__init__.py": ("collectives/natives", "register"),
    "collectives/engines/__init__.py": ("collectives/engines", "register_engine"),
    "collectives/cuda/__init__.py": ("collectives/cuda", "register_transport"),
    "collectives/transports/__init__.py": ("collectives/transports", "register_transport"),
}


@pytest.mark.parametrize("init", sorted(REGISTRATION_LINES))
def test_each_registering_module_is_imported_by_its_recipes_one_line(init: str) -> None:
    folder, call = REGISTRATION_LINES[init]
    assert f"`{init}`" in (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8"), init
    tree = ast.parse((ROOT / init).read_text(encoding="utf-8"))
    lines = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1
             and n.module is None]
    assert len(lines) == 1, f"{init}: one `from . import ...` line registers the built-ins"
    imported = {a.name for a in lines[0].names}
    for p in sorted((ROOT / folder).glob("*.py")):
        if p.name in ("__init__.py", "base.py", "registry.py"):
            continue
        registers = call in _calls(ast.parse(p.read_text(encoding="utf-8")))
        assert registers == (p.stem in imported), \
            f"{p.relative_to(ROOT)}: registers={registers}, imported by {init}: " \
            f"{p.stem in imported}"


def test_the_registry_names_no_host_transport() -> None:
    """The host transports register themselves like the GPU ones: ``collectives/registry.py``
    imports the package (whose one line lists them), never a transport module, and
    registers none, so a new one touches its module and that line only."""
    tree = ast.parse((ROOT / "collectives/registry.py").read_text(encoding="utf-8"))
    modules = {p.stem for p in (ROOT / "collectives/transports").glob("*.py")} - {
        "__init__", "registry"}
    _, strings, imported = _code(tree)
    named = {m.rsplit(".", 1)[-1] for m in imported if m.startswith(".transports.")}
    assert not named & modules, named & modules
    assert "register_transport" not in _calls(tree)
    assert not strings & modules, strings & modules


def test_the_host_transports_list_in_their_import_lines_order() -> None:
    """The package's import line is the registration order: what ``transport_names``,
    the JSON Schema's enums and the docs list, and the GPU preference's tie-break."""
    from collectives.registry import transport_names

    tree = ast.parse((ROOT / "collectives/transports/__init__.py").read_text(encoding="utf-8"))
    line = next(n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1
                and n.module is None)
    names = transport_names()
    assert names[:len(line.names)] == [a.name for a in line.names], names
