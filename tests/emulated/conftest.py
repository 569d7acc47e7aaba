"""Set-up for tests/emulated: multi-host tests over ``ringtune emulate`` (run by plain pytest,
not under mpiexec; each test starts its own emulated cluster).

Every test module here skips, with the reason, where emulation is impossible (not root, no
network namespaces). Every test checks afterwards that the machine's namespaces are as it
found them: nothing an emulation made is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from ..child_signals import SIGNALLED_CHILD

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "profiles" / "clusters"
WORKER = Path(__file__).resolve().parent / "worker.py"
RINGTUNE = [sys.executable, "-m", "ringtune.cli"]


def _unavailable() -> str | None:
    from ringtune.emulate import netns

    try:
        netns.preflight()
    except netns.EmulationUnavailable as exc:
        return str(exc)
    return None


_REASON = _unavailable()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if _REASON:
        mark = pytest.mark.skip(reason=f"ringtune emulate unavailable here: {_REASON}")
        for item in items:
            if "tests/emulated" in str(item.fspath):
                item.add_marker(mark)


def netns_list() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True,
                         timeout=30)
    return sorted(line.split()[0] for line in out.stdout.splitlines() if line.strip())


@pytest.fixture(autouse=True)
def machine_left_as_found() -> Iterator[None]:
    """No namespace (and so no veth) an emulation made survives the test."""
    before = netns_list() if not _REASON else []
    yield
    if not _REASON:
        after = netns_list()
        assert after == before, f"namespaces before {before}, after {after}"


def cluster(name: str) -> str:
    """A shipped cluster file by its shape (``2x2``), or a path to another one."""
    return name if os.sep in name else str(CLUSTERS / f"emulated-{name}.yaml")


def emulate_cmd(cluster_name: str, command: Sequence[str], *options: str) -> list[str]:
    return [*RINGTUNE, "emulate", "-q", "--cluster", cluster(cluster_name), *options, "--",
            *command]


def emulate(cluster_name: str, command: Sequence[str], *options: str, timeout: float = 240,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ringtune emulate`` of ``command``; killed (its whole session) after ``timeout``."""
    proc = subprocess.Popen(emulate_cmd(cluster_name, command, *options), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env, **SIGNALLED_CHILD)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # emulate tears down on SIGTERM
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"ringtune emulate {command} ran past {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def worker(*args: str) -> list[str]:
    return ["python", str(WORKER), *args]


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in the output:\n{text}")
