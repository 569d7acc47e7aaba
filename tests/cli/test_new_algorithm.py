"""A plug-in algorithm module (``RINGTUNE_PLUGINS``) through the command line: it registers
its algorithm in every process the CLI starts, and one that does not import is one line and
exit 2. The in-process checks of a new algorithm: ``tests/unit/test_new_algorithm.py``."""

from __future__ import annotations

from typing import Any


def _cli(*args: str, **env: str) -> Any:
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPI_"))}
    full.pop("RINGTUNE_LAUNCHED", None)
    full.update(PYTHONPATH=root, **env)
    return subprocess.run([sys.executable, "-m", "ringtune.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120)


def test_a_plugin_module_registers_its_algorithm_in_every_process() -> None:
    # The toy's module registers nothing on import; tests/sleep_algorithm.py does.
    out = _cli("bench", "-np", "1", "-b", "1K", "-e", "1K", "--algo", "sleep",
               "--param", "seconds=0", RINGTUNE_PLUGINS="tests.sleep_algorithm")
    assert out.returncode == 0, out.stderr
    assert "sleep" in out.stdout and "#wrong" in out.stdout
    without = _cli("bench", "-np", "1", "-b", "1K", "-e", "1K", "--algo", "sleep")
    assert without.returncode == 2 and "unknown algorithm 'sleep'" in without.stderr


def test_a_plugin_that_does_not_import_is_one_line_and_exit_2() -> None:
    out = _cli("bench", "-np", "1", "-b", "1K", "-e", "1K",
               RINGTUNE_PLUGINS="tests.sleep_algorithm, no_such_module_here")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "RINGTUNE_PLUGINS" in lines[0], out.stderr
    assert "'no_such_module_here'" in lines[0] and "Traceback" not in out.stderr
