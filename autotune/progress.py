"""Rank 0's progress display during a tuning run: a bar on a terminal, plain lines
otherwise, and the size and speed texts it shows.

Use ``Progress`` for anything ``ringtune tune`` tells the user while it runs (to stderr;
``--no-progress`` disables it); ``size_text`` and ``best_text`` format a bucket's size and
best figure the same way everywhere.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from collectives.bench import busbw


class Progress:
    """Rank 0's progress display: a bar on a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool, total_buckets: int, stream: TextIO = sys.stderr) -> None:
        self.enabled = enabled
        self.stream = stream
        self.tty = enabled and stream.isatty()
        self.total = total_buckets
        self.t0 = time.monotonic()

    def update(self, index: int, nbytes: int, done: int, trials: int, best: str) -> None:
        if not self.enabled:
            return
        frac = min(1.0, (index + min(done, trials) / max(trials, 1)) / max(self.total, 1))
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        line = (f"[{bar}] bucket {index + 1}/{self.total} {size_text(nbytes):>8}  trial "
                f"{done}/{trials}  best {best}  {time.monotonic() - self.t0:5.0f}s")
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
            self.stream.flush()
        elif done == 0 or done % 10 == 0:
            print(line, file=self.stream, flush=True)

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + " " * 160 + "\r")
        print(text, file=self.stream, flush=True)


def size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def gbps_text(gbps: float) -> str:
    """``12.34 GB/s``; below 1 GB/s three significant digits (``0.000512 GB/s``), so a
    latency-bound small bucket does not read as ``0.00``."""
    return f"{gbps:.2f} GB/s" if gbps >= 1 else f"{gbps:.3g} GB/s"


def best_text(summary_best: float | None, nbytes: int, n: int) -> str:
    if summary_best is None:
        return "-"
    return f"{gbps_text(busbw(nbytes, summary_best, n))} ({summary_best:.0f} us)"
