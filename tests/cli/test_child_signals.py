"""The suite passes however it was started: the tests that signal a child give it the
dispositions they assume (``tests/child_signals.py``), even when the suite itself runs with
SIGINT and SIGQUIT ignored, as a non-interactive shell's background job does (``make test
&`` from a script, ``setsid … &``, many CI runners), and SIGHUP too, as under ``nohup``.

Each test here starts a parent with those signals ignored, exactly as such a shell would,
and looks at what its children get: a plain child inherits them ignored (the premise), a
child started with ``SIGNALLED_CHILD`` has them at their default; then one of the signal
tests of this folder runs whole from such a parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..child_signals import SENT_BY_TESTS

ROOT = Path(__file__).resolve().parents[2]

#: Ignored by a shell's background job (SIGINT, SIGQUIT) and by ``nohup`` (SIGHUP).
IGNORED_BY_LAUNCHERS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def _ignoring_parent() -> None:
    """``preexec_fn`` standing in for the shell or ``nohup`` that started the suite."""
    for sig in IGNORED_BY_LAUNCHERS:
        signal.signal(sig, signal.SIG_IGN)


def _env() -> dict[str, str]:
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}


#: Run in the ignoring parent: start a child both ways; each child prints the signals it
#: ignores, read from the kernel (``SigIgn`` of /proc/self/status, a bit mask), so what is
#: seen is what an exec'd program such as mpiexec inherits, not Python's view.
PARENT = """
import subprocess, sys
from tests.child_signals import SIGNALLED_CHILD
show = ("import signal; mask = int([l for l in open('/proc/self/status')"
        " if l.startswith('SigIgn:')][0].split()[1], 16);"
        " print(' '.join(s.name for s in signal.Signals if mask >> (s - 1) & 1))")
plain = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True)
helped = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True,
                        **SIGNALLED_CHILD)
print("plain:", plain.stdout.strip())
print("helped:", helped.stdout.strip())
"""


def test_a_signalled_child_starts_with_the_default_dispositions() -> None:
    res = subprocess.run([sys.executable, "-c", PARENT], env=_env(), cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         preexec_fn=_ignoring_parent)
    assert res.returncode == 0, res.stderr
    seen = {line.split(":")[0]: set(line.split(":", 1)[1].split())
            for line in res.stdout.splitlines()}
    assert {s.name for s in IGNORED_BY_LAUNCHERS} <= seen["plain"], \
        f"the premise: a plain child inherits the ignored signals ({res.stdout})"
    assert not seen["helped"] & {s.name for s in SENT_BY_TESTS}, res.stdout


def test_a_signal_test_passes_started_with_sigint_ignored() -> None:
    """``test_bench_stopped[SIGINT]`` (a self-launched ``ringtune bench`` stopped by
    SIGINT: mpiexec, Hydra and the ranks must all end) run by a pytest that ignores SIGINT
    and SIGQUIT, as ``make test &`` from a script does."""
    test = "tests/cli/test_signals.py::test_bench_stopped[SIGINT]"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "-n", "0", test], env=_env(), cwd=ROOT, capture_output=True,
                         text=True, timeout=300, preexec_fn=_ignoring_parent)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout, res.stdout[-3000:]
