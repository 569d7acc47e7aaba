"""The one writer of every file ringtune writes: profiles, topologies, exports, reports,
plots, JSON (``probe --out``, ``tune --out``, ``export --out``, ``bench/simulate --json
FILE``, ``RINGTUNE_TUNE_OUT``).

Use ``output_path(path, what)`` to write by any means (``open``, a plotting library's
``savefig``), ``write_text(path, text, what)`` for text, and ``check_output(path, what)`` to
refuse a path that cannot be written before any work is done. What happens depends on
what ``path`` is, never replacing what is not ours:

- a regular file or a missing path: the content goes to a temporary file in the same
  folder, is fsynced and renamed over the path (readers see the old file or the whole new
  one, never half of it), and the folder is synced so the rename survives a crash;
- a symlink to a regular file: the same, on the link's *target*; the link itself stays;
- a character or block device or a FIFO (or a symlink to one: ``/dev/stdout``,
  ``/dev/null``): written *through*, opened for writing without creating or truncating
  it, since the user asked for the output there; a FIFO is opened non-blocking, so
  without a reader within ``FIFO_WAIT_S`` it is one clear error instead of a hang, and a
  write that makes no progress for as long is one too;
- anything else (a directory, a socket, a dangling link, a link loop, a missing folder, a
  place that cannot be written): ``OutputError``, one line naming the path and the fix.

Nothing ever replaces a device node or a symlink. It lives in ``safefiles`` (the bottom
layer) because every layer writes files and the environment table (``probes.environment``)
checks ``RINGTUNE_TUNE_OUT`` with it; the runtime's ``collectives.plumbing.atomic`` is this
module under its old names.
"""

from __future__ import annotations

import errno
import os
import select
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

#: Seconds a FIFO may go without a reader (at open) or without reading (while written)
#: before the write is given up with one line.
FIFO_WAIT_S = 5.0


class OutputError(OSError, ValueError):
    """An output path that cannot be written safely; the message is one line naming the
    path and the fix. Both an ``OSError`` (callers that catch a failed write still do) and
    a ``ValueError`` (the CLI's bad input: exit 2). ``reason``: the message without the
    leading path, for a caller that words the line its own way."""

    reason: str = ""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "cannot write the output"


def _error(label: str, reason: str) -> OutputError:
    """``OutputError`` ``LABEL: REASON``, keeping the reason apart."""
    exc = OutputError(f"{label}: {reason}")
    exc.reason = reason
    return exc


def _special(mode: int) -> bool:
    """Whether a file of ``mode`` is written through rather than replaced."""
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode)


def _label(what: str, name: str) -> str:
    """``--out x.yaml``, ``RINGTUNE_TUNE_OUT=x.yaml`` (``what`` ends with ``=``), ``x.yaml``."""
    if not what:
        return name
    return f"{what}{name}" if what.endswith("=") else f"{what} {name}"


def target_of(path: str | os.PathLike[str], what: str = "output") -> tuple[str, bool]:
    """Where writing ``path`` goes, and whether it is written through (a device or FIFO,
    directly or through links) rather than replaced. A symlink is followed to its final
    target. ``OutputError`` naming ``what`` and the path for what cannot be written: a
    directory, a socket, a dangling link, a link loop, a missing folder, a folder that
    is not one, or a place that cannot be written."""
    name = os.fspath(path)
    label = _label(what, name)
    if not name:
        raise _error(what or "output", "an empty path; name a file to write")
    if "\0" in name:
        raise _error(repr(label), "a path with a NUL byte; name a file to write")
    try:
        st = os.stat(name)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _error(label, "a loop of symbolic links; point it at a file, "
                              "or write somewhere else") from None
        if exc.errno == errno.ENOTDIR:
            raise _error(label, "a part of the path is not a folder; write "
                              "somewhere else") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise _error(label[:200] + "...", "the path is too long; write somewhere "
                         "else") from None
        raise _error(label, f"cannot look at it ({exc.strerror or exc}); write "
                          "somewhere else") from None
    if st is not None:
        if _special(st.st_mode):
            return name, True
        if stat.S_ISDIR(st.st_mode):
            raise _error(label, f"is a directory; name a file inside it, e.g. "
                              f"{os.path.join(name, 'out')}")
        if not stat.S_ISREG(st.st_mode):
            raise _error(label, "is a socket or other special file that cannot "
                              "hold output; write to a regular file")
        real = os.path.realpath(name)
        # Replacing by rename needs only the folder; a file made read-only says "keep me".
        if not os.access(real, os.W_OK):
            raise _error(label, "the file is read-only; make it writable (chmod u+w) or "
                                "write somewhere else")
    elif os.path.islink(name):
        raise _error(label, f"a symbolic link to {os.readlink(name)!r}, which does "
                          "not exist; remove the link or point it at a file")
    else:
        real = os.path.abspath(name)
    folder = os.path.dirname(real) or "."
    if not os.path.isdir(folder):
        raise _error(label, f"the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _error(label, f"the folder {folder} is not writable; choose a "
                          "writable place")
    return real, False


