"""Ending every rank when one rank cannot go on, with a line that names it.

A rank that fails inside a collective call leaves its peers waiting for messages that
never come: under a plain ``mpiexec -n N python train.py`` (no ``-m mpi4py``) the job then
hangs forever. Use ``abort_world(comm, line)`` wherever ringtune sees such a failure (an
exception inside ``Communicator.allreduce`` once communication may have begun, a trial
past ``--trial-timeout``, a runtime failure of a CLI verb): it prints ``line`` on stderr,
gives the launcher a moment to forward it, and calls ``MPI_Abort``, which ends every rank.
``rank_line`` builds the line in the form ``ringtune: rank R: …``.

``RINGTUNE_ON_ERROR=raise`` makes ``Communicator`` raise such failures to the caller
instead (for a program that handles them itself, e.g. by aborting with its own message);
the default is ``abort``.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any, NoReturn

#: Seconds between printing the line and aborting: the launcher forwards stderr
#: asynchronously and the abort kills every process at once.
ABORT_GRACE_S = 1.0

ON_ERROR_MODES = ("abort", "raise")


def on_error_mode() -> str:
    """``$RINGTUNE_ON_ERROR``: ``abort`` (default) or ``raise``. Any other value warns and
    counts as ``abort`` (raising here, on the ranks whose environment differs, could itself
    leave the others waiting)."""
    mode = os.environ.get("RINGTUNE_ON_ERROR", "").strip().lower() or "abort"
    if mode not in ON_ERROR_MODES:
        warnings.warn(f"RINGTUNE_ON_ERROR={mode!r}: use one of {', '.join(ON_ERROR_MODES)}; "
                      "using 'abort'", RuntimeWarning, stacklevel=2)
        return "abort"
    return mode


def rank_line(comm: Any, text: str) -> str:
    """``ringtune: rank R: text`` on one line (R in ``comm``; the world rank too when
    ``comm`` is a sub-communicator)."""
    rank = comm.Get_rank()
    where = f"rank {rank}"
    try:
        from mpi4py import MPI

        world = MPI.COMM_WORLD.Get_rank()
        if comm != MPI.COMM_WORLD and world != rank:
            where += f" (world rank {world})"
    except Exception:  # noqa: BLE001 - naming the rank in ``comm`` is enough
        pass
    return f"ringtune: {where}: " + " ".join(str(text).split())


def abort_world(comm: Any, line: str | None, code: int = 1) -> NoReturn:
    """Print ``line`` (when given) and end every rank of the job with exit ``code``."""
    if line:
        if sys.stderr is sys.__stderr__:
            print(line, file=sys.stderr, flush=True)
        else:
            # sys.stderr was replaced (a test runner's capture, a logging redirect) and dies
            # with the process unread: the line goes to the process's own stderr.
            sys.stderr.flush()
            os.write(2, (line + "\n").encode(errors="replace"))
    sys.stderr.flush()
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)
    os._exit(code)  # Abort does not return; should an MPI let it, this rank still ends
