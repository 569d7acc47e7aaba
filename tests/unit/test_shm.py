"""The shared-memory path's safety, in-process (threads as ranks, ``tests/inproc.py``):
segments private to their job (0600, unguessable names, never a file that was there),
gone from /dev/shm once mapped, checked for room before use; bounded waits that name
the rank; the one-line fallback where shm cannot run; two communicators alternating."""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.plumbing.stall import ENV as STALL_ENV
from collectives.plumbing.stall import StallError
from collectives.shm import ShmUnavailable, attach_segment
from collectives.shm import segment as segmod
from collectives.shm.sync import STRIDE, Flags, PeerGone
from tests import inproc

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")


@pytest.fixture(autouse=True)
def _inproc(monkeypatch: pytest.MonkeyPatch) -> None:
    inproc.register()
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    monkeypatch.delenv("RINGTUNE_PROFILE", raising=False)
    monkeypatch.delenv(STALL_ENV, raising=False)


def ours() -> set[str]:
    """This process's segment files in /dev/shm (other jobs' are none of our business)."""
    return {f for f in os.listdir(segmod.SHM_DIR)
            if f.startswith("ringtune-") and f"-{os.getpid()}-" in f}


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    before = ours()
    yield
    assert ours() == before, "a segment was left in /dev/shm"


