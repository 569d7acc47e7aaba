"""A tune that knows the machine (issue 38): the /proc sampler (``probes.busy``) on faked
readings, the busy decision, the tune's watch (``autotune.machine``), the A/B's unstable
marking (``autotune.choose.ab_stability``) and what ``ringtune show`` prints of them."""

from __future__ import annotations

import dataclasses
import io
import os
from typing import Any

import pytest

from autotune import machine
from autotune.choose import ab_stability, build_profile, spread_of
from autotune.records import BucketSummary, Choice, TuneOptions
from autotune.replay import choice_from_record, choice_to_record
from autotune.report import rule_table, unstable_note
from collectives.plan import Config
from collectives.profile import profile_from_dict, write_profile
from probes import busy
from probes.busy import MachineWatch, Sample, busy_reason, parse_stat_line, wait_for_quiet

HZ = 100  # the faked ticks per second (Linux's USER_HZ)


def _stat(pid: int, comm: str, ppid: int, ticks: int, start: int = 0) -> str:
    """A /proc/PID/stat line: utime holds all the ticks, stime none."""
    rest = " ".join(["S", str(ppid)] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 6
                    + [str(start)] + ["0"] * 30)
    return f"{pid} ({comm}) {rest}"


class FakeProc:
    """A /proc whose content the test sets between samples; its clock moves on ``sleep``."""

    def __init__(self, cpus: int = 2) -> None:
        self.now = 100.0
        self.cpus = cpus
        self.load = 0.5
        self.total = 0  # ticks of all CPUs together
        self.idle = 0
        self.procs: dict[int, tuple[str, int, int]] = {}
        self.starts: dict[int, int] = {}  # pid -> start time (ticks since boot)
        self.self_pid = 0  # what /proc/self is

    def advance(self, seconds: float, busy: dict[int, float], idle_cpus: float | None = None,
                load: float | None = None) -> None:
        """``seconds`` pass with each pid of ``busy`` using that many CPUs."""
        self.now += seconds
        used = 0.0
        for pid, cpus in busy.items():
            comm, ppid, ticks = self.procs[pid]
            self.procs[pid] = (comm, ppid, ticks + round(cpus * seconds * HZ))
            used += cpus
        self.total += round(self.cpus * seconds * HZ)
        free = max(self.cpus - used, 0.0) if idle_cpus is None else idle_cpus
        self.idle += round(free * seconds * HZ)
        if load is not None:
            self.load = load

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, {})

    # -- the ProcReader interface --
    def text(self, path: str) -> str | None:
        if path == "loadavg":
            return f"{self.load:.2f} 0.40 0.30 2/300 4242\n"
        if path == "stat":
            cpu = f"cpu  {self.total - self.idle} 0 0 {self.idle} 0 0 0 0 0 0\n"
            return cpu + "".join(f"cpu{i} 1 0 0 1 0 0 0 0 0 0\n" for i in range(self.cpus))
        name = path.split("/")[0]
        pid = int(name) if name.isdigit() else self.self_pid
        if pid not in self.procs:
            return None
        comm, ppid, ticks = self.procs[pid]
        return _stat(pid, comm, ppid, ticks, start=self.starts.get(pid, 0))

    def pids(self) -> list[int]:
        return list(self.procs)

    def clock(self) -> float:
        return self.now


def _machine() -> FakeProc:
    """init, a shell, ringtune -> mpiexec -> proxy -> two ranks, and beside ringtune (the
    shell's other children) a build and an editor."""
    fake = FakeProc(cpus=2)
    fake.procs = {1: ("systemd", 0, 0), 10: ("bash", 1, 0), 20: ("ringtune", 10, 0),
                  21: ("mpiexec", 20, 0), 22: ("hydra_pmi_proxy", 21, 0),
                  30: ("python3", 22, 0), 31: ("python3", 22, 0), 40: ("make", 10, 0),
                  41: ("cc1", 40, 0), 50: ("vim", 10, 0)}
    return fake


def _watch(fake: FakeProc) -> MachineWatch:
    watch = MachineWatch([30, 31], reader=fake)
    watch.ticks_per_s = HZ
    return watch


# -- probes.busy --------------------------------------------------------------------------


def test_stat_line_with_spaces_and_parentheses_in_the_name() -> None:
    proc = parse_stat_line(_stat(7, "my (odd) prog", 3, 250))
    assert proc == busy.Proc("my (odd) prog", 3, 250)
    assert parse_stat_line("") is None and parse_stat_line("7 (x) S") is None


