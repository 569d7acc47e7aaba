"""Atomic file writing, for everything ringtune writes (profiles, topologies, reports, plots,
JSON): the runtime's names for ``probes.outfile``, the one output writer.

Readers see the old file or the whole new one, never half of it: the content goes to a
temporary file in the same folder, is fsynced, renamed over the target, and the folder is
synced so the rename itself survives a crash. A symlink has its target replaced, a device
or FIFO (``/dev/stdout``, ``/dev/null``) is written through, and what cannot be written
safely (a directory, a dangling link, an unwritable place) is ``OutputError``, one line:
see ``probes.outfile``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probes.outfile import OutputError, check_output

__all__ = ["OutputError", "atomic_path", "check_output", "write_text_atomic"]


def __getattr__(name: str) -> Any:
    # ``OutputError`` and ``check_output`` come from probes.outfile on first use: importing
    # probes loads the topology code, and ``import collectives`` must stay light.
    if name in ("OutputError", "check_output"):
        import probes.outfile

        return getattr(probes.outfile, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@contextmanager
def atomic_path(path: str | os.PathLike[str], what: str = "") -> Iterator[str]:
    """Yield a temporary path to write (by any means: ``open``, a plotting library's
    ``savefig``); on success it becomes ``path`` (``probes.outfile.output_path``), on
    error it is removed. ``OutputError`` (an ``OSError``) when ``path`` cannot be written;
    ``what`` names the output in that line (``--out``)."""
    from probes.outfile import output_path

    with output_path(path, what) as tmp:
        yield tmp


def write_text_atomic(path: str | os.PathLike[str], text: str, what: str = "") -> str:
    """Write ``text`` to ``path`` atomically and return the path. ``OutputError`` (an
    ``OSError``, the temporary file removed) when it cannot be written."""
    from probes.outfile import write_text

    return write_text(path, text, what)
