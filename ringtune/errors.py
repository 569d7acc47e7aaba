"""How the CLI turns exceptions into one line on stderr and an exit code."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any


class UsageError(Exception):
    """Bad usage or bad input: exit code 2."""


class CommandFailed(Exception):
    """A runtime failure with a clear message: exit code 1."""


#: Exceptions that mean "bad input" (exit 2); anything else is a runtime failure (exit 1).
_INPUT_ERRORS = (UsageError, ValueError, TypeError, FileNotFoundError, PermissionError,
                 IsADirectoryError, NotADirectoryError)


def exit_code_for(exc: BaseException) -> int:
    return 2 if isinstance(exc, _INPUT_ERRORS) else 1


def report_error(exc: BaseException | str, rank: int = 0, *,
                 before_abort: bool = False) -> int:
    """Print ``ringtune: error: …`` once (rank 0 only) and return the exit code.
    ``RINGTUNE_LOG=debug`` adds the traceback. ``before_abort``: MPI_Abort ends the job
    next unless the code is 2 (``ringtune.cli``), so the line goes straight to the
    launcher's stderr (``collectives.plumbing.abort.say_past_the_launcher``): MPICH's Hydra
    may drop what a rank printed just before an abort."""
    code = 1 if isinstance(exc, str) else exit_code_for(exc)
    if rank == 0:
        text = exc if isinstance(exc, str) else (str(exc) or type(exc).__name__)
        if isinstance(exc, BaseException) and code == 1 and not isinstance(exc, CommandFailed):
            text = f"{type(exc).__name__}: {text}"
        text = " ".join(str(text).split("\n"))
        if before_abort and code != 2:
            from collectives.plumbing.abort import say_past_the_launcher

            say_past_the_launcher(f"ringtune: error: {text}")
        else:
            print(f"ringtune: error: {text}", file=sys.stderr, flush=True)
        if os.environ.get("RINGTUNE_LOG", "").lower() == "debug" and isinstance(exc,
                                                                                BaseException):
            traceback.print_exception(exc)
    return code


#: The packages whose warnings the CLI prints as one line (``one_line_warnings``).
_OWN_PACKAGES = ("collectives", "autotune", "probes", "safefiles", "ringtune")


def one_line_warnings() -> None:
    """Print the project's own warnings as one line each (``ringtune: …``), as errors are:
    Python's format adds the file, the line number and the source line, which tell a user
    of the CLI nothing. Warnings of other packages keep Python's format; tests that record
    warnings (``warnings.catch_warnings(record=True)``) are not affected."""
    import warnings

    if getattr(warnings.showwarning, "ringtune_one_line", False):
        return  # main() again in this process: one layer, not one per call
    python_format = warnings.showwarning
    own = tuple(f"{os.sep}{pkg}{os.sep}" for pkg in _OWN_PACKAGES)

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        if not any(part in filename for part in own):
            python_format(message, category, filename, lineno, file, line)
            return
        text = " ".join(str(message).split("\n"))
        if not text.startswith("ringtune"):
            text = f"ringtune: warning: {text}"
        try:
            print(text, file=file or sys.stderr, flush=True)
        except OSError:
            pass  # stderr gone (a closed pipe): as Python's own showwarning does

    show.ringtune_one_line = True  # type: ignore[attr-defined]
    warnings.showwarning = show