def test_others_exclude_the_job_and_name_the_busiest() -> None:
    fake = _machine()
    watch = _watch(fake)
    # The ranks spin (the job's, with their launcher); a build and an editor do not belong.
    fake.advance(2.0, {30: 1.0, 31: 0.9, 21: 0.05, 41: 0.6, 40: 0.2, 50: 0.02}, load=3.4)
    got = watch.sample("bucket 1 KiB")
    assert got is not None and got.known
    assert got.job_cpus == pytest.approx(1.95)
    assert got.others_cpus == pytest.approx(0.82)
    assert [name for name, _ in got.top] == ["cc1", "make"]  # vim's 0.02 is no news
    assert got.busy_cpus == pytest.approx(2.0)
    assert got.load1 == 3.4
    assert watch.samples == [got]
    why = busy_reason(got)
    assert why == "load 3.4 on 2 CPUs; other processes use 0.8 CPUs (cc1 0.6, make 0.2)"
    assert got.record()["top"] == ["cc1 0.60", "make 0.20"]


def test_a_new_process_and_a_reused_pid_count_from_zero() -> None:
    fake = _machine()
    watch = _watch(fake)
    fake.procs[60] = ("python3", 1, 500)  # started inside the window: all its ticks count
    fake.procs[41] = ("cc1", 40, 0)
    fake.advance(1.0, {})
    fake.procs[50] = ("stress", 10, 80)  # vim ended, its pid reused: fewer ticks than before
    watch.last.procs[50] = busy.Proc("vim", 10, 900)  # type: ignore[index]
    got = watch.sample("w")
    assert got is not None
    assert dict(got.top) == pytest.approx({"python3": 5.0, "stress": 0.8})


def test_the_job_is_its_ranks_their_ancestors_and_descendants() -> None:
    procs = {pid: busy.Proc(c, pp, 0) for pid, (c, pp, _) in _machine().procs.items()}
    procs[32] = busy.Proc("helper", 30, 0)
    job = busy.job_processes(procs, [30, 31])
    assert job == {1, 10, 20, 21, 22, 30, 31, 32}
    # A parent cycle cannot hang it.
    assert busy.job_processes({5: busy.Proc("a", 6, 0), 6: busy.Proc("b", 5, 0)}, [5]) == {5, 6}


@pytest.mark.parametrize("cpus, ranks, load, others, busy_by", [
    (2, 2, 2.1, 0.1, ""),             # the ranks alone
    (2, 2, 2.1, 0.6, "others"),       # a build beside them
    (2, 2, 7.8, 0.1, "load"),         # the machine: a queue the shares miss
    (16, 2, 4.0, 3.0, ""),            # others on CPUs the job leaves free
    (16, 2, 4.0, 14.5, "others"),     # ... and beyond them
    (2, 4, 4.5, 0.0, ""),             # oversubscribed on purpose: the job's own load
])
def test_busy_decision(cpus: int, ranks: int, load: float, others: float,
                       busy_by: str) -> None:
    sample = Sample("s", 1.0, cpus, ranks, load1=load, busy_cpus=0.0, job_cpus=0.0,
                    others_cpus=others, top=(("make", others),))
    why = busy_reason(sample)
    if not busy_by:
        assert why == ""
    elif busy_by == "load":
        assert why == f"load {load:.1f} on {cpus} CPUs"
    else:
        assert why.startswith(f"load {load:.1f} on {cpus} CPUs; other processes use ")


def test_nothing_known_is_never_busy() -> None:
    assert busy_reason(Sample("s", 1.0, 0, 2)) == ""
    empty = FakeProc()
    empty.text = lambda path: None  # type: ignore[method-assign]
    watch = MachineWatch([1], reader=empty)
    empty.now += 1
    got = watch.sample("x")
    assert got is not None and not got.known and busy_reason(got) == ""


def test_a_window_too_short_goes_on_into_the_next() -> None:
    fake = _machine()
    watch = _watch(fake)
    fake.advance(0.1, {41: 1.0})
    assert watch.sample("short", min_window_s=0.5) is None
    fake.advance(0.9, {41: 1.0})
    got = watch.sample("long", min_window_s=0.5)
    assert got is not None and got.seconds == pytest.approx(1.0)
    assert got.others_cpus == pytest.approx(1.0)