def check_output(path: str | os.PathLike[str], what: str = "output") -> None:
    """Refuse, before any work, a path ``output_path`` would refuse (``OutputError``). It
    looks only: nothing is created, and a FIFO is not opened."""
    target_of(path, what)


@contextmanager
def output_path(path: str | os.PathLike[str], what: str = "output") -> Iterator[str]:
    """Yield a temporary path to write (by any means); on success it becomes ``path`` as
    the module says (renamed over a regular file or a link's target, copied through a
    device or FIFO), on error it is removed. ``OutputError`` for a path that cannot be
    written, before anything is written."""
    real, through = target_of(path, what)
    label = _label(what, os.fspath(path))
    # A device's folder (/dev) is no place for our temporary file: it goes to the
    # system's temporary folder and is copied through afterwards.
    folder = tempfile.gettempdir() if through else os.path.dirname(real)
    base, ext = os.path.splitext(os.path.basename(real))
    # Keep the extension last: writers such as savefig infer the format from it.
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=f".tmp{ext}", dir=folder)
    except OSError as exc:
        raise _error(label, f"cannot write in {folder} ({exc.strerror or exc}); "
                          "choose a writable place") from None
    try:
        # mkstemp creates the file 0600; what we write is meant to be shared like any file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        os.close(fd)
        yield tmp
        if through:
            _copy_through(tmp, real, label)
            os.unlink(tmp)
            return
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, real)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _sync_folder(os.path.dirname(real))


def write_text(path: str | os.PathLike[str], text: str, what: str = "output") -> str:
    """Write ``text`` (UTF-8) to ``path`` as ``output_path`` does; returns the path."""
    with output_path(path, what) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    return os.fspath(path)


def _sync_folder(folder: str) -> None:
    """fsync a folder, so a rename in it survives a crash (best effort)."""
    try:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _open_through(real: str, label: str, wait_s: float) -> int:
    """A non-blocking write descriptor on a device or FIFO. No O_CREAT, no O_TRUNC: the
    node is only written. A FIFO without a reader (``ENXIO``) is retried for ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return os.open(real, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            if exc.errno == errno.ENXIO:
                raise _error(label, f"a FIFO with no reader for {wait_s:g} s; start "
                                  "the reader first, or write to a file") from None
            raise _error(label, f"cannot open it for writing ({exc.strerror or exc}); "
                              "write to a file instead") from None


def _copy_through(tmp: str, real: str, label: str, wait_s: float | None = None) -> None:
    """Copy the written temporary file through a device or FIFO, never waiting more than
    ``wait_s`` (default ``FIFO_WAIT_S``) for the other side to take the next bytes."""
    wait = FIFO_WAIT_S if wait_s is None else wait_s
    fd = _open_through(real, label, wait)
    try:
        with open(tmp, "rb") as src:
            while chunk := src.read(1 << 16):
                view = memoryview(chunk)
                while view:
                    try:
                        n = os.write(fd, view)
                    except BlockingIOError:
                        n = 0
                    except OSError as exc:
                        raise _error(label, f"writing failed ({exc.strerror or exc});"
                                          " write to a file instead") from None
                    if n:
                        view = view[n:]
                        continue
                    # Full (a FIFO whose reader is slow): wait for room, bounded.
                    poller = select.poll()
                    poller.register(fd, select.POLLOUT)
                    if not poller.poll(wait * 1000):
                        raise _error(label, f"the reader took nothing for {wait:g} s;"
                                          " write to a file instead")
    finally:
        os.close(fd)

