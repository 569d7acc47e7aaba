"""Atomic file writing, for everything ringtune writes (profiles, topologies, reports, plots,
JSON): the runtime's names for ``safefiles.outfile``, the one output writer.

Readers see the old file or the whole new one, never half of it: the content goes to a
temporary file in the same folder, is fsynced, renamed over the target, and the folder is
synced so the rename itself survives a crash. A symlink has its target replaced, a device
or FIFO (``/dev/stdout``, ``/dev/null``) is written through, and what cannot be written
safely (a directory, a dangling link, an unwritable place) is ``OutputError``, one line:
see ``safefiles.outfile``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# safefiles is the bottom layer and light (the standard library only): importing it here
# keeps ``import collectives`` free of probes.
from safefiles.outfile import OutputError, check_output, output_path, write_text

__all__ = ["OutputError", "atomic_path", "check_output", "write_text_atomic"]


@contextmanager
def atomic_path(path: str | os.PathLike[str], what: str = "") -> Iterator[str]:
    """Yield a temporary path to write (by any means: ``open``, a plotting library's
    ``savefig``); on success it becomes ``path`` (``safefiles.outfile.output_path``), on
    error it is removed. ``OutputError`` (an ``OSError``) when ``path`` cannot be written;
    ``what`` names the output in that line (``--out``)."""
    with output_path(path, what) as tmp:
        yield tmp


def write_text_atomic(path: str | os.PathLike[str], text: str, what: str = "") -> str:
    """Write ``text`` to ``path`` atomically and return the path. ``OutputError`` (an
    ``OSError``, the temporary file removed) when it cannot be written."""
    return write_text(path, text, what)
