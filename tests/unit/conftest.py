"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from probes import layout
from probes.topology import Host
from tests.fixtures import MACHINES, materialize


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Host]:
    """Every recorded machine of ``tests/fixtures`` read as a ``Host`` (sysfs and NVML as
    ``probes`` would read them on that machine)."""
    dest = tmp_path_factory.mktemp("machines")
    out = {}
    for name in MACHINES:
        root, nv = materialize(name, dest)
        out[name] = layout.read_host(root, responder=nv, name=name)
    return out


# -- in-process only ------------------------------------------------------------------------
# tests/unit runs in this process, fast, and never depends on how quickly other processes
# are scheduled: a test that starts mpiexec, the CLI or any other program belongs in
# tests/cli (`make cli`). This guard makes the rule hold as tests are added: starting a
# process here fails the test that did it, naming the command.

_started: list[str] = []


#: Where a library looks for a shared library by starting a helper: the standard library's
#: ``ctypes.util.find_library`` (``ldconfig``, ``gcc``, ``ld``; the product looks up libmpi
#: so), NVIDIA's ``cuda.pathfinder`` (a Python "canary" that loads libcudart, when CuPy
#: loads NVRTC in .venv-cuda), and matplotlib's font manager (``fc-list``, once per machine,
#: when it builds its font cache: on a fresh machine the first plot a test draws does it).
_LOOKUP_FILES = (os.path.join("ctypes", "util.py"), os.path.join("cuda", "pathfinder", ""),
                 os.path.join("matplotlib", "font_manager.py"))


def _library_lookup() -> bool:
    """Whether a library's search for a shared library is starting the process: a lookup
    inside the code under test, not a program the test runs."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if any(part in name for part in _LOOKUP_FILES):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _refuse(what: str) -> Any:
    def start(*args: Any, **kwargs: Any) -> Any:
        argv = args[1] if what == "subprocess" and len(args) > 1 else args[:1]
        if what == "subprocess" and _library_lookup():
            return _real_execute_child(*args, **kwargs)
        _started.append(f"{what} {argv!r}"[:200])
        raise RuntimeError(f"tests/unit is in-process only: this test started {what} "
                           f"{argv!r:.120}; move it to tests/cli")
    return start


_real_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]


# Module scope: the module's own fixtures are covered, and the guard is lifted when a run
# that also collects other suites (tests/cli) leaves tests/unit.
@pytest.fixture(scope="module", autouse=True)
def _no_processes() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess"))
        for name in ("system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv",
                     "execve", "execvp", "execvpe"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"os.{name}"))
        yield


@pytest.fixture(autouse=True)
def _started_nothing(_no_processes: None) -> Iterator[None]:
    """Fails the test during which (or during whose fixtures) a process was started, even
    when the code under test caught the refusal."""
    yield
    started, _started[:] = list(_started), []
    if started:
        pytest.fail("tests/unit is in-process only; move this test to tests/cli. It started: "
                    + "; ".join(started), pytrace=False)
