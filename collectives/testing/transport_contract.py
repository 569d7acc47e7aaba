"""The transport contract, written once: what every registered transport must do for the
algorithms (``collectives/transport.py``), over any engine's communicator and backend.

Shipped in the package so that a transport outside the tree runs the same contract as the
built-ins (CONTRIBUTING.md, "Run the contract on your plug-in"). Runners:
``tests/mpi/test_transport_contract.py`` (``mpiexec``, 1–4 ranks: every registered
user transport the ``mpi`` engine runs on host buffers), ``tests/unit/
test_transport_contract_inproc.py`` (the test-only ``inproc`` over threads, 1–5 ranks),
``tests/torchrun/test_transport_contract.py`` (``torch`` under torchrun) and
``tests/gpu/test_transport_contract.py`` (GPU buffers over every transport that moves them,
on the simulated GPU in ``make gpu-sim``). ``runnable`` says, from the registries, which
transports a runner can run and why the others cannot (the runner skips them with it).

Each check takes the world communicator object (an mpi4py ``Comm``, a ``TorchComm``, an
``InprocComm``: it needs ``allgather``, ``Dup``, ``Split`` and ``Free``) and a ``Setup``,
and returns failure lines (empty: the contract holds); every rank must call it.

The contract:

- **order per (peer, tag)**: several messages to one peer with one tag, in one batch or in
  batches posted back to back, arrive in posting order (what the ring algorithms rely on);
- **tags** (transports that say they match by tag, ``interleaves``): a receive for a later
  tag completes while an earlier tag's message from the same peer is still unreceived;
- **test / wait_recv / wait**: ``test`` never claims a receive whose message was not sent
  yet (a peer's, sent in a batch of its own: a message to oneself is sent and received in
  one batch, as NCCL requires); on a transport that polls (``interleaves``) it turns true
  by itself once the message is there, and the data is then usable without a wait;
  ``wait_recv`` makes received data usable while sends may be in flight; ``wait`` twice
  is harmless; an empty batch completes;
- **sizes**: sends to oneself (transports whose ``self_sends`` is true; on the others the
  point-to-point checks need a second rank), odd element counts (1, 3, 37, 4099) of every
  width, views at odd offsets, zero-length messages, in one batch with a neighbour's;
- **sub-groups**: a ``Dup()`` and a ``Split()`` (non-contiguous ranks, reversed order) carry
  their own messages (same peers, same tags, posted at once) without mixing them with the
  world's, through ``make_transport`` and ``Transport.sub``;
- **native allreduce**: the library's own allreduce is exact for every op and dtype, at
  sizes 0, 1, 37, on the world and on a ``Split()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectives.ops import DTYPES, OPS
from collectives.testing.results import check_input, mismatches


def _same(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class Setup:
    """The transport under test, the backend whose buffers it moves, and how a host array
    becomes the backend's buffer (``upload``; data ready for the transport when it
    returns)."""

    transport: str
    backend: str = "numpy"
    upload: Callable[[np.ndarray], Any] = _same

    def download(self, buf: Any) -> np.ndarray:
        from collectives.registry import get_backend

        return np.asarray(get_backend(self.backend).to_numpy(buf))


def runnable(engine: str, backend: str) -> list[tuple[str, str]]:
    """``(transport, why not)`` for every registered user transport, from the registries:
    ``why`` is "" for those this runner can run (the engine runs it and it moves
    ``backend``'s buffers), else the reason it is left to another runner."""
    from collectives.engines import get_engine
    from collectives.registry import transport_refusal, user_transport_names

    runner = get_engine(engine)
    out = []
    for name in user_transport_names():
        why = ""
        if not runner.runs_transport(name):
            why = (f"transport {name!r} does not run over the {engine} engine's "
                   "communicators: its own engine's runner tests it (tests/mpi: mpi engine; "
                   "tests/torchrun: torch engine)")
        else:
            refusal = transport_refusal(name, backend)
            if refusal is not None:
                why = (f"{refusal} (GPU transports: tests/gpu/test_transport_contract.py, "
                       "make gpu-sim)")
        out.append((name, why))
    return out


@contextmanager
def opened(comm: Any, setup: Setup) -> Iterator[Any]:
    """A transport of ``setup`` over ``comm`` (collective), closed afterwards."""
    from collectives.registry import get_backend, make_transport

    t = make_transport(setup.transport, comm, get_backend(setup.backend))
    try:
        yield t
    finally:
        t.close()


def _message(src: int, tag: int, index: int, count: int, dtype: str = "int32") -> np.ndarray:
    """What ``src`` sends as its ``index``-th message with ``tag``: values that name all
    three, so a message that lands in the wrong receive says which it was."""
    base = (src + 1) * 1_000_000 + tag * 1_000 + index * 10
    vals = (base + np.arange(count)) % (251 if np.dtype(dtype).itemsize == 1 else 1 << 11)
    return vals.astype(dtype)


def _compare(setup: Setup, got: Any, want: np.ndarray, what: str) -> list[str]:
    host = setup.download(got)
    if host.shape == want.shape and np.array_equal(host.view(np.uint8), want.view(np.uint8)):
        return []
    bad: Any = np.flatnonzero(host != want) if host.shape == want.shape else []
    first = (f"first at index {int(bad[0])}: expected {want[int(bad[0])]!r}, got "
             f"{host[int(bad[0])]!r}" if len(bad) else f"shape {host.shape} != {want.shape}")
    return [f"{setup.transport}: {what}: {len(bad)} of {want.size} wrong, {first}"]


def _neighbours(t: Any) -> tuple[int, int]:
    return (t.rank + 1) % t.size, (t.rank - 1) % t.size


def talks(t: Any) -> bool:
    """Whether ``t``'s rank has a peer to exchange with: another rank, or itself where the
    transport can send to itself (``Transport.self_sends``)."""
    return t.size > 1 or bool(t.self_sends)


# -- the checks ----------------------------------------------------------------------------


def check_order(world: Any, setup: Setup, messages: int = 6, count: int = 37) -> list[str]:
    """Several messages per (peer, tag) arrive in posting order: in one batch, in batches
    posted back to back (waited in reverse order), and to both neighbours at once."""
    fails: list[str] = []
    with opened(world, setup) as t:
        right, left = _neighbours(t)
        if not talks(t):
            return []
        tag = 7
        sends = [setup.upload(_message(t.rank, tag, i, count)) for i in range(messages)]
        recvs = [setup.upload(np.zeros(count, np.int32)) for _ in range(messages)]
        t.start([(s, right, tag) for s in sends], [(r, left, tag) for r in recvs]).wait()
        for i, r in enumerate(recvs):
            fails += _compare(setup, r, _message(left, tag, i, count),
                              f"one batch, message {i} of {messages} from rank {left}")
        recvs = [setup.upload(np.zeros(count, np.int32)) for _ in range(messages)]
        pending = [t.start([(s, right, tag)], [(r, left, tag)]) for s, r in zip(sends, recvs)]
        for p in reversed(pending):
            p.wait()
        for i, r in enumerate(recvs):
            fails += _compare(setup, r, _message(left, tag, i, count),
                              f"batch {i} of {messages} posted back to back from rank {left}")
        if t.size >= 3:
            both = [(right, setup.upload(_message(t.rank, tag, i, count)), i)
                    for i in range(2)] + [(left, setup.upload(_message(t.rank, tag, i + 2,
                                                                         count)), i + 2)
                                          for i in range(2)]
            into = {(p, i): setup.upload(np.zeros(count, np.int32))
                    for p in (left, right) for i in range(2)}
            t.start([(buf, peer, tag) for peer, buf, _ in both],
                    [(into[(p, i)], p, tag) for p in (left, right) for i in range(2)]).wait()
            for (peer, i), buf in into.items():
                # ``peer`` sent its messages 0, 1 to its right (me when peer is my left)
                # and 2, 3 to its left (me when peer is my right).
                k = i if peer == left else i + 2
                fails += _compare(setup, buf, _message(peer, tag, k, count),
                                  f"two peers in one batch, message {i} from rank {peer}")
    return fails


def check_tags(world: Any, setup: Setup, count: int = 11) -> list[str]:
    """A receive for tag 2 completes while tag 1's message from the same peer waits for
    its receive; each lands in its own buffer (transports that match by tag)."""
    fails: list[str] = []
    with opened(world, setup) as t:
        right, left = _neighbours(t)
        if not talks(t):
            return []
        # Sent buffers stay referenced until their batch is waited (the caller's duty).
        out = [setup.upload(_message(t.rank, g, 0, count)) for g in (1, 2, 3, 4)]
        first = t.start([(out[0], right, 1)], [])
        second = t.start([(out[1], right, 2)], [])
        late = setup.upload(np.zeros(count, np.int32))
        t.start([], [(late, left, 2)]).wait_recv()
        fails += _compare(setup, late, _message(left, 2, 0, count),
                          "tag 2 received before tag 1's receive was posted")
        early = setup.upload(np.zeros(count, np.int32))
        t.start([], [(early, left, 1)]).wait()
        fails += _compare(setup, early, _message(left, 1, 0, count), "tag 1 received last")
        first.wait()
        second.wait()
        # Reversed tags within one batch land by tag, not by position.
        bufs = {g: setup.upload(np.zeros(count, np.int32)) for g in (3, 4)}
        t.start([(out[g - 1], right, g) for g in (3, 4)],
                [(bufs[g], left, g) for g in (4, 3)]).wait()
        for g, buf in bufs.items():
            fails += _compare(setup, buf, _message(left, g, 0, count),
                              f"tag {g} in a batch whose receives are in reverse tag order")
    return fails


def check_test_and_waits(world: Any, setup: Setup, count: int = 4099,
                         poll_s: float = 60.0) -> list[str]:
    """``test`` / ``wait_recv`` / ``wait`` as ``collectives.transport.Pending`` says."""
    fails: list[str] = []
    with opened(world, setup) as t:
        right, left = _neighbours(t)
        name = setup.transport
        empty = t.start([], [])
        empty.wait()
        empty.wait_recv()
        if t.interleaves and not empty.test():
            fails.append(f"{name}: an empty batch does not test complete")
        if not talks(t):
            return fails
        # The buffers those batches sent from stay referenced to the end: on a transport
        # whose batches run on a stream, wait() orders later stream work after the send
        # but does not block the host, so a freed buffer could be reallocated and filled
        # (below, with the tag-12 message) before the stream has sent it.
        keep: list[Any] = []
        if t.size > 1:
            fails += _separate_batches(world, t, setup, count, poll_s, keep)
        # wait_recv on a batch with sends: the data is usable; the sends finish in wait().
        got2 = setup.upload(np.zeros(count, np.int32))
        sent = setup.upload(_message(t.rank, 12, 0, count))
        both = t.start([(sent, right, 12)], [(got2, left, 12)])
        both.wait_recv()
        fails += _compare(setup, got2, _message(left, 12, 0, count),
                          "data after wait_recv of a batch with sends")
        both.wait()
        both.wait()  # twice: harmless
        if t.interleaves and not both.test():
            fails.append(f"{name}: test() false after wait()")
        setup.download(got2)  # the stream has done every batch: the buffers may go
        del keep
    return fails


def _separate_batches(world: Any, t: Any, setup: Setup, count: int,
                      poll_s: float, keep: list[Any]) -> list[str]:
    """Rank 0 posts a receive alone; rank 1 sends its message in a batch of its own only
    after rank 0 tested: ``test`` must not claim it early, and on a polling transport must
    turn true by itself. (One direction only: on a transport whose batches run in order on
    a stream, NCCL's, a ring of receive-then-send batches would wait on itself; and a
    message to oneself is sent and received in one batch, so this part needs a peer.)"""
    fails: list[str] = []
    name = setup.transport
    got = setup.upload(np.zeros(count, np.int32))
    recv = t.start([], [(got, 1, 11)]) if t.rank == 0 else None
    if recv is not None and (recv.test(recv_only=True) or recv.test()):
        fails.append(f"{name}: test() claimed a receive whose message was not sent yet")
    world.allgather(None)  # rank 0 has tested before rank 1 sends
    if t.rank == 1:
        sent = setup.upload(_message(1, 11, 0, count))
        keep.append(sent)
        send = t.start([(sent, 0, 11)], [])
        send.wait()
        if t.interleaves and not send.test():
            fails.append(f"{name}: test() false after wait()")
    if recv is None:
        return fails
    if t.interleaves:
        deadline = time.monotonic() + poll_s
        while not recv.test(recv_only=True) and time.monotonic() < deadline:
            time.sleep(0.001)
        if not recv.test(recv_only=True):
            fails.append(f"{name}: test(recv_only=True) still false {poll_s:g} s after "
                         "the message was sent (a polling transport must progress)")
        else:
            fails += _compare(setup, got, _message(1, 11, 0, count),
                              "data after test(recv_only=True), before any wait")
    recv.wait_recv()
    fails += _compare(setup, got, _message(1, 11, 0, count), "data after wait_recv")
    recv.wait()
    recv.wait()  # twice: harmless
    if t.interleaves and not recv.test():
        fails.append(f"{name}: test() false after wait()")
    return fails


#: Element counts of ``check_sizes`` (odd, and past a page) and the widths it moves.
SIZES = (0, 1, 3, 37, 4099)
SIZE_DTYPES = ("uint8", "float16", "float32", "int64", "float64")


def check_sizes(world: Any, setup: Setup) -> list[str]:
    """Sends to oneself and to the right neighbour in one batch, every width, odd counts,
    views at an odd offset of a larger buffer, zero-length messages."""
    fails: list[str] = []
    with opened(world, setup) as t:
        right, left = _neighbours(t)
        for dtype in SIZE_DTYPES:
            for count in SIZES:
                offset = 1  # one element in: an odd byte offset for uint8
                to_self = _message(t.rank, 21, count, count, dtype)
                to_right = _message(t.rank, 22, count, count, dtype)
                whole = setup.upload(np.zeros(count + 2, dtype))
                mine = whole[offset:offset + count]
                theirs = setup.upload(np.zeros(count, dtype))
                sends = [(setup.upload(to_self), t.rank, 21)] if t.self_sends else []
                recvs = [(mine, t.rank, 21)] if t.self_sends else []
                if t.size > 1:  # the neighbour's message into the view at offset 1 too
                    theirs = mine if not t.self_sends else theirs
                    sends.append((setup.upload(to_right), right, 22))
                    recvs.append((theirs, left, 22))
                if not sends:
                    return []
                t.start(sends, recvs).wait()
                where = f"{count} x {dtype}"
                if t.self_sends:
                    fails += _compare(setup, mine, to_self, f"to self, {where} at offset 1")
                if t.size > 1:
                    fails += _compare(setup, theirs, _message(left, 22, count, count, dtype),
                                      f"from rank {left}, {where}")
                edges = setup.download(whole)[[0, -1]]
                if edges.any():
                    fails.append(f"{setup.transport}: a receive of {where} at offset 1 "
                                 f"wrote outside its view: {edges!r}")
    return fails


def check_subgroups(world: Any, setup: Setup, count: int = 19) -> list[str]:
    """A ``Dup()`` and a ``Split()`` carry their own messages: the same tag to the same
    peers on the world, the Dup and the Split, posted before any is waited, each lands on
    its own communicator (``make_transport`` for the Dup, ``Transport.sub`` for the Split,
    whose groups hold non-contiguous world ranks in reversed order)."""
    fails: list[str] = []
    rank = world.Get_rank()
    dup = world.Dup()
    split = world.Split(rank % 2, -rank)
    try:
        with opened(world, setup) as t, opened(dup, setup) as td:
            ts = t.sub(split)
            try:
                chans = [("world", t, 0), ("Dup", td, 1), ("Split", ts, 2)]
                pend, into, sent = [], [], []
                for label, tr, k in chans:
                    if not talks(tr):
                        continue
                    right, left = _neighbours(tr)
                    buf = setup.upload(np.zeros(count, np.int32))
                    sent.append(setup.upload(_message(tr.rank, 5, k, count)))
                    pend.append(tr.start([(sent[-1], right, 5)], [(buf, left, 5)]))
                    into.append((label, tr, k, left, buf))
                for p in reversed(pend):
                    p.wait()
                for label, tr, k, left, buf in into:
                    fails += _compare(setup, buf, _message(left, 5, k, count),
                                      f"{label} (rank {tr.rank} of {tr.size}) from its rank "
                                      f"{left}")
                fails += check_native(ts, setup, counts=(0, 37), label="on the Split")
            finally:
                ts.close()
    finally:
        split.Free()
        dup.Free()
    return fails


def check_native(t: Any, setup: Setup, counts: tuple[int, ...] = (0, 1, 37),
                 label: str = "") -> list[str]:
    """``native_allreduce`` of ``t`` (an open transport) is exact for every op and dtype."""
    fails: list[str] = []
    for dtype in DTYPES:
        for op in OPS:
            if op == "avg":
                continue  # not a transport op: the communicator divides a sum
            for count in counts:
                buf = setup.upload(check_input(count, dtype, op, t.rank))
                t.native_allreduce(buf, op)
                fails += mismatches(setup.download(buf), count, dtype, op, t.size,
                                    f"{setup.transport} native_allreduce {label}".strip())
    return fails


def check_native_world(world: Any, setup: Setup) -> list[str]:
    with opened(world, setup) as t:
        return check_native(t, setup)


#: Every check, by name (what the runners parametrise over).
CHECKS: dict[str, Callable[[Any, Setup], list[str]]] = {
    "order": check_order,
    "tags": check_tags,
    "test_and_waits": check_test_and_waits,
    "sizes": check_sizes,
    "subgroups": check_subgroups,
    "native": check_native_world,
}


def not_run(world: Any, setup: Setup, check: str) -> str:
    """Why ``check`` cannot run for ``setup`` on ``world`` ("" when it can): the tags check
    on a transport that matches by order, the point-to-point checks on one rank of a
    transport that cannot send to itself. Collective (opens the transport once)."""
    with opened(world, setup) as t:
        if check == "tags" and not t.interleaves:
            return (f"transport {setup.transport!r} matches messages by order, not tag "
                    "(interleaves is False)")
        if check != "native" and not talks(t):
            return (f"transport {setup.transport!r} cannot send to itself (self_sends is "
                    "False): its point-to-point checks need 2 ranks or more")
    return ""


def run(world: Any, setup: Setup, check: str) -> list[str]:
    """What each runner does per (transport, check): skip (with the reason) where the check
    cannot run, else the check's failures; an exception is a failure, not a raise, so every
    rank still reaches the runner's agreement on the outcome."""
    import pytest

    why = not_run(world, setup, check)
    if why:
        pytest.skip(why)
    try:
        return CHECKS[check](world, setup)
    except Exception as exc:  # noqa: BLE001 - every rank must reach the agreement
        return [f"{setup.transport}: {check}: {type(exc).__name__}: {exc}"]


def cases(transports: list[tuple[str, str]]) -> tuple[list[tuple[str, str]],
                                                      list[tuple[str, str]]]:
    """A runner's parameters from ``runnable``'s answer: ``(transport, check)`` for every
    check of every transport it runs, and ``(transport, why not)`` for the others."""
    run = [(name, check) for name, why in transports if not why for check in CHECKS]
    left = [(name, why) for name, why in transports if why]
    return run, left
