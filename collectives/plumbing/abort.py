"""Ending every rank when one rank cannot go on, with a line that names it.

A rank that fails inside a collective call leaves its peers waiting for messages that
never come: under a plain ``mpiexec -n N python train.py`` (no ``-m mpi4py``) the job then
hangs forever. Use ``abort_world(comm, line)`` wherever ringtune sees such a failure (an
exception inside ``Communicator.allreduce`` once communication may have begun, a trial
past ``--trial-timeout``, a runtime failure of a CLI verb): it prints ``line`` on stderr,
gives the launcher a moment to forward it, and calls ``MPI_Abort``, which ends every rank
(under ``torch.distributed``, which has no abort, this rank exits: its peers' next
operation with it fails, and torchrun's agent stops the rest).
``rank_line`` builds the line in the form ``ringtune: rank R: …``.

A rank that calls ``os._exit`` ends at once (no ``atexit``, no MPI_Finalize, nothing
printed), and MPICH's launcher then kills every other rank and reports one of *those*
("BAD TERMINATION … PID <a rank it killed> … EXIT CODE: 9"): nothing names the rank that
ended the job. ``name_abrupt_exits(comm)`` (every ``Communicator`` calls it) makes
``os._exit`` in this rank's process first write ``ringtune: rank R: os._exit(N) …``.

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
    from ..engines import engine_for

    rank = comm.Get_rank()
    where = f"rank {rank}"
    world = engine_for(comm).world_rank(comm)
    if world is not None:
        where += f" (world rank {world})"
    return f"ringtune: {where}: " + " ".join(str(text).split())


def abort_world(comm: Any, line: str | None, code: int = 1) -> NoReturn:
    """Print ``line`` (when given) and end every rank of the job with exit ``code``."""
    if line:
        # Straight to the launcher's stderr where Hydra started this rank: its proxy
        # forwards a rank's output asynchronously and may drop what it had not yet read
        # when MPI_Abort ends the job (an empty stderr under load), and a replaced
        # sys.stderr (a test runner's capture) dies unread with the process.
        say_past_the_launcher(line)
    try:
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    time.sleep(ABORT_GRACE_S)
    from ..engines import engine_for

    # MPI_Abort under MPI; under torch.distributed this rank exits and its peers' next
    # operation with it fails (torchrun's agent then stops them).
    engine_for(comm).abort(comm, code)
    _real_exit(code)  # Abort does not return; should an MPI let it, this rank still ends


# -- os._exit on a rank -------------------------------------------------------------------

_real_exit = os._exit
#: The rank's process (``os._exit`` in a forked child, e.g. a data-loader worker, is that
#: child's business and stays silent) and its ``ringtune: rank R`` prefix.
_exit_owner: tuple[int, str] | None = None


def name_abrupt_exits(comm: Any) -> None:
    """From now on an ``os._exit`` in this process (this rank of ``comm``) first writes one
    line naming the rank, where the user sees it even though the launcher kills the other
    ranks at once (``say_past_the_launcher``). Idempotent; a world of one rank is left
    alone (nothing waits on it); ``RINGTUNE_NAME_EXITS=0`` turns it off."""
    global _exit_owner
    if comm.Get_size() == 1 or os.environ.get("RINGTUNE_NAME_EXITS", "").strip() == "0":
        return
    _exit_owner = (os.getpid(), rank_line(comm, "").rstrip())
    os._exit = _named_exit


def _named_exit(status: int) -> NoReturn:
    owner = _exit_owner
    if owner is not None and owner[0] == os.getpid():
        say_past_the_launcher(
            f"{owner[1]} os._exit({status}) ends this rank without MPI_Finalize (nothing else "
            "runs, not even atexit); the launcher ends the other ranks")
    _real_exit(status)


def say_past_the_launcher(line: str) -> None:
    """Write ``line`` where the user sees it even if the launcher kills this rank's peers
    at once: to the launcher's own stderr where this rank was started by MPICH's Hydra
    proxy (the proxy forwards a rank's output asynchronously and drops what it had not yet
    read when it cleans up), else to this rank's stderr."""
    data = (line + "\n").encode(errors="replace")
    try:
        sys.stderr.flush()  # what the rank printed before comes first
    except (OSError, ValueError):
        pass
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as fh:
            hydra = b"hydra_pmi_proxy" in fh.read()
        if hydra:
            theirs = f"/proc/{parent}/fd/2"
            if not os.path.samestat(os.stat(theirs), os.fstat(2)):
                fd = os.open(theirs, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
                try:
                    os.write(fd, data)
                    return
                finally:
                    os.close(fd)
    except OSError:
        pass  # not Linux, or not ours to open: this rank's stderr
    try:
        os.write(2, data)
    except OSError:
        pass