def test_wait_for_quiet_waits_then_goes_or_gives_up() -> None:
    fake = _machine()
    watch = _watch(fake)
    said: list[str] = []
    hog_windows = [2]  # the build runs for two windows, then ends

    def sleep(seconds: float) -> None:
        fake.advance(seconds, {41: 1.0} if hog_windows[0] > 0 else {})
        hog_windows[0] -= 1

    got = wait_for_quiet(watch, 60, said.append, window_s=5, sleep=sleep, every_s=30)
    assert busy_reason(got) == ""
    assert said[0].startswith("waiting for a quiet machine (") and "cc1 1.0" in said[0]
    assert said[-1] == "the machine is quiet after 15 s: starting"
    said.clear()
    got = wait_for_quiet(watch, 12, said.append, window_s=5,
                         sleep=lambda s: fake.advance(s, {41: 1.0}))
    assert busy_reason(got) and "of 12 s" in said[-1]  # gave up after 15 s > 12 s


# -- autotune.machine ---------------------------------------------------------------------


class FakeComm:
    """A world of one rank: rank 0 of a tune."""

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return 0

    def allgather(self, value: Any) -> list[Any]:
        return [value]


def test_the_tunes_watch_warns_records_and_summarises() -> None:
    fake = _machine()
    err = io.StringIO()
    watch = machine.TuneWatch(FakeComm(), "warn", out=err, watch=_watch(fake))
    fake.advance(1.0, {30: 1.0, 31: 1.0, 41: 1.6}, load=7.8)
    # (The set-up of a real tune fills the first window; here the faked second did.)
    assert watch.before(sleep=lambda s: None).startswith("load 7.8 on 2 CPUs; other processes")
    line = err.getvalue().strip()
    assert line.startswith("ringtune: warning: the machine is busy: load 7.8 on 2 CPUs; "
                           "other processes use 1.6 CPUs (cc1 1.6): timings will be unstable")
    assert "--busy wait" in line and "--busy refuse" in line
    fake.advance(0.2, {30: 1.0, 31: 1.0}, load=2.0)
    assert watch.sample("A/B 1 KiB") == watch.verdict  # too short: the last verdict stands
    fake.advance(2.0, {30: 1.0, 31: 1.0}, load=2.0)
    assert watch.sample("after") == ""
    record = watch.record()
    assert record is not None
    assert record["cpus"] == 2 and record["ranks_here"] == 2
    assert record["busy"].startswith("load 7.8")  # the busiest sample's reason
    assert [s["at"] for s in record["samples"]] == ["before", "after"]
    summary = machine.summary_line(record)
    assert summary is not None and "busy during this tune (load 7.8" in summary
    assert machine.summary_line({"cpus": 2, "samples": []}) is None


def test_the_wait_resets_the_verdict_when_the_machine_quietens() -> None:
    fake = _machine()
    watch = machine.TuneWatch(FakeComm(), "wait", out=io.StringIO(), watch=_watch(fake))
    fake.advance(1.0, {41: 1.5})
    assert watch.before(sleep=lambda s: None)
    said: list[str] = []
    assert watch.wait(60, said.append, sleep=fake.sleep) == ""
    assert watch.reason == "" and (watch.record() or {}).get("busy") is None


class FakeWorld:
    """Rank 0 of a world whose other ranks' (host, pid, start) are given."""

    def __init__(self, others: list[tuple[str, int, int | None]]) -> None:
        self.others = others

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return 0

    def allgather(self, value: Any) -> list[Any]:
        return [value, *self.others]


def test_the_job_is_the_ranks_that_run_on_this_machine() -> None:
    fake = _machine()
    fake.self_pid = 30
    fake.starts = {30: 5000, 31: 5001, 41: 77}
    # Rank 1 here (an emulated host: another host name, the same machine); rank 2 on another
    # machine, whose pid happens to be the local build's.
    world = FakeWorld([("emu-host-1", 31, 5001), ("node2", 41, 9999)])
    assert machine.job_pids(world, fake) == [os.getpid(), 31]
    # Without /proc start times: by host name.
    fake.starts = {}
    world = FakeWorld([(_hostname(), 31, None), ("node2", 41, None)])
    assert machine.job_pids(world, fake) == [os.getpid(), 31]


def _hostname() -> str:
    import socket

    return socket.gethostname()


def test_busy_modes_are_the_clis() -> None:
    from ringtune.commands import tune

    assert tune.BUSY_MODES == machine.BUSY_MODES


# -- the A/B's unstable marking -----------------------------------------------------------


def test_spread_of() -> None:
    assert spread_of([10.0]) == 0.0
    assert spread_of([9.0, 10.0, 12.0]) == pytest.approx(0.3)


