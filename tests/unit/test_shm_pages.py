"""Huge pages under the buffers single copy meets again (``collectives.shm.pages``): asked
for the second time a buffer comes and never again, only inside the buffer, bounded in
memory, off by ``RINGTUNE_SHM_HUGE_PAGES=0``; and an allreduce on 4 KiB pages (a torch
tensor's, here an anonymous private mapping) ends on huge pages with the right sums."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.shm import pages
from tests import inproc

MIB = 1 << 20


def anon_array(nbytes: int) -> np.ndarray:
    """A float32 array on an anonymous private mapping: 4 KiB pages where transparent huge
    pages are ``madvise``-only, as PyTorch's allocator gives a tensor."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(m, dtype=np.float32)


def huge_kib(address: int) -> int:
    """AnonHugePages (kB) of this process's mapping that holds ``address``."""
    with open("/proc/self/smaps", encoding="ascii") as f:
        inside = False
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def collapse_refused() -> str:
    """Why this kernel cannot collapse pages (``""`` where it can)."""
    probe = anon_array(4 * MIB)
    probe[:] = 1.0
    return pages.collapse(int(probe.ctypes.data), probe.nbytes)


def test_interior_is_the_whole_huge_pages_inside() -> None:
    h = pages.HUGE_PAGE_BYTES
    assert pages.interior(h, 2 * h) == (h, 2 * h)
    assert pages.interior(h + 1, 2 * h) == (2 * h, h)
    assert pages.interior(h + 1, h) == (2 * h, 0)
    assert pages.interior(0, h - 1) == (0, 0)


def test_asked_the_second_time_only_and_never_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(pages, "collapse", lambda a, n: calls.append((a, n)) or "")
    monkeypatch.delenv(pages.HUGE_PAGES_ENV, raising=False)
    hp = pages.HugePages()
    h = pages.HUGE_PAGE_BYTES
    hp.offer(h, 4 * h)
    assert calls == []  # a buffer met once (a fresh allocation per call) is left alone
    hp.offer(h, 4 * h)
    assert calls == [(h, 4 * h)]
    hp.offer(h, 4 * h)
    hp.offer(h, 4 * h)
    assert calls == [(h, 4 * h)]  # a collapse copies: once per buffer
    hp.offer(h, 3 * h)  # another length is another buffer
    hp.offer(h, 3 * h)
    assert calls == [(h, 4 * h), (h, 3 * h)]
    hp.offer(h + 1, h)  # no whole huge page inside: nothing to ask
    hp.offer(h + 1, h)
    assert len(calls) == 2


def test_memory_stays_bounded_whatever_a_job_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pages, "MAX_REGIONS", 8)
    monkeypatch.setattr(pages, "collapse", lambda a, n: "")
    hp = pages.HugePages()
    h = pages.HUGE_PAGE_BYTES
    for k in range(100):
        hp.offer(k * h, h)
    assert len(hp._seen) == 8  # noqa: SLF001 - the bound is the point


@pytest.mark.parametrize("value", ["0", "off", "false", "no"])
def test_the_variable_turns_it_off(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(pages, "collapse", lambda a, n: calls.append(a) or "")
    monkeypatch.setenv(pages.HUGE_PAGES_ENV, value)
    hp = pages.HugePages()
    for _ in range(3):
        hp.offer(pages.HUGE_PAGE_BYTES, 4 * pages.HUGE_PAGE_BYTES)
    assert not hp.on and calls == []


def test_a_refusal_is_logged_once_and_the_buffer_used_as_it_is(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(pages, "collapse", lambda a, n: "MADV_COLLAPSE: EINVAL (test)")
    monkeypatch.setattr(pages, "_warned", False)
    hp = pages.HugePages()
    h = pages.HUGE_PAGE_BYTES
    with caplog.at_level("INFO", logger="ringtune"):
        for k in range(1, 4):
            hp.offer(k * h, h)
            hp.offer(k * h, h)
    refused = [r for r in caplog.records if "huge pages were refused" in r.getMessage()]
    assert len(refused) == 1 and "EINVAL" in refused[0].getMessage()


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_collapse_keeps_contents_and_touches_nothing_outside() -> None:
    why = collapse_refused()
    if why:
        pytest.skip(f"this kernel refuses it: {why}")
    whole = anon_array(8 * MIB)
    whole[:] = np.arange(whole.size, dtype=np.float32)
    before = whole.copy()
    # The middle of the mapping, not 2 MiB-aligned: only its whole huge pages change.
    base = int(whole.ctypes.data)
    start, length = pages.interior(base + 12345, 5 * MIB)
    assert length and pages.collapse(base + 12345, 5 * MIB) == ""
    assert huge_kib(start) >= length // 1024
    np.testing.assert_array_equal(whole, before)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
@pytest.mark.parametrize("n", [2, 3])
def test_a_reused_buffer_on_small_pages_ends_on_huge_pages(
        n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.shm import cma

    if cma.available():
        pytest.skip(cma.available())
    why = collapse_refused()
    if why:
        pytest.skip(f"this kernel refuses it: {why}")
    inproc.register()
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    monkeypatch.delenv("RINGTUNE_PROFILE", raising=False)
    monkeypatch.delenv(pages.HUGE_PAGES_ENV, raising=False)
    count = 6 * MIB // 4 + 7  # whole huge pages inside wherever it lies; blocks uneven

    def rank(comm: Any) -> tuple[list[int], list[bool]]:
        me = comm.Get_rank()
        buf = anon_array(count * 4)
        c = Communicator(comm)
        huge, ok = [], []
        for call in range(3):
            buf[:] = np.arange(count, dtype=np.float32) * (me + 1) + call
            c.allreduce(buf, "sum", algorithm="shm", transport="inproc")
            expect = (np.arange(count, dtype=np.float64) * (n * (n + 1) / 2)
                      + n * call)
            ok.append(bool(np.allclose(buf, expect, rtol=1e-6)))
            start, _ = pages.interior(int(buf.ctypes.data), buf.nbytes)
            huge.append(huge_kib(start))
        assert c.prepared(buf, "sum", algorithm="shm",
                          transport="inproc").algo.schedule.reader is not None
        c.close()
        return huge, ok

    for huge, ok in inproc.run_ranks(n, rank):
        assert all(ok)
        assert huge[0] == 0 and huge[2] >= 2048, huge  # met once: left; twice: huge
