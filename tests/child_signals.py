"""Start a child that a test will signal with the signal dispositions the test assumes.

A test that stops a child with SIGINT (or SIGTERM, SIGHUP, SIGQUIT) assumes the child acts
on it, as it does when the suite runs in a terminal. But an ignored signal is inherited
across ``fork`` and ``exec`` by every descendant, and a suite is often started with some
ignored: a non-interactive shell starts a background job (``make test &``, ``setsid …
&`` from a script, many CI runners) with SIGINT and SIGQUIT ignored, and ``nohup``
ignores SIGHUP. ``ringtune`` then keeps them ignored (the user's choice, see
``ringtune.launch.relaunch``), Python raises no ``KeyboardInterrupt``, and the test waits
for an exit that never comes.

So every child a test signals is started with ``**SIGNALLED_CHILD`` (or
``preexec_fn=default_signals``): the signals a test sends get their default disposition in
the child before it runs its program, and so in everything it starts in turn (mpiexec,
Hydra's proxies, the ranks, torchrun's agent): the same test behaves the same however the
suite was started. ``tests/cli/test_child_signals.py`` proves it from a parent that
ignores them.
"""

from __future__ import annotations

import signal
from typing import Any

#: The signals tests send to stop a child (SIGKILL and SIGSTOP cannot be ignored).
SENT_BY_TESTS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM,
                                             signal.SIGHUP)


def default_signals() -> None:
    """``preexec_fn``: give the signals tests send their default disposition. Runs in the
    child between ``fork`` and ``exec`` (only the dispositions change: a handler the parent
    installed is reset by ``exec`` anyway, an ignored signal is not)."""
    for sig in SENT_BY_TESTS:
        signal.signal(sig, signal.SIG_DFL)


#: ``subprocess.Popen``/``run`` keyword arguments for a child that a test signals.
SIGNALLED_CHILD: dict[str, Any] = {"preexec_fn": default_signals}