def test_a_spread_beyond_the_gain_is_unstable() -> None:
    # A candidate chosen 20% faster than native, native's rounds scattered by 36%: unstable.
    assert ab_stability([[100, 110, 140], [90, 91, 89]], 1, 0.03) == (
        True, pytest.approx(40 / 110))
    # The same gain on tight rounds: stable.
    assert ab_stability([[100, 101, 102], [90, 91, 89]], 1, 0.03)[0] is False


def test_native_kept_is_judged_against_the_fastest_candidate() -> None:
    # Native kept, its runner-up 2x slower: a spread of 30% does not change that.
    assert ab_stability([[10, 11, 13], [20, 21, 22], [30, 30, 30]], 0, 0.03)[0] is False
    # The bucket: native kept at 1.46 GB/s, multiring close and both scattered.
    assert ab_stability([[10, 16, 11], [10.5, 9, 17], [30, 30, 30]], 0, 0.03)[0] is True
    # A near-tie on an idle machine's few-percent scatter: the margin is the floor.
    assert ab_stability([[100, 102, 101], [101, 99, 100]], 0, 0.03)[0] is False
    # Nothing to compare with.
    assert ab_stability([[10.0]], 0, 0.03) == (False, 0.0)


def _profile(choices: list[Choice]) -> dict[str, Any]:
    sums = [BucketSummary(c.nbytes, f"s-float32-sum-{c.nbytes}B", "trials", 5,
                          [(c.config, c.time_us)], {c.algorithm: (c.config, c.time_us)})
            for c in choices]
    opts = TuneOptions(out="x.yaml", buckets=[c.nbytes for c in choices], storage="sqlite://")
    ident = {"fingerprint": None, "world_size": 2, "hosts": 1, "ranks_per_host": 2,
             "summary": "1 host x 2 ranks, cpu, shm"}
    return build_profile(ident, opts, sums, choices, 3.0, ["native", "multiring"])


def _choice(nbytes: int, algo: str, t: float, native: float, **kw: Any) -> Choice:
    return Choice(nbytes, Config(algo, {"rings": 2} if algo == "multiring" else {}), t, native,
                  nbytes / t / 1e3, nbytes / native / 1e3, **kw)


def test_unstable_rules_are_recorded_shown_and_loaded(tmp_path: Any, capsys: Any) -> None:
    prof = _profile([_choice(1024, "native", 10.0, 10.0, unstable=True, spread=0.38),
                     _choice(4096, "native", 20.0, 20.0),
                     _choice(1 << 20, "multiring", 100.0, 150.0)])
    rules = prof["rules"]
    # The merged native rule keeps the unstable mark of its first bucket.
    assert rules[0]["measured"]["unstable"] is True and rules[0]["measured"]["ab_spread"] == 0.38
    assert "unstable" not in rules[1]["measured"]  # a stable rule's bytes are unchanged
    profile_from_dict(prof)  # the loader and the schema take the new keys
    table = rule_table(prof)
    lines = table.splitlines()
    assert lines[2].endswith("1.00x !") and lines[3].endswith("1.50x")
    assert lines[-1] == unstable_note(prof)
    assert "the A/B spread (up to 38%) exceeded the gain" in lines[-1]
    assert unstable_note(_profile([_choice(1024, "native", 10.0, 10.0)])) is None

    prof["tuning"]["machine"] = {"cpus": 2, "ranks_here": 2,
                                 "busy": "load 7.8 on 2 CPUs",
                                 "samples": [{"at": "before", "seconds": 0.5, "load": 7.8}]}
    path = tmp_path / "p.yaml"
    write_profile(prof, str(path))
    from ringtune.cli import main

    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "1.00x !" in out and "re-tune on a quiet machine" in out
    assert "the machine was busy during its tune (load 7.8 on 2 CPUs)" in out


def test_a_choices_record_keeps_its_marks_and_old_records_still_read() -> None:
    c = _choice(1024, "multiring", 10.0, 12.0, unstable=True, spread=0.2, busy=True)
    again = choice_from_record(choice_to_record(c, {}))
    assert again is not None and (again.unstable, again.spread, again.busy) == (True, 0.2, True)
    old = choice_to_record(c, {})
    for key in ("unstable", "spread", "busy"):
        del old["choice"][key]  # a record written before issue 38
    again = choice_from_record(old)
    assert again is not None and dataclasses.astuple(again)[:4] == dataclasses.astuple(c)[:4]
    assert (again.unstable, again.busy) == (False, False)
