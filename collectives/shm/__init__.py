"""Shared memory between the ranks of one host: ringtune's own intra-host data path.

Use it through the ``shm`` algorithm (``collectives.algorithms.shm``): on ranks that share
a host it reduces host buffers by reading every peer's input where it lies in one shared
segment, instead of moving bytes through MPI's or gloo's point-to-point. This package holds
what the algorithm stands on, engine-agnostic (it needs only the communicator object's
``allgather``), one concept per module:

- ``segment``: one POSIX shared-memory segment per communicator — named so that no other
  job, communicator or user meets it, mode 0600, checked for room before use, and unlinked
  as soon as every local rank has mapped it (so no exit path, SIGKILL included, leaves it
  in ``/dev/shm``).
- ``cma``: single-copy reads and writes of a peer's memory (Linux cross-memory attach).
- ``pages``: huge pages under a buffer that single copy meets again (4 KiB pages make
  every cross-memory copy of it slower).
- ``sync``: the per-rank sequence counters inside the segment, the memory fences that make
  them correct on x86 and Arm, and the bounded waits that name the rank they wait for.

Importing this package imports nothing beyond the standard library and NumPy.
"""

from __future__ import annotations

from .segment import Segment, ShmUnavailable, attach_segment
from .sync import Flags, PeerGone

__all__ = ["Flags", "PeerGone", "Segment", "ShmUnavailable", "attach_segment"]
