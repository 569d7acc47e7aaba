"""Faults across emulated hosts: one host's processes killed mid-allreduce and mid-tune, a
link set down mid-allreduce. The job ends within a bounded time with a message naming the
failed host and its ranks (or, for a stall, the rank and the peers it waited on); a tune
resumes afterwards and loses at most the trial that was in flight."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from ..child_signals import SIGNALLED_CHILD
from .conftest import ROOT, emulate_cmd

ALLREDUCE = ["python", "-m", "mpi4py", "tests/emulated/worker.py", "allreduce", str(1 << 20),
             "400"]
#: Bound on how long the job may take to end after the fault (the tests do not time
#: performance; this only tells an ended job from a hung one).
END_WITHIN_S = 30


class Job:
    """``ringtune emulate`` of ``command`` in the background, output in files."""

    def __init__(self, tmp: Path, command: list[str], env: dict[str, str] | None = None,
                 shape: str = "2x2") -> None:
        self.out, self.err = tmp / "out.txt", tmp / "err.txt"
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen(emulate_cmd(shape, command), cwd=ROOT, stdout=o,
                                         stderr=e, start_new_session=True,
                                         env=dict(os.environ, **(env or {})),
                                         **SIGNALLED_CHILD)

    def wait_for(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.out.read_text():
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s"
            time.sleep(0.1)

    def namespace(self, host: int) -> str:
        return f"rtemu-{self.proc.pid}-h{host}"

    def pids(self, host: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.namespace(host)],
                             capture_output=True, text=True, check=True, timeout=30).stdout
        return [int(p) for p in out.split()]

    def end(self, timeout: float = END_WITHIN_S) -> tuple[int, float]:
        t0 = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)  # emulate tears down on SIGTERM
            self.proc.wait(timeout=30)
            raise AssertionError(f"job still running {timeout} s after the fault:\n"
                                 f"{self.output()}") from None
        return code, time.monotonic() - t0

    def output(self) -> str:
        return self.out.read_text()[-3000:] + "\n" + self.err.read_text()[-3000:]


def test_host_killed_mid_allreduce(tmp_path: Path) -> None:
    job = Job(tmp_path, ALLREDUCE)
    job.wait_for("round 5 done")
    for pid in job.pids(1):  # the whole host: ranks and Hydra's proxy
        os.kill(pid, signal.SIGKILL)
    code, _ = job.end()
    assert code != 0
    assert "host emu1 (10." in job.err.read_text() and "ranks 2, 3): a rank there " \
        "ended first" in job.err.read_text(), job.output()


def test_ranks_killed_mid_allreduce(tmp_path: Path) -> None:
    job = Job(tmp_path, ALLREDUCE)
    job.wait_for("round 5 done")
    for pid in job.pids(1):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"worker.py" in f.read():
                os.kill(pid, signal.SIGKILL)
    code, _ = job.end()
    assert code != 0
    assert "host emu1 (10." in job.err.read_text() and "ranks 2, 3): a rank there " \
        "ended first" in job.err.read_text(), job.output()


def test_link_down_mid_allreduce_ends_by_the_stall_watchdog(tmp_path: Path) -> None:
    job = Job(tmp_path, [*ALLREDUCE, "multiring"], env={"RINGTUNE_STALL_TIMEOUT": "3"})
    job.wait_for("round 5 done")
    subprocess.run(["ip", "-n", job.namespace(1), "link", "set", "eth0", "down"], check=True,
                   timeout=30)
    code, _ = job.end()
    err = job.err.read_text()
    assert code != 0
    # Ranks of emu0 wait on a rank of emu1 (a ring crosses the link both ways).
    assert "no progress for 3 s waiting on rank(s)" in err, job.output()
    assert any(f"rank {r} (emu0)" in err for r in (0, 1)), job.output()


def _trials(storage: str) -> dict[tuple[str, int], tuple[str, float | None]]:
    """(study, trial number) -> (state, value) of every trial in ``storage``."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = {}
    for name in optuna.study.get_all_study_names(storage):
        study = optuna.load_study(study_name=name, storage=storage)
        for t in study.get_trials(deepcopy=False):
            out[(name, t.number)] = (t.state.name, t.value)
    return out


def test_tune_killed_mid_trial_resumes_losing_at_most_that_trial(tmp_path: Path) -> None:
    profile = tmp_path / "p.yaml"
    storage = f"sqlite:///{tmp_path / 'p.db'}"
    # Enough trials that the tune cannot end between reading 2 completed ones and the kill
    # (CI under load once saw the namespaces gone by then with 4 per bucket).
    tune = ["ringtune", "tune", "--out", str(profile), "--buckets", "64K,256K", "--trials", "8",
            "--budget", "120", "--no-progress", "--seed", "1"]
    import optuna  # noqa: F401 - now, not in the window before the kill (seconds under load)
    job = Job(tmp_path, tune)
    deadline = time.monotonic() + 120
    before: dict = {}
    while time.monotonic() < deadline:
        assert job.proc.poll() is None, job.output()
        if (tmp_path / "p.db").exists():
            before = _trials(storage)
            if sum(s == "COMPLETE" for s, _ in before.values()) >= 2:
                break
        time.sleep(0.2)
    assert job.proc.poll() is None, "the tune ended before the kill:\n" + job.output()
    for pid in job.pids(1):
        os.kill(pid, signal.SIGKILL)
    code, _ = job.end()
    assert code != 0 and not profile.exists()
    killed = _trials(storage)
    done = {k: v for k, v in killed.items() if v[0] == "COMPLETE"}
    assert len(done) >= 2
    # Lost: the trial in flight (RUNNING, or FAIL if it was being recorded). WAITING trials
    # are queued configurations not yet started: nothing of them is lost.
    assert sum(s in ("RUNNING", "FAIL") for s, _ in killed.values()) <= 1, killed

    res = subprocess.run(emulate_cmd("2x2", tune), cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert profile.exists()
    after = _trials(storage)
    # Every trial finished before the kill is kept as it was: not measured again.
    assert {k: after[k] for k in done} == done
