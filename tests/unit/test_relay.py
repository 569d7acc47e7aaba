"""``ringtune.relay.OutputRelay``: the launcher's output is copied whole, except Hydra's
"BAD TERMINATION" banner once ringtune itself stopped the job (pipes and a thread in this
process; the end-to-end check is ``tests/cli/test_signals.py``)."""

from __future__ import annotations

import os

from ringtune.relay import OutputRelay

#: What MPICH 5's mpiexec prints when a rank ended by SIGTERM (seen on this machine).
BANNER = (b"\n"
          b"=================================================================================="
          b"=\n"
          b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
          b"=   PID 10170 RUNNING AT vm\n"
          b"=   EXIT CODE: 15\n"
          b"=   CLEANING UP REMAINING PROCESSES\n"
          b"=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES\n"
          b"=================================================================================="
          b"=\n"
          b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)\n"
          b"This typically refers to a problem with your application.\n"
          b"Please see the FAQ page for debugging suggestions\n")


def _relay(parts: list[bytes], stop_after: int | None) -> bytes:
    """Feed ``parts`` through a relay (``stopping()`` after part ``stop_after``); what came
    out."""
    src_r, src_w = os.pipe()
    out_r, out_w = os.pipe()
    relay = OutputRelay(src_r, sink=out_w)
    for i, part in enumerate(parts):
        os.write(src_w, part)
        if i == stop_after:
            relay.stopping()
    os.close(src_w)
    relay.finish()
    os.close(out_w)
    chunks = []
    while chunk := os.read(out_r, 65536):
        chunks.append(chunk)
    os.close(out_r)
    return b"".join(chunks)


def test_everything_is_copied_while_ringtune_has_not_stopped_the_job() -> None:
    parts = [b"ringtune tune: 2 ranks\n", b"a line without its end", b" ... ended\n", BANNER]
    assert _relay(parts, stop_after=None) == b"".join(parts)


def test_the_banner_is_dropped_after_a_stop_and_the_rest_kept() -> None:
    parts = [b"ringtune tune: 2 ranks\n", b"rank output\n\nafter a blank\n",
             BANNER[:40], BANNER[40:], b"a last line"]
    got = _relay(parts, stop_after=0)
    assert got == b"ringtune tune: 2 ranks\nrank output\n\nafter a blank\na last line", got
