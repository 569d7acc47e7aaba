"""``ringtune emulate``'s signal handling: a signal whose exception Python drops (raised
while a finalizer such as ``Popen.__del__`` runs) still ends the run at the next step."""

from __future__ import annotations

import gc
import os
import signal
import sys
import time

import pytest

from ringtune.emulate import runner


class _SignalledInFinalizer:
    """Sends ``sig`` to this process from its finalizer and lets the handler run there,
    where the exception it raises is reported as "ignored" and lost."""

    def __init__(self, sig: int) -> None:
        self.sig = sig

    def __del__(self) -> None:
        os.kill(os.getpid(), self.sig)
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the handler runs between these bytecodes
            pass


@pytest.mark.parametrize("sig,exc", [(signal.SIGINT, KeyboardInterrupt),
                                     (signal.SIGTERM, runner.Terminated),
                                     (signal.SIGHUP, runner.Terminated)])
def test_a_signal_swallowed_in_a_finalizer_is_raised_again(sig: int, exc: type) -> None:
    old = runner.install_signal_handlers()
    try:
        runner.raise_pending()  # nothing received yet: no exception
        obj = _SignalledInFinalizer(sig)
        dropped: list[type] = []
        hook = sys.unraisablehook  # where Python reports an exception a finalizer raised
        sys.unraisablehook = lambda u: dropped.append(u.exc_type)
        try:
            del obj  # the handler's exception is dropped inside __del__
            gc.collect()
        finally:
            sys.unraisablehook = hook
        assert dropped == [exc], "the premise: the handler's exception was lost in __del__"
        with pytest.raises(exc):
            runner.raise_pending()
    finally:
        runner.restore_signal_handlers(old)
