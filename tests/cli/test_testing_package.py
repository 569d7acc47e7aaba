"""The contract suites ship in the package (``collectives.testing``): importing them needs
neither ``tests/`` nor pytest, ``import collectives`` does not import them, the package is
found by pyproject's package discovery, and the example of CONTRIBUTING.md ("Run the
contract on your plug-in") passes under ``mpiexec -n 2`` on ``tests/plugin_example.py``'s
algorithm and transport, from a directory outside the checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_"))}
    env.pop("RINGTUNE_LAUNCHED", None)
    env.update(PYTHONPATH=str(ROOT), **extra)
    return env


def test_the_suites_import_without_tests_or_pytest(tmp_path: Path) -> None:
    code = ("import sys, collectives; light = 'collectives.testing' not in sys.modules; "
            "import collectives.testing.contract, collectives.testing.transport_contract, "
            "collectives.testing.results; "
            "print(light, 'pytest' in sys.modules, "
            "any(m == 'tests' or m.startswith('tests.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "False"], out.stdout


def test_package_discovery_ships_the_suites() -> None:
    import tomllib
    from setuptools import find_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = found["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "collectives.testing" in find_packages(str(ROOT), include=include)


def test_contributing_example_runs_on_a_plugin(tmp_path: Path) -> None:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        pytest.skip("no mpiexec next to the interpreter")
    text = (ROOT / "CONTRIBUTING.md").read_text()
    section = text[text.index("### Run the contract on your plug-in"):]
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example is not None, "CONTRIBUTING.md lost its example"
    code = example.group(1)
    assert 'ALGORITHM = "my_algorithm"' in code and 'TRANSPORT = "my_transport"' in code
    code = code.replace('"my_algorithm"', '"plug_native"').replace('"my_transport"',
                                                                     '"plug_counted"')
    (tmp_path / "test_my_plugin.py").write_text(code)
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "pytest",
                          "-q", "-p", "no:cacheprovider", "test_my_plugin.py"],
                         cwd=tmp_path, env=_env(RINGTUNE_PLUGINS="tests.plugin_example"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "failed" not in out.stdout and "passed" in out.stdout
