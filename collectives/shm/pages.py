"""Huge pages under the buffers that single copy reads and writes: ``HugePages.offer``.

Use it on a buffer the peers reach with ``process_vm_readv``/``process_vm_writev``
(``collectives.shm.cma``). For each such copy the kernel pins the peer's memory page by
page, and the reduction walks this rank's own buffer through the TLB: with 4 KiB pages
both cost more than the copy's bytes. NumPy asks for huge pages for arrays of 4 MiB and
more; PyTorch's CPU allocator does not (unless ``THP_MEM_ALLOC_ENABLE=1``), and where
transparent huge pages are ``madvise`` only (many distributions' default, this machine's)
a tensor gets 4 KiB pages. Measured on 2 vCPUs under torchrun, 16–64 MiB, 2 and 4 ranks:
the ``ringtune`` backend's all_reduce took 1.25–1.43x less time once its tensor was
backed by huge pages, as fast as on a NumPy array.

What it does: the *second* time a schedule meets the same buffer (address and length) it
asks the kernel to back the buffer's whole 2 MiB pages by huge pages —
``madvise(MADV_HUGEPAGE)`` so that later faults there are huge, then ``MADV_COLLAPSE``
(Linux 6.1) to turn the pages already there into huge pages now. Contents and addresses
stay as they were, and memory outside the buffer is never touched (only the 2 MiB-aligned
pages wholly inside it). A collapse copies: about 1 ms per MiB here, once per buffer.
That is why a buffer met only once — a job that allocates a fresh tensor for every call —
is left alone and pays nothing, while one that comes back (DDP's buckets, a benchmark's
buffer) pays once and gains on every later call. A refusal (a kernel without
``MADV_COLLAPSE``: EINVAL; no free huge page: EAGAIN or ENOMEM) is logged once and the
buffer is used as it is. ``RINGTUNE_SHM_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
from typing import Any

from ..plumbing.logs import log

#: The variable that turns huge pages off (``0``, ``false``, ``no``, ``off``).
HUGE_PAGES_ENV = "RINGTUNE_SHM_HUGE_PAGES"
#: A transparent huge page on x86-64 and on arm64 with 4 KiB base pages.
HUGE_PAGE_BYTES = 2 << 20
#: ``madvise`` advice values (``<linux/mman.h>``; the same on every Linux architecture).
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
#: Buffers a ``HugePages`` remembers: enough for every bucket of a DDP model; the oldest
#: is forgotten past it, so memory stays bounded whatever a job passes.
MAX_REGIONS = 1024


def _bind() -> Any:
    """libc's ``madvise``, or None (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has it
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_MADVISE = _bind()
_warned = False


def enabled() -> bool:
    """Whether huge pages are offered: on, unless ``RINGTUNE_SHM_HUGE_PAGES`` turns them
    off; never where ``madvise`` cannot be called."""
    off = os.environ.get(HUGE_PAGES_ENV, "").strip().lower() in ("0", "false", "no", "off")
    return _MADVISE is not None and not off


def interior(address: int, nbytes: int) -> tuple[int, int]:
    """(start, length) of the whole 2 MiB pages inside ``[address, address + nbytes)``;
    length 0 where none fits."""
    start = -(-address // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (address + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    return start, max(0, end - start)


def collapse(address: int, nbytes: int) -> str:
    """Back the whole 2 MiB pages of ``[address, address + nbytes)`` by huge pages; ``""``
    when done, else why not (the advice and the system's error)."""
    start, length = interior(address, nbytes)
    if not length:
        return ""
    if _MADVISE is None:
        return "madvise is Linux-only"
    for advice, name in ((MADV_HUGEPAGE, "MADV_HUGEPAGE"), (MADV_COLLAPSE, "MADV_COLLAPSE")):
        if _MADVISE(start, length, advice) != 0:
            err = ctypes.get_errno()
            return f"{name}: {errno.errorcode.get(err, err)} ({os.strerror(err)})"
    return ""


class HugePages:
    """Which buffers a schedule has met, and which it has asked huge pages for: call
    ``offer(address, nbytes)`` before peers read the buffer (see the module docstring).
    One per schedule, used by one call at a time."""

    __slots__ = ("on", "_seen")

    def __init__(self) -> None:
        self.on = enabled()
        #: Per buffer (its whole 2 MiB pages): whether huge pages were asked for.
        self._seen: dict[tuple[int, int], bool] = {}

    def offer(self, address: int, nbytes: int) -> None:
        """Note a buffer; the second time it comes, ask for huge pages under it (once)."""
        if not self.on:
            return
        key = interior(address, nbytes)
        if not key[1]:
            return
        asked = self._seen.get(key)
        if asked:
            return
        if asked is None:
            if len(self._seen) >= MAX_REGIONS:
                del self._seen[next(iter(self._seen))]
            self._seen[key] = False
            return
        self._seen[key] = True
        why = collapse(address, nbytes)
        global _warned
        if why and not _warned:
            _warned = True
            log.info("shm: huge pages were refused for a %d-byte buffer (%s): it keeps its "
                     "pages; single copy is slower on 4 KiB pages", nbytes, why)
