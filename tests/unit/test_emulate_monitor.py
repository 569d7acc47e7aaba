"""Which emulated host failed first (``ringtune.emulate.monitor``): the decision from
process exits in order (the kernel's events it reads: tests/cli/test_process_events.py)."""

from __future__ import annotations

from ringtune.emulate.monitor import ExitOrder


def _two_hosts() -> ExitOrder:
    order = ExitOrder(2)
    order.add(0, 100, 0)
    order.add(0, 101, 1)
    order.add(1, 200, 2)
    order.add(1, 201, 3)
    return order


def test_the_first_rank_to_end_names_its_host() -> None:
    order = _two_hosts()
    assert not order.ended(999)  # not a rank: another process of the machine
    assert order.ended(201)
    assert order.first == (1, 201) and order.ranks[201] == 3


def test_no_host_is_named_before_every_hosts_ranks_are_found() -> None:
    # An exit while host 1's ranks are unknown cannot be told from another process's:
    # naming host 0 for it could name the wrong host.
    order = ExitOrder(2)
    order.add(0, 100, 0)
    assert not order.ended(100)
    assert order.first is None
    assert order.why(["emu0", "emu1"], lambda pid: True) == \
        "the ranks of emu1 were never seen running"


def test_dropped_events_name_a_host_only_when_the_dead_ranks_are_on_one() -> None:
    alive = {100, 101, 200}.__contains__
    order = _two_hosts()
    order.dropped(alive)  # 201 ended while its exit was dropped: host 1
    assert order.first == (1, 201)

    order = _two_hosts()
    order.dropped(lambda pid: True)  # nothing that matters was dropped
    assert order.first is None and not order.lost
    assert order.ended(100) and order.first == (0, 100)

    order = _two_hosts()
    order.dropped({101, 200}.__contains__)  # one dead on each host: order unknown
    assert order.first is None and order.lost
    assert not order.ended(101)  # later exits no longer decide
    assert order.why(["emu0", "emu1"], lambda pid: True) == \
        "the kernel dropped process events"


def test_ranks_that_ended_without_an_exit_event_are_named_in_why() -> None:
    order = _two_hosts()
    why = order.why(["emu0", "emu1"], {101, 200}.__contains__)  # 100 and 201 ended
    assert why.startswith("no exit event arrived for rank process(es) ")
    assert why.endswith("rank process(es) 100, 201 (a kernel or container that hides "
                        "process events?)"), why


def test_a_rank_that_ends_cleanly_decides_nothing() -> None:
    # Ranks end at different moments when a job is done; rank 3's failure is the news.
    order = _two_hosts()
    assert not order.ended(100, failed=False)
    assert not order.ended(101, failed=False)
    assert order.ended(201)
    assert order.first == (1, 201)
    # Gone with status 0: not "an exit that never arrived".
    order = _two_hosts()
    order.ended(100, failed=False)
    assert order.why(["emu0", "emu1"], {101, 200, 201}.__contains__) == ""