def test_segment_is_private_and_unlinked_once_every_rank_mapped(
        monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    seen: list[tuple[str, int, int]] = []
    real_open = segmod._open_checked

    def spy(name: str, token: int, total: int) -> int:
        # While the peers attach, the file exists, is ours, 0600, and holds the token.
        st = os.stat(os.path.join(segmod.SHM_DIR, name))
        seen.append((name, stat.S_IMODE(st.st_mode), st.st_uid))
        return real_open(name, token, total)

    monkeypatch.setattr(segmod, "_open_checked", spy)

    def rank(world: Any) -> tuple[str, int]:
        seg = attach_segment(world, 4096)
        seg.data[world.Get_rank()] = 7  # every rank writes the one shared memory
        world.Barrier()
        total = int(seg.data[:world.Get_size()].sum())
        name = seg.name
        seg.close()
        return name, total

    out = inproc.run_ranks(3, rank)
    names = {name for name, _ in out}
    assert len(names) == 1 and all(total == 21 for _, total in out)
    name = names.pop()
    assert name.startswith("ringtune-") and f"-{os.getpid()}-" in name
    assert len(name.rsplit("-", 1)[1]) == 16  # 64 random bits, hex
    assert [(m, u) for _, m, u in seen] == [(0o600, os.geteuid())] * 2
    assert not os.path.exists(os.path.join(segmod.SHM_DIR, name))


def test_names_differ_between_communicators(no_leftovers: None) -> None:
    def rank(world: Any) -> tuple[str, str]:
        a = attach_segment(world, 64)
        b = attach_segment(world.Dup(), 64)
        names = a.name, b.name
        a.close()
        b.close()
        return names

    (a, b), _ = inproc.run_ranks(2, rank)
    assert a != b


def test_an_existing_name_is_never_opened(monkeypatch: pytest.MonkeyPatch,
                                           no_leftovers: None) -> None:
    """A file already under the name (a stale one, another user's trap) is left alone and
    a fresh name taken."""
    tokens = iter([0x1234, 0x1234, 0x5678])
    monkeypatch.setattr(segmod.secrets, "randbits", lambda bits: next(tokens))
    monkeypatch.setattr(segmod, "_SEQUENCE", iter([0, 0, 1]))
    job = segmod.job_identity()
    trap = os.path.join(segmod.SHM_DIR, f"ringtune-{job}-{os.getpid()}-0-{0x1234:016x}")
    with open(trap, "wb") as f:
        f.write(b"not yours")
    try:
        fd, name, token = segmod._create(4096)
        os.close(fd)
        os.unlink(os.path.join(segmod.SHM_DIR, name))
        assert token == 0x5678 and name.endswith(f"{0x5678:016x}")
        with open(trap, "rb") as f:
            assert f.read() == b"not yours"
    finally:
        os.unlink(trap)


@pytest.mark.parametrize("flaw", ["mode", "token", "size", "symlink"])
def test_a_peer_refuses_a_segment_that_is_not_exactly_ours(flaw: str, tmp_path: Any) -> None:
    fd, name, token = segmod._create(8192)
    path = os.path.join(segmod.SHM_DIR, name)
    header = np.zeros(8, dtype=np.int64)
    header[:2] = (segmod.MAGIC, token)
    os.pwrite(fd, header.tobytes(), 0)
    os.close(fd)
    target = path
    try:
        if flaw == "mode":
            os.chmod(path, 0o644)
        elif flaw == "token":
            token += 1
        elif flaw == "size":
            os.truncate(path, 4096)
        else:
            link = os.path.join(segmod.SHM_DIR, name + "-link")
            os.symlink(path, link)
            target, name = link, name + "-link"
        with pytest.raises((ShmUnavailable, OSError)):
            os.close(segmod._open_checked(name, token, 8192))
    finally:
        for p in {path, target}:
            os.unlink(p)


def test_too_little_room_is_one_line_with_the_fix(monkeypatch: pytest.MonkeyPatch,
                                                  no_leftovers: None) -> None:
    monkeypatch.setattr(segmod, "_free_bytes", lambda path: 1 << 20)

    def rank(world: Any) -> str:
        try:
            attach_segment(world, 64 << 20)
        except ShmUnavailable as exc:
            return str(exc)
        return "attached"

    lines = inproc.run_ranks(2, rank)
    assert lines[0] == lines[1]  # every rank alike, nobody left waiting
    line = lines[0]
    assert "\n" not in line and "1.0 MiB free" in line and "--shm-size" in line
    assert "--ipc=host" in line and "64.0 MiB" in line


def test_shm_that_cannot_run_warns_once_and_uses_multiring(
        monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    monkeypatch.setattr(segmod, "_free_bytes", lambda path: 0)
    from collectives.algorithms import shm as shm_algo

    monkeypatch.setattr(shm_algo, "_warned", set())

    def rank(world: Any) -> tuple[float, str]:
        c = Communicator(world)
        x = np.full(1000, world.Get_rank() + 1, dtype=np.float32)
        c.allreduce(x, "sum", algorithm="shm", transport="inproc")
        prepared = c.prepared(x, "sum", algorithm="shm", transport="inproc")
        # avg reaches shm undivided (it divides itself): the fallback must divide too.
        y = np.full(1000, 3.0 * (world.Get_rank() + 1), dtype=np.float32)
        c.allreduce(y, "avg", algorithm="shm", transport="inproc")
        return float(x[0]) + float(y[0]) / 100, type(prepared.algo.delegate).__name__

    # The warnings machinery is the process's: record around every rank's thread.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = inproc.run_ranks(3, rank)
    assert [r[0] for r in out] == [6.06] * 3  # sum 6, avg of 3, 6, 9 = 6
    assert {r[1] for r in out} == {"Multiring"}
    said = [str(w.message) for w in caught if "shm" in str(w.message)]
    assert len(said) == 1 and "using multiring instead" in said[0]
    assert "--shm-size" in said[0]


def _flags(size: int, rank: int) -> Flags:
    return Flags(np.zeros(size * (STRIDE + 1), dtype=np.int64), rank, size, [10, 11, 12])


@pytest.mark.parametrize("masks, each", [
    ([{0, 1}, {0, 1}], True),          # unbound, as many CPUs as ranks
    ([{0, 1}] * 4, False),             # more ranks than CPUs
    ([{0}, {1}], True),                # bound to a core each (Open MPI's, Intel MPI's way)
    ([{0}, {0}], False),               # bound to one core together
    ([{0, 1}, {0}], True),             # the bound one first: the other takes CPU 1
    ([{0}, {0, 1}, {1}], False),
])
def test_waits_spin_where_each_rank_has_a_cpu_of_its_own(masks: list[set[int]],
                                                         each: bool) -> None:
    from collectives.shm.sync import cpu_each

    assert cpu_each([frozenset(m) for m in masks]) is each


@pytest.mark.parametrize("bound", ["apart", "together"])
def test_a_segment_judges_spinning_from_every_ranks_cpus(
        bound: str, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """Each rank bound to one CPU: spinning where the CPUs differ (judged from one rank's
    mask alone, it never would), not where they are the same."""
    import threading

    from collectives.shm.sync import SPIN_CHECKS

    def one_cpu() -> frozenset[int]:
        return frozenset({threading.get_ident() if bound == "apart" else 0})

    monkeypatch.setattr(segmod, "affinity", one_cpu)

    def rank(comm: Any) -> int:
        seg = attach_segment(comm, 4096)
        try:
            return seg.flags.spin
        finally:
            seg.close()

    assert inproc.run_ranks(3, rank) == [SPIN_CHECKS if bound == "apart" else 0] * 3


def test_a_wait_is_bounded_and_names_the_rank(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(STALL_ENV, "0.3")
    flags = _flags(3, 0)
    flags.register_pid()
    flags.pids[1] = flags.pids[2] = os.getpid()  # alive: only the timeout ends the wait
    flags.counters[2] = 5
    with pytest.raises(StallError) as info:
        flags.wait_all(5)
    msg = str(info.value)
    assert "rank 11" in msg and "rank 12" not in msg and STALL_ENV in msg
    assert "ringtune: stall:" in capsys.readouterr().err


def test_a_dead_peer_is_named_without_waiting_for_the_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STALL_ENV, "60")
    flags = _flags(2, 0)
    flags.register_pid()
    flags.pids[1] = 2**31 - 2  # no such process
    with pytest.raises(PeerGone, match=r"rank 11 \(pid 2147483646\) ended"):
        flags.wait(1, 1)


def test_two_communicators_alternate_on_the_same_ranks(no_leftovers: None) -> None:
    def rank(world: Any) -> list[float]:
        a, b = Communicator(world), Communicator(world.Dup())
        out = []
        for i in range(6):
            c = (a, b)[i % 2]
            x = np.arange(5000, dtype=np.float64) * (world.Get_rank() + 1) + i
            c.allreduce(x, "sum", algorithm="shm", transport="inproc", chunk_bytes=1024)
            out.append(float(x[4999]))
        return out

    n = 4
    results = inproc.run_ranks(n, rank)
    want = [4999 * n * (n + 1) / 2 + i * n for i in range(6)]
    assert all(r == want for r in results)


def test_a_peer_gone_during_set_up_leaves_nothing(no_leftovers: None) -> None:
    """Rank 0 created the file; rank 1 fails before it attaches: rank 0's wait for it
    fails, and the file goes with that failure."""

    def rank(world: Any) -> None:
        if world.Get_rank() == 1:
            raise RuntimeError("rank 1 died before attaching")
        attach_segment(world, 4096)

    with pytest.raises(AssertionError, match="rank 1 died"):
        inproc.run_ranks(2, rank, timeout=10)


def test_built_in_defaults_follow_the_layout() -> None:
    from collectives.profile import builtin_profile

    def rules(*args: Any) -> list[tuple[int, int | None, str]]:
        return [(r.min_bytes, r.max_bytes, r.algorithm) for r in builtin_profile(*args).rules]

    assert rules(4, 1, "mpi") == [(0, (64 << 10) - 1, "native"),
                                  (64 << 10, (32 << 20) - 1, "shm"),
                                  (32 << 20, None, "multiring")]
    assert rules(4, 1, "torch") == [(0, None, "shm")]
    # Under torch, hosts of 2 ranks each: shm everywhere (there the two-tier grid).
    assert rules(4, 2, "torch", True) == [(0, None, "shm")]
    # Several hosts under MPI or uneven, one rank, or a layout not known yet: the
    # library's own, then rings.
    for args in ((4, 2, "mpi", True), (4, 2, "torch"), (1, 1, "torch"), (4,)):
        assert [a for _, _, a in rules(*args)] == ["native", "multiring"]


def test_a_communicator_of_one_host_explains_shm_by_default(no_leftovers: None) -> None:
    def rank(world: Any) -> tuple[str, float]:
        c = Communicator(world)
        x = np.full(1 << 18, 1.0, dtype=np.float32)  # 1 MiB
        c.allreduce(x)
        return c.explain(x.nbytes), float(x[0])

    out = inproc.run_ranks(3, rank)
    assert all(v == 3.0 for _, v in out)
    assert all("shm" in line and "built-in defaults" in line for line, _ in out), out[0][0]


class _RandomTrial:
    """A stand-in for an Optuna trial that picks at random (seeded)."""

    def __init__(self, seed: int) -> None:
        import random

        self.rng = random.Random(seed)

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self.rng.choice(list(choices))

    def suggest_int(self, name: str, low: int, high: int, **kw: Any) -> int:
        return self.rng.randint(low, high)


@pytest.mark.parametrize("world,hosts", [(4, 2), (3, 3), (8, 2), (6, 1)])
def test_the_grid_search_offers_shm_only_inside_a_host(world: int, hosts: int) -> None:
    from collectives.algorithms import get_algorithm

    grid = get_algorithm("hierarchical")
    per_host = world // hosts
    offered = False
    for seed in range(300):
        params = grid.search_space_on(_RandomTrial(seed), world, 1 << 20, hosts)
        span = 1
        for d, inner in zip(params["dims"], params["inner"]):
            span *= d
            if inner == "shm":
                offered = True
                assert per_host % span == 0, (params, "shm across hosts")
    assert offered == (per_host > 1)


# -- single-copy reads (collectives/shm/cma.py) --------------------------------------------


def _allreduce_random(n: int, count: int, chunk: int) -> list[tuple[bytes, bool, str]]:
    """Every rank's result bytes for a float32 sum of seeded random inputs, whether the plan
    read peers' memory directly, and the segment's reason when it did not."""
    def rank(world: Any) -> tuple[bytes, bool, str]:
        c = Communicator(world)
        r = world.Get_rank()
        x0 = np.random.default_rng(r).standard_normal(count).astype(np.float32)
        x = x0.copy()
        c.allreduce(x, "sum", algorithm="shm", transport="inproc", chunk_bytes=chunk)
        again = x0.copy()
        c.allreduce(again, "sum", algorithm="shm", transport="inproc", chunk_bytes=chunk)
        assert again.tobytes() == x.tobytes()  # call after call, the same bits
        sched = c.prepared(x, "sum", algorithm="shm", transport="inproc",
                           chunk_bytes=chunk).algo.schedule
        return x.tobytes(), sched.reader is not None, sched.seg.cma_refused or ""

    return inproc.run_ranks(n, rank)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_single_copy_and_the_segments_copies_agree_bit_for_bit(
        n: int, monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    from collectives.algorithms import shm as shm_algo
    from collectives.shm import cma

    if cma.available():
        pytest.skip(cma.available())
    monkeypatch.setattr(shm_algo, "SINGLE_COPY_MIN_BYTES", 0)
    direct = _allreduce_random(n, 10007, 256)  # uneven blocks, many scratch chunks
    assert all(used for _, used, _ in direct), direct[0][2]
    monkeypatch.setattr(shm_algo, "SINGLE_COPY_MIN_BYTES", 1 << 60)
    slots = _allreduce_random(n, 10007, 256)
    assert not any(used for _, used, _ in slots)
    # Every rank alike on each path. The sum is within float32 rounding of the exact one;
    # at 2 ranks (one addition per element, commutative) both paths give the same bits,
    # beyond 2 each path's order starts at the element's owner, which differs.
    assert len({b for b, _, _ in direct}) == 1 and len({b for b, _, _ in slots}) == 1
    exact = sum(np.random.default_rng(r).standard_normal(10007).astype(np.float32)
                .astype(np.float64) for r in range(n))
    for got in (direct[0][0], slots[0][0]):
        np.testing.assert_allclose(np.frombuffer(got, np.float32), exact, rtol=1e-5,
                                   atol=1e-5)
    if n == 2:
        assert direct[0][0] == slots[0][0]


@pytest.mark.parametrize("refused", ["read", "write"])
def test_single_copy_refused_falls_back_with_a_logged_reason(
        refused: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        no_leftovers: None) -> None:
    import errno

    from collectives.shm import cma

    def refuse(self: Any, pid: int, local: int, remote: int, nbytes: int) -> None:
        raise cma.CmaError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(cma.CmaReader, refused, refuse)
    from collectives.algorithms import shm as shm_algo

    monkeypatch.setattr(shm_algo, "SINGLE_COPY_MIN_BYTES", 0)
    with caplog.at_level("INFO", logger="ringtune"):
        out = _allreduce_random(3, 5000, 1024)
    assert not any(used for _, used, _ in out)
    assert len({b for b, _, _ in out}) == 1
    reasons = {why for _, _, why in out}
    assert len(reasons) == 1 and "EPERM" in reasons.pop()
    said = [r.getMessage() for r in caplog.records if "single-copy" in r.getMessage()]
    assert len(said) == 1 and "EPERM" in said[0] and "ptrace" in said[0]


def test_a_buffer_of_another_size_is_refused_not_written(
        monkeypatch: pytest.MonkeyPatch, no_leftovers: None) -> None:
    """A rank whose peer passed a smaller buffer (a broken collective call) must not write
    past the peer's end: the lengths are compared first."""
    from collectives.algorithms import shm as shm_algo
    from collectives.algorithms.shm import ShmSchedule

    monkeypatch.setattr(shm_algo, "SINGLE_COPY_MIN_BYTES", 0)

    def rank(world: Any) -> str:
        c = Communicator(world)
        x = np.ones(4096, dtype=np.float32)
        sched = c.prepared(x, "sum", algorithm="shm", transport="inproc").algo.schedule
        assert isinstance(sched, ShmSchedule) and sched.reader is not None
        mine = x if world.Get_rank() == 0 else np.ones(8192, dtype=np.float32)
        try:
            sched.run(mine)
        except ValueError as exc:
            return str(exc)
        return "ran"

    out = inproc.run_ranks(2, rank)
    assert all("must pass the same size" in o for o in out), out


def test_a_single_copy_read_from_a_gone_process_fails() -> None:
    import errno

    from collectives.shm import cma

    if cma.available():
        pytest.skip(cma.available())
    buf = np.zeros(4, dtype=np.int64)
    with pytest.raises(cma.CmaError) as info:
        cma.CmaReader().read(2**31 - 2, int(buf.ctypes.data), int(buf.ctypes.data), 8)
    assert info.value.errno in (errno.ESRCH, errno.EPERM)


def test_single_copy_serves_large_messages_only() -> None:
    from collectives.algorithms.shm import SINGLE_COPY_MIN_BYTES, single_copy_ok

    assert not single_copy_ok(SINGLE_COPY_MIN_BYTES - 1)
    assert single_copy_ok(SINGLE_COPY_MIN_BYTES) and single_copy_ok(64 << 20)


def test_slot_bytes_is_a_field_of_the_segment(no_leftovers: None) -> None:
    def rank(world: Any) -> tuple[int, int]:
        seg = attach_segment(world, 8192, slot_bytes=2048)
        plain = attach_segment(world, 64)
        try:
            return seg.slot_bytes, plain.slot_bytes
        finally:
            seg.close()
            plain.close()

    assert inproc.run_ranks(2, rank) == [(2048, 0), (2048, 0)]


def test_a_failed_single_copy_access_names_a_dying_peer() -> None:
    """ESRCH is the kernel saying the peer is gone, even while /proc still shows it alive
    (a process being killed loses its memory first); another error against a live peer is
    the call's own failure, decided within 0.2 s; against one that is gone, the peer's end."""
    import errno
    import time

    from collectives.algorithms.shm import peer_ended
    from collectives.shm.cma import CmaError

    me = os.getpid()
    assert peer_ended(CmaError(errno.ESRCH, "process_vm_readv from pid: gone"), me)
    started = time.monotonic()
    assert not peer_ended(CmaError(errno.EFAULT, "process_vm_readv from pid: bad"), me)
    assert time.monotonic() - started < 10.0  # bounded (0.2 s), not hung
    with open("/proc/sys/kernel/pid_max") as f:
        never = int(f.read())  # pids are below pid_max: no process has this one
    assert peer_ended(CmaError(errno.EFAULT, "process_vm_readv from pid: bad"), never)
