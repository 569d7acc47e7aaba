"""Copy a launched mpiexec's standard output to ours, without the launcher's banner about a
stop that ringtune itself made.

Use ``OutputRelay`` around a launcher that ``ringtune`` started (``ringtune.launch.relaunch``).
When ringtune forwards SIGTERM or SIGINT to the job (a batch system, ``kill``, Ctrl-C),
the ranks end by that signal and MPICH's Hydra (Intel MPI's too) prints an 8-line "BAD
TERMINATION OF ONE OF YOUR APPLICATION PROCESSES … This typically refers to a problem with
your application" banner on its standard output: a false alarm above ringtune's own line
(``ringtune: stopped by SIGTERM: …``), which says what happened. So the launcher's output
passes through here: everything is copied as it comes, and once ``stopping()`` was called
the lines of that banner are dropped. A banner of a job that ended on its own (a rank
crashed) is kept: it is then news. Open MPI says the same on its standard error, which is
not relayed (ranks write their last words there, past the launcher:
``collectives.plumbing.abort.say_past_the_launcher``), so its notice stays.
"""

from __future__ import annotations

import os
import re
import threading

#: Lines of Hydra's banner (``mpiexec.c``: a row of ``=``, rows starting ``=   ``, then the
#: exit string and two lines of advice).
BANNER_LINE = re.compile(
    rb"^(=+\s*|=   .*|YOUR APPLICATION TERMINATED WITH THE EXIT STRING: .*"
    rb"|This typically refers to a problem with your application\.\s*"
    rb"|Please see the FAQ page for debugging suggestions\s*)$")

#: Seconds ``finish`` waits for the rest of the output once the launcher has exited: a
#: straggler that keeps the pipe open must not hold the command.
DRAIN_S = 5.0


class OutputRelay:
    """A thread copying bytes from ``source`` (a pipe's read end, owned and closed here) to
    the file descriptor ``sink`` (1: our stdout)."""

    def __init__(self, source: int, sink: int = 1) -> None:
        self.source, self.sink = source, sink
        self._stopping = threading.Event()
        self._sink_ok = True
        self._thread = threading.Thread(target=self._run, name="ringtune-relay", daemon=True)
        self._thread.start()

    def stopping(self) -> None:
        """ringtune is stopping the job: from now on, drop the launcher's banner."""
        self._stopping.set()

    def finish(self) -> None:
        """Wait (bounded) until everything the launcher wrote has been copied."""
        self._thread.join(DRAIN_S)

    def _write(self, data: bytes) -> None:
        if not data or not self._sink_ok:
            return
        try:
            view = memoryview(data)
            while view:  # a write to a pipe or a terminal may take part of it
                view = view[os.write(self.sink, view):]
        except OSError:
            # Our stdout is gone (``ringtune tune | head``): keep draining the pipe, so
            # the launcher never blocks on a full one, and drop the rest.
            self._sink_ok = False

    def _run(self) -> None:
        partial = b""   # the start of a line held back while stopping (it may be banner)
        blanks = b""    # blank lines held back while stopping: the banner starts with one
        try:
            while True:
                try:
                    chunk = os.read(self.source, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if not self._stopping.is_set() and not partial and not blanks:
                    self._write(chunk)  # the usual case: copied as it comes, unparsed
                    continue
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                for line in lines:
                    if not line.strip():
                        blanks += line + b"\n"
                    elif BANNER_LINE.match(line):
                        blanks = b""
                    else:
                        self._write(blanks + line + b"\n")
                        blanks = b""
            if partial and not BANNER_LINE.match(partial):
                self._write(blanks + partial)
            elif blanks:
                self._write(blanks)
        finally:
            os.close(self.source)
