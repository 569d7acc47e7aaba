"""Online tuning: the job's own allreduce calls choose each message size's algorithm.

Use it where no profile was tuned for the job's machine, or where one measured on an idle
machine may not hold under the job's own load (compute competing for cores and links)::

    RINGTUNE_TUNE=online RINGTUNE_TUNE_OUT=tuned.yaml mpiexec -n 4 python -m mpi4py train.py
    # or: Communicator(comm, tune="online", tune_out="tuned.yaml")
    #     HookState(comm, tune="online")

Per size class the job calls (a message size with its dtype, op and buffer kind: a DDP
bucket), the first calls each run one candidate of the offline tuner's own search space
(``collectives.candidates``): the loaded profile's choice first (the incumbent), then the
built-in defaults' choice and cheap guesses (the library's own allreduce, two rings, halving
and doubling, and across hosts the tier-aware grid, from 8 MiB also pipelined, and the
library's flat composition) where they are in the space, then random configurations of the
space. Every call still returns the right result, bitwise equal on every rank: each
candidate is a correct algorithm.

Each exploring call: rank 0 decides what runs and broadcasts it (one small ``bcast``), every
rank runs it, and one small ``allgather`` shares each rank's time and whether it failed;
a candidate's time is the slowest rank's, its score the median over its calls. A class's
first ``warmup`` calls run the incumbent untimed (they carry the job's own warm-up). Then
the calls race the candidates: each candidate's first call in list order, then more calls
(up to ``samples``) only for the contenders, those within ``prune`` times the best; a
candidate whose first call is slower than that is dropped. Like for like: a candidate
called once is judged against the best's first call (a first call carries one-off costs),
else median against median. Every pair of ranks exchanges one byte when the tuner is built,
so that no candidate's first call pays for opening the library's connections. A size class
settles on the fastest candidate (a challenger must beat the incumbent by ``margin``) when
no contender is left to call and the two fastest have had ``confirm`` calls each (a final
round, alternating the two), or after ``calls`` exploring calls.

The ``share`` budget: what exploring has cost so far beyond the best candidates' times, over
all size classes together, plus what the next call is predicted to cost beyond the best (a
measured candidate's score minus the best's; for one never called, ``prune`` times the
best's first call minus the best's score, the most a first call that is kept can cost) must
fit in ``share`` of the job's time so far,
or the call runs the best so far untimed (after the bcast only) and exploring waits for the
job's time to make room. Charging the prediction before the call is what keeps one call of
a bad candidate on a large bucket from overshooting the share; what no check can foresee
is the excess of a candidate slower than ``prune`` times the best (dropped after that one
call) and a faster candidate found late (the earlier calls cost more in hindsight), after
which exploring waits until the job's time has made up for it. A settled class runs its
winner from the communicator's plan cache, the same path as a fixed profile's plan: no
per-call cost.

Safety. Candidates are only configurations the offline tuner could try, checked by the
algorithm's ``check_params`` before anything runs; a candidate whose preparation is refused
(``ValueError``/``TypeError``, alike on every rank), whose run raises on any rank (a
``StallError`` from ``RINGTUNE_STALL_TIMEOUT`` included), or whose first call is
more than ``prune`` times the best is dropped on every rank (the failed decision is
collective: the allgather), and a call whose candidate failed is restored from a copy and
completes with the incumbent. A failure that leaves a peer blocked inside the candidate
cannot be recovered by anyone; set ``RINGTUNE_STALL_TIMEOUT`` to turn such a hang into a
failure. ``RINGTUNE_LOG=info`` logs each candidate's result and each settlement on rank 0.

Persistence (``RINGTUNE_TUNE_OUT=FILE`` / ``tune_out=``): at ``Communicator.close()``, at
interpreter exit, or when the job calls ``Communicator.save_tuning()``, rank 0 writes the
settled choices atomically as a profile for this shape, merged with the loaded profile's
other rules and shapes, its ``tuning`` header saying ``mode: online``, the job and the call
counts. Rank 0 holds an exclusive lock on ``FILE.lock`` from construction on: a second job
writing the same file is refused at its start. A job loading that profile with online tuning
explores nothing for the sizes settled there (``tuning.online_settled``).

Options (keyword ``tune_options={...}`` or environment; keywords win; defaults here):
``calls`` ``RINGTUNE_TUNE_CALLS`` (32), ``samples`` ``RINGTUNE_TUNE_SAMPLES`` (3),
``share`` ``RINGTUNE_TUNE_SHARE`` (0.1), ``candidates`` ``RINGTUNE_TUNE_CANDIDATES`` (8),
``margin`` ``RINGTUNE_TUNE_MARGIN`` (0.03), ``prune`` ``RINGTUNE_TUNE_PRUNE`` (1.25),
``warmup`` ``RINGTUNE_TUNE_WARMUP`` (1), ``confirm`` ``RINGTUNE_TUNE_CONFIRM`` (6). Every
rank must set the same: ranks that differ fail together at construction, naming them.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import logging
import math
import os
import random
import socket
import statistics
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from .plan import Config, Plan, plan_key

log = logging.getLogger("ringtune")

#: The contract's variables.
TUNE_ENV = "RINGTUNE_TUNE"
OUT_ENV = "RINGTUNE_TUNE_OUT"
#: ``RINGTUNE_TUNE`` values: ``online``, or off (``off``, ``none``, ``0`` or unset).
MODES = ("online", "off")
_OFF = ("", "off", "none", "0", "no", "false")


@dataclass(frozen=True)
class OnlineOptions:
    """How online tuning explores (see the module docstring); defaults are the figures
    documented there and in docs/design.md."""

    #: Most exploring calls per size class before it settles on the best so far.
    calls: int = 32
    #: Calls per candidate; its score is the median of their slowest-rank times.
    samples: int = 3
    #: An exploring call runs only when the cost of exploring so far beyond the best
    #: candidates' times (all size classes together) plus the call's predicted extra
    #: (``SizeClass.predicted_extra``) fits in this share of the job's time since the
    #: communicator was built; otherwise the best so far runs and exploring waits.
    share: float = 0.1
    #: Candidates per size class (the incumbent, guesses, then random draws).
    candidates: int = 8
    #: A challenger replaces the incumbent only when faster by this fraction.
    margin: float = 0.03
    #: A candidate whose first call takes more than this many times the best's first call
    #: is dropped, and only candidates within it of the best are called again (for their
    #: ``samples``); an uncalled candidate is charged what a first call within it would
    #: cost beyond the best (``SizeClass.predicted_extra``). 1.25: a candidate 25% slower
    #: than the best on one call is clearly worse beyond a quiet machine's call-to-call
    #: noise, and each further call of it would cost a quarter of the bucket's best time.
    prune: float = 1.25
    #: Seed of the random draws (rank 0 draws; the same job draws the same candidates).
    seed: int = 0
    #: First calls of each size class that run the incumbent untimed: a bucket's first
    #: calls carry the job's own warm-up (DDP's rebuilt buckets touched for the first time,
    #: the allocator growing), which would make whatever runs then look slow.
    warmup: int = 1
    #: Before a class settles, its two fastest candidates (the runner-up within ``prune``
    #: of the best) are called, alternately, until each has this many calls; 0 or at most
    #: ``samples``: no final round. Picking the fastest of several medians of 3 calls, on a
    #: machine whose calls vary by +-20% inside a training step, picks a lucky loser often
    #: enough to matter (a 1-ring ring over the grid across emulated hosts, 1.23x slower
    #: steps); the final round costs little, the two being within ``prune`` of the best.
    confirm: int = 6

    def record(self) -> dict[str, Any]:
        return asdict(self)


#: option -> (environment variable, kind, lowest, highest)
_BOUNDS: dict[str, tuple[str, type, float, float]] = {
    "calls": ("RINGTUNE_TUNE_CALLS", int, 1, 1_000_000),
    "samples": ("RINGTUNE_TUNE_SAMPLES", int, 1, 1000),
    "share": ("RINGTUNE_TUNE_SHARE", float, 0.0, 1.0),
    "candidates": ("RINGTUNE_TUNE_CANDIDATES", int, 1, 1000),
    "margin": ("RINGTUNE_TUNE_MARGIN", float, 0.0, 0.9),
    "prune": ("RINGTUNE_TUNE_PRUNE", float, 1.0, 1e6),
    "seed": ("RINGTUNE_TUNE_SEED", int, 0, 2**31),
    "warmup": ("RINGTUNE_TUNE_WARMUP", int, 0, 1000),
    "confirm": ("RINGTUNE_TUNE_CONFIRM", int, 0, 1000),
}


def _number(text: Any, kind: type, lo: float, hi: float, what: str) -> Any:
    try:
        if isinstance(text, bool):
            raise ValueError
        value = kind(text) if not isinstance(text, str) else kind(text.strip())
        if kind is int and isinstance(text, float) and text != int(text):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{what}={text!r}: expected {'an integer' if kind is int else 'a number'}"
                         f" in {lo:g}..{hi:g}") from None
    if not (isinstance(value, (int, float)) and math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"{what}={text!r}: expected a value in {lo:g}..{hi:g}")
    return value


def resolve_mode(tune: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether online tuning is on: the keyword when given, else ``RINGTUNE_TUNE``.
    ``ValueError`` naming the keyword or the variable for an unknown value."""
    env = os.environ if environ is None else environ
    if tune is not None:
        text, what = str(tune), "tune"
    else:
        text, what = env.get(TUNE_ENV, ""), TUNE_ENV
    value = text.strip().lower()
    if value == "online":
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{what}={text!r}: unknown tuning mode; use 'online' (tune inside the "
                     f"job) or 'off' (follow the profile)")


def resolve_options(options: Mapping[str, Any] | OnlineOptions | None = None,
                    environ: Mapping[str, str] | None = None) -> OnlineOptions:
    """The options: each keyword of ``options`` when given, else its variable, else the
    default. ``ValueError`` naming the key or variable and the allowed range."""
    if isinstance(options, OnlineOptions):
        return options
    env = os.environ if environ is None else environ
    given = dict(options or {})
    names = {f.name for f in fields(OnlineOptions)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ValueError(f"tune_options: unknown option {unknown[0]!r}; use some of "
                         f"{', '.join(sorted(names))}")
    values: dict[str, Any] = {}
    for name, (var, kind, lo, hi) in _BOUNDS.items():
        if name in given:
            values[name] = _number(given[name], kind, lo, hi, f"tune_options[{name!r}]")
        elif env.get(var, "").strip():
            values[name] = _number(env[var], kind, lo, hi, var)
    return OnlineOptions(**values)


def resolve_out(tune_out: str | os.PathLike[str] | None,
                environ: Mapping[str, str] | None = None) -> str | None:
    """Where the tuned profile goes: the keyword, else ``RINGTUNE_TUNE_OUT``, else nowhere."""
    env = os.environ if environ is None else environ
    if tune_out is not None:
        return os.fspath(tune_out)
    return env.get(OUT_ENV, "").strip() or None


# -- the decision logic (rank 0) -------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What every rank does at one call of a class: ``run`` candidate ``index`` (explore),
    ``hold`` (run candidate ``index``, the best so far, without timing: exploration is
    paused by the ``share`` budget) or ``settle`` on candidate ``index``."""

    action: str
    index: int
    config: Config
    reason: str = ""


class SizeClass:
    """Rank 0's exploration of one size class: its candidates, their times, the decision
    of each call. Pure logic (no communication, no clock), so it is tested on its own.

    ``candidates[0]`` is the incumbent: what the job runs without tuning (the profile's
    choice); a challenger must beat its score by ``opts.margin`` to win.

    The order is a race: every candidate's first call in list order (the incumbent, the
    guesses, the random draws), then the remaining samples of the contenders only (within
    ``prune`` times the best, like for like: ``behind``), the least sampled first, then
    the final round between the two fastest (``confirm``). Before each exploring call
    the call's predicted cost beyond the best is charged against the ``share`` budget
    (``predicted_extra``); a call that does not fit is not made."""

    def __init__(self, nbytes: int, candidates: Sequence[Config], opts: OnlineOptions) -> None:
        if not candidates:
            raise ValueError("a size class needs at least one candidate (the incumbent)")
        self.nbytes = nbytes
        self.opts = opts
        self.candidates = list(candidates)
        self.times: list[list[float]] = [[] for _ in self.candidates]
        #: index -> why it was dropped (failed, refused, too slow).
        self.dropped: dict[int, str] = {}
        #: Exploring calls so far, and their total time (seconds, slowest rank's).
        self.calls = 0
        self.spent = 0.0
        self.winner: int | None = None
        self.reason = ""
        #: Warm-up calls made (the incumbent, untimed).
        self.warming = 0

    def score(self, i: int) -> float | None:
        """Candidate ``i``'s median time (seconds), ``None`` before its first call."""
        t = self.times[i]
        return statistics.median(t) if t else None

    def best(self) -> tuple[int, float] | None:
        """The fastest measured candidate not dropped, as (index, score)."""
        scored = [(s, i) for i in range(len(self.candidates)) if i not in self.dropped
                  and (s := self.score(i)) is not None]
        if not scored:
            return None
        s, i = min(scored)
        return i, s

    @property
    def overhead(self) -> float:
        """Seconds the exploring calls took beyond what the best candidate would have."""
        b = self.best()
        return max(0.0, self.spent - self.calls * b[1]) if b else 0.0

    def predicted_extra(self, i: int) -> float:
        """What one more call of candidate ``i`` is expected to cost beyond the best: its own
        score minus the best's once measured; before its first call, ``prune`` times the
        best's first call minus the best's score (the most a first call that is kept can
        cost: a slower one is dropped after that call, so its excess beyond this is the one
        overshoot no check can foresee). Nothing before any candidate is measured: the
        incumbent runs then, as untuned."""
        b = self.best()
        if b is None:
            return 0.0
        s = self.score(i)
        if s is None:
            return max(0.0, self.opts.prune * self.times[b[0]][0] - b[1])
        return max(0.0, s - b[1])

    def behind(self, i: int, best: int) -> float:
        """How many times slower candidate ``i`` is than candidate ``best``, like for like:
        a candidate called once against the best's first call (a first call carries one-off
        costs: pages of scratch touched; connections are opened at construction,
        ``connect_all``), else median against median."""
        if len(self.times[i]) == 1:
            s, b = self.times[i][0], self.times[best][0]
        else:
            s, b = self.score(i) or 0.0, self.score(best) or 0.0
        return s / b if b > 0 else (math.inf if s > 0 else 1.0)

    def pending(self) -> list[int]:
        """The candidates still to be called, in the order they should be: those never
        called (list order), then contenders (within ``prune`` times the best, ``behind``)
        short of ``samples`` calls, the least sampled and then the fastest first; when none
        is left, the final round: the two fastest (the runner-up within ``prune``) short of
        ``confirm`` calls. Empty: the class can settle."""
        live = [i for i in range(len(self.candidates)) if i not in self.dropped]
        fresh = [i for i in live if not self.times[i]]
        b = self.best()
        contenders = [i for i in live if self.times[i]
                      and len(self.times[i]) < self.opts.samples and b is not None
                      and self.behind(i, b[0]) <= self.opts.prune]
        contenders.sort(key=lambda i: (len(self.times[i]), self.score(i) or 0.0, i))
        if fresh or contenders or b is None:
            return fresh + contenders
        # The final round: the two fastest, the least sampled first.
        ranked = sorted((i for i in live if self.times[i]),
                        key=lambda i: (self.score(i) or 0.0, i))[:2]
        if len(ranked) < 2 or self.behind(ranked[1], ranked[0]) > self.opts.prune:
            return []
        finals = [i for i in ranked if len(self.times[i]) < self.opts.confirm]
        finals.sort(key=lambda i: (len(self.times[i]), self.score(i) or 0.0, i))
        return finals

    def decide(self, job_seconds: float, elsewhere: float = 0.0) -> Decision:
        """The next call's decision; ``job_seconds``: the job's time so far; ``elsewhere``:
        what exploring the job's other size classes has cost (the share is the job's).

        The first pending candidate whose predicted extra fits in what is left of
        ``share * job_seconds`` runs; when none fits, the best so far runs untimed
        (``hold``) until the job's time makes room."""
        if self.winner is not None:
            return Decision("settle", self.winner, self.candidates[self.winner], self.reason)
        if self.warming < self.opts.warmup:
            self.warming += 1
            return Decision("hold", 0, self.candidates[0],
                            f"warm-up call {self.warming} of {self.opts.warmup}")
        order = self.pending()
        if not order:
            return self._settle("every candidate measured")
        if self.calls >= self.opts.calls:
            return self._settle(f"{self.opts.calls} exploring calls")
        b = self.best()
        if b is None:
            return Decision("run", order[0], self.candidates[order[0]])
        room = self.opts.share * job_seconds - (self.overhead + elsewhere)
        for i in order:
            if self.predicted_extra(i) <= room:
                return Decision("run", i, self.candidates[i])
        first = order[0]
        return Decision("hold", b[0], self.candidates[b[0]],
                        f"exploration paused: {self.overhead + elsewhere:.3g} s beyond the "
                        f"best + {self.predicted_extra(first):.3g} s predicted for "
                        f"{self.candidates[first].text()} > {self.opts.share:g} of "
                        f"{job_seconds:.3g} s")

    def report(self, index: int, seconds: float, failure: str = "") -> str:
        """Record an exploring call of candidate ``index``: its slowest-rank time, or why it
        failed on some rank. Returns a line for the log when the candidate is done."""
        self.calls += 1
        self.spent += seconds
        if failure:
            self.dropped[index] = f"failed: {failure}"
            return self.dropped[index]
        before = self.best()
        self.times[index].append(seconds)
        if len(self.times[index]) == 1 and before is not None and index != before[0] \
                and self.behind(index, before[0]) > self.opts.prune:
            first = self.times[before[0]][0]
            self.dropped[index] = (f"too slow: first call {seconds * 1e6:.1f} us > "
                                   f"{self.opts.prune:g} x the best's first "
                                   f"{first * 1e6:.1f} us")
            return self.dropped[index]
        if len(self.times[index]) in (self.opts.samples, self.opts.confirm):
            s = self.score(index)
            assert s is not None
            return f"median {s * 1e6:.1f} us over {len(self.times[index])} call(s)"
        return ""

    def _settle(self, reason: str) -> Decision:
        b = self.best()
        win = 0 if b is None else b[0]
        inc = self.score(0) if 0 not in self.dropped else None
        if win != 0 and inc is not None and b is not None \
                and b[1] > (1.0 - self.opts.margin) * inc:
            win = 0  # within the margin of the incumbent: keep what the job runs anyway
        self.winner = win
        self.reason = reason
        return Decision("settle", win, self.candidates[win], reason)


#: Size classes from this size on also try the pipelined tier-aware grid across hosts.
PIPELINE_GUESS_BYTES = 8 << 20


def candidate_list(incumbent: Config, world_size: int, nbytes: int, hosts: int,
                   ranks_per_host: int | None, opts: OnlineOptions,
                   rng: random.Random, default: Config | None = None,
                   ) -> list[Config]:
    """The candidates of one size class: ``incumbent`` (the profile's choice, always
    first), then ``default`` (the built-in defaults' choice) and cheap guesses where the
    tuner's space holds them, then random configurations of the space, distinct after
    defaults are filled in, ``opts.candidates`` at most."""
    from .candidates import draw, in_space, normalised

    out: list[Config] = [incumbent]
    seen: set[Config] = set()
    try:
        seen.add(normalised(incumbent.with_transport(None), world_size))
    except ValueError:
        pass
    if world_size <= 1:
        return out  # every algorithm is a no-op on one rank: nothing to explore

    def add(cfg: Config, checked: bool) -> None:
        if len(out) >= opts.candidates:
            return
        try:
            norm = normalised(cfg, world_size)
        except ValueError:
            return  # refused by check_params: never explored
        if norm in seen or not (checked or in_space(cfg, world_size, nbytes, hosts)):
            return
        seen.add(norm)
        out.append(norm)

    guesses: list[Config] = []
    if default is not None:
        guesses.append(default)
    if hosts > 1:
        if ranks_per_host and ranks_per_host * hosts == world_size and ranks_per_host > 1:
            # The tier-aware grid: reduce-scatter inside hosts, then across them.
            grid = {"dims": [ranks_per_host, hosts], "rings": 1, "chunk_bytes": 0,
                    "inner": ["multiring", "multiring"]}
            if nbytes >= PIPELINE_GUESS_BYTES:
                # Large buckets: the same grid pipelined (1 MiB pieces, 8 in flight), what
                # the offline tuner chose on the emulated 2 x 2 at 64 MiB (1.55x native);
                # random draws alone rarely reach it within a class's few candidates.
                guesses.append(Config("hierarchical", {**grid, "chunk_bytes": 1 << 20,
                                                       "pipeline": 8}))
            guesses.append(Config("hierarchical", grid))
        from .natives import current

        flat = current().flat_composition
        if flat:
            guesses.append(Config("native", {"composition": flat}))
    guesses += [Config("native"), Config("multiring", {"rings": 2, "chunk_bytes": 0}),
                Config("rhd"), Config("multiring", {"rings": 1, "chunk_bytes": 0})]
    for g in guesses:
        add(g, False)
    tries = 0
    while len(out) < opts.candidates and tries < 20 * opts.candidates:
        tries += 1
        add(draw(rng, world_size, nbytes, hosts), True)
    return out


# -- the runtime (every rank) ----------------------------------------------------------------


class TuneOutLock:
    """An exclusive ``flock`` on ``FILE.lock``, held by rank 0 while the job may write FILE:
    two jobs writing one profile would each replace the other's choices. Released (and the
    lock file removed) at close; a killed job releases it with its last descriptor."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path) + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """``ValueError`` naming the file and the holder when another job holds it."""
        from .lockfile import LockBusy, take

        try:
            fd = take(self.path, f"pid {os.getpid()}")
        except OSError as exc:
            raise ValueError(f"{OUT_ENV}: cannot create the lock file {self.path} "
                             f"({exc.strerror or exc}); choose a writable file") from None
        except LockBusy as busy:
            raise ValueError(
                f"{OUT_ENV}: {self.path[:-5]} is being written by another job "
                f"({busy.holder}; lock {self.path}): give each job its own file") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        from .lockfile import release

        release(self.path, self._fd)
        self._fd = None


def job_name() -> str:
    """Which job this is, for the profile's header: the batch system's job id where one
    is set, else rank 0's host and process id."""
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID",
                "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var, "").strip()
        if value and value != "none":
            return f"{var}={value}"
    return f"{socket.gethostname()}:{os.getpid()}"


def _utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(
    ).replace("+00:00", "Z")


def prepare_settings(rank: int, tune: str | None, tune_out: str | os.PathLike[str] | None,
                     options: Mapping[str, Any] | OnlineOptions | None,
                     take_lock: bool = True) -> tuple[Any, TuneOutLock | None]:
    """This rank's tuning settings as a plain record for the construction agreement
    (``("online", options, out)``, ``("off",)``, or ``("error", line)``), and on rank 0 the
    output lock it took (unless ``take_lock`` is false: a tuner already holds it). Never
    raises: errors are agreed on first, then raised together."""
    lock = None
    try:
        if not resolve_mode(tune):
            return ("off",), None
        opts = resolve_options(options)
        out = resolve_out(tune_out)
        if out is not None and rank == 0 and take_lock:
            from .errors import ProfileError
            from .profile import check_writable

            try:
                check_writable(out)
            except ProfileError as exc:
                raise ValueError(f"{OUT_ENV}: {exc}") from None
            lock = TuneOutLock(out)
            lock.acquire()
        return ("online", tuple(sorted(opts.record().items())), out), lock
    except ValueError as exc:
        if lock is not None:
            lock.release()
        return ("error", f"rank {rank}: {exc}"), None


def agree_settings(everyone: Sequence[Any], rank: int) -> tuple[OnlineOptions, str | None] | None:
    """From every rank's ``prepare_settings`` record: the options in force (``None``: off),
    or ``ValueError`` on every rank naming the first rank in error or the ranks that differ."""
    from .errors import AgreementError

    errors = [e for e in everyone if e and e[0] == "error"]
    if errors:
        raise ValueError(errors[0][1])
    kinds = {repr(e) for e in everyone}
    if len(kinds) > 1:
        groups: dict[str, list[int]] = {}
        for r, e in enumerate(everyone):
            text = "off" if e[0] == "off" else (
                f"online {dict(e[1])} out={e[2]}")
            groups.setdefault(text, []).append(r)
        detail = "; ".join(f"ranks {v}: {k}" for k, v in groups.items())
        raise AgreementError(
            f"rank {rank}: ranks set different tuning options ({detail}): set "
            f"{TUNE_ENV}, {OUT_ENV} and RINGTUNE_TUNE_* (or tune=/tune_out=/tune_options=) "
            "the same on every rank")
    mine = everyone[rank]
    if mine[0] == "off":
        return None
    return OnlineOptions(**dict(mine[1])), mine[2]


@dataclass
class _Settled:
    """A settled class on every rank: its winner and what rank 0 measured."""

    config: Config
    calls: int = 0
    time_us: float | None = None
    incumbent_us: float | None = None
    reason: str = ""
    earlier: bool = False  # settled by an earlier job's profile
    #: The fastest of the library's own allreduce measured here: (params, seconds), what
    #: ``ringtune export`` writes for a rule the library cannot run.
    native: tuple[dict[str, Any], float] | None = None


class OnlineTuner:
    """The online tuning of one ``Communicator``: every rank holds one; rank 0 decides.

    The communicator calls ``call`` for a call without an explicit algorithm whose plan is
    not cached; once a class settles, its winner's plan is cached under the call's own key,
    so later calls never come here."""

    def __init__(self, comm: Any, opts: OnlineOptions, out: str | None,
                 lock: TuneOutLock | None) -> None:
        self.comm = comm
        self.opts = opts
        self.out = out
        self.lock = lock
        self.started = time.monotonic()
        self.started_utc = _utc_now()
        self.job = job_name()
        self.rng = random.Random(opts.seed)
        #: rank 0: class key -> its exploration.
        self.classes: dict[Any, SizeClass] = {}
        #: every rank: class key -> its winner.
        self.settled: dict[Any, _Settled] = {}
        #: every rank: class key -> (candidate index, plan key) of the candidate prepared last.
        self._current: dict[Any, tuple[int, Any]] = {}
        #: every rank: class key -> plan key of its incumbent's explicit plan.
        self._incumbent: dict[Any, Any] = {}
        self.calls = 0
        self.exploring_calls = 0
        self.explore_seconds = 0.0
        self.written: str | None = None
        self._closed = False
        prof = comm.profile
        self._earlier = _settled_sizes(prof)
        connect_all(comm.comm)
        _EXIT_WRITERS.add(self)

    # -- the call path ------------------------------------------------------------------

    def call(self, key: Any, flat: Any, backend: Any, op: str) -> None:
        """Run one call of class ``key`` (collective): explore, hold or settle."""
        comm = self.comm
        self.calls += 1
        nbytes = int(flat.size) * int(flat.dtype.itemsize)
        done = self.settled.get(key)
        if done is not None:  # settled, plan dropped since (clear_plans): plan it again
            comm.run_prepared(self._install(key, flat, backend, op, done.config), flat)
            return
        from .backend import check_buffer_dtype
        from .ops import check_op

        # Bad arguments: ValueError/TypeError on every rank before any communication.
        check_op(op)
        check_buffer_dtype(backend, flat.dtype)
        incumbent = comm.plan_for(nbytes, tuned=False)
        if comm.profile.backend != backend.name:
            # As the profile path does: a profile's transports were chosen for its own kind
            # of buffer; other buffers use theirs.
            incumbent = Plan(incumbent.algorithm, incumbent.params,
                             comm.default_transport(backend), incumbent.source,
                             incumbent.rule,
                             incumbent.min_bytes, incumbent.max_bytes, incumbent.measured)
        if comm.size == 1 or nbytes in self._earlier:
            # Nothing to explore (one rank), or settled by the job that wrote the profile:
            # the same on every rank, no decision to broadcast.
            why = "one rank" if comm.size == 1 else "settled by an earlier job"
            self.settled[key] = _Settled(_config_of(incumbent), reason=why,
                                         earlier=comm.size > 1)
            comm.run_prepared(self._install(key, flat, backend, op, _config_of(incumbent)),
                              flat)
            return
        t0 = time.perf_counter()
        decision = None
        if comm.rank == 0:
            decision = self._decide(key, nbytes, incumbent, flat)
        decision = comm.comm.bcast(decision, root=0)
        action, index, record, reason = decision
        config = Config.from_record(record["algorithm"], record["params"],
                                    record.get("transport"))
        if action == "settle":
            # The candidates' plans go (their scratch buffers with them): the winner is
            # planned again under the call's own key.
            self._drop_current(key, keep=None)
            inc_key = self._incumbent.pop(key, None)
            if inc_key is not None:
                comm.evict_plan(inc_key)
            self.settled[key] = _Settled(config, reason=reason)
            if comm.rank == 0:
                self._note_settled(key)
            comm.run_prepared(self._install(key, flat, backend, op, config), flat)
            self.explore_seconds += time.perf_counter() - t0
            return
        if action == "hold":
            comm.run_prepared(self._candidate(key, index, flat, backend, op, config), flat)
            self.explore_seconds += time.perf_counter() - t0
            return
        try:
            prepared = self._candidate(key, index, flat, backend, op, config)
        except (ValueError, TypeError) as exc:
            if index == 0:
                raise  # the job's own choice: its usual error, alike on every rank
            # Refused while planning (validation, alike on every rank): nothing ran.
            prepared = f"rank {comm.rank}: {type(exc).__name__}: " + (
                str(exc).strip().splitlines() or [""])[0][:200]
        self._explore(key, index, prepared, flat, backend, op, incumbent, t0)

    def _decide(self, key: Any, nbytes: int, incumbent: Plan,
                flat: Any) -> tuple[str, int, dict[str, Any], str]:
        sc = self.classes.get(key)
        if sc is None:
            comm = self.comm
            from .profile import builtin_profile

            _, rule = builtin_profile(comm.size).select(nbytes)
            hosts = len(set(comm.hosts))
            counts = [comm.hosts.count(h) for h in set(comm.hosts)]
            per_host = counts[0] if len(set(counts)) == 1 else None
            cands = candidate_list(_config_of(incumbent).with_transport(None), comm.size,
                                   nbytes, hosts, per_host, self.opts, self.rng,
                                   default=Config(rule.algorithm, rule.params))
            transport = incumbent.transport
            cands = [cands[0].with_transport(incumbent.transport)] + [
                c.with_transport(transport) for c in cands[1:]]
            sc = self.classes[key] = SizeClass(nbytes, cands, self.opts)
            if log.isEnabledFor(logging.INFO):
                log.info("online %s: %d candidate(s): %s", _label(key, nbytes), len(cands),
                         "; ".join(c.text() for c in cands))
        elsewhere = sum(o.overhead for k, o in self.classes.items() if k != key)
        d = sc.decide(time.monotonic() - self.started, elsewhere)
        return (d.action, d.index, d.config.record(), d.reason)

    def _candidate(self, key: Any, index: int, flat: Any, backend: Any, op: str,
                   config: Config) -> Any:
        """The prepared plan of candidate ``index`` (the previous candidate's plan of this
        class is dropped, so scratch memory holds one candidate at a time besides the
        incumbent). ``ValueError``/``TypeError`` when preparation refuses it."""
        params = dict(config.params)
        pkey = plan_key(flat, op, backend, config.algorithm, config.transport, params)
        self._drop_current(key, keep=pkey)
        self._current[key] = (index, pkey)
        if index == 0:
            self._incumbent[key] = pkey
        prepared = self.comm.cached_plan(pkey)
        if prepared is None:
            prepared = self.comm.prepare_plan(pkey, flat, backend, op, config.algorithm,
                                              config.transport, params)
        return prepared

    def _drop_current(self, key: Any, keep: Any) -> None:
        prev = self._current.pop(key, None)
        if prev is not None and prev[1] != keep and prev[0] != 0:
            self.comm.evict_plan(prev[1])

    def _explore(self, key: Any, index: int, prepared_or_none: Any, flat: Any, backend: Any,
                 op: str, incumbent: Plan, t0: float) -> None:
        """Run and time candidate ``index`` (a prepared plan, or why it was refused), then
        share every rank's time and failure: a failure anywhere drops it everywhere and the
        call completes with the incumbent from the kept input."""
        comm = self.comm
        failure = prepared_or_none if isinstance(prepared_or_none, str) else ""
        backup = None
        if index != 0 and not failure:
            # A failed candidate may leave the buffer half reduced: keep the input to
            # complete the call with the incumbent instead.
            backup = backend.empty(int(flat.size), str(flat.dtype))
            backend.copy_into(backup, flat)
            if backend.on_gpu:
                backend.synchronize()
        start = time.perf_counter()
        try:
            if not failure:
                prepared_or_none.run(flat)
                if prepared_or_none.avg:
                    backend.divide(flat, comm.size)
                if backend.on_gpu:
                    backend.synchronize()
        except Exception as exc:  # noqa: BLE001 - decided on every rank, below
            if index == 0:
                # The incumbent is what the job runs anyway: the usual error path.
                comm.fail(exc, prepared_or_none.plan, flat)
            failure = f"rank {comm.rank}: {type(exc).__name__}: " + (
                str(exc).strip().splitlines() or [""])[0][:200]
        seconds = time.perf_counter() - start
        everyone = comm.comm.allgather((failure, seconds))
        failures = [f for f, _ in everyone if f]
        slowest = max(s for _, s in everyone)
        if failures:
            dropped = self._current.pop(key, None)
            if dropped is not None:
                comm.evict_plan(dropped[1])
            if backup is not None:
                backend.copy_into(flat, backup)
            fallback = self._install_candidate_zero(key, flat, backend, op, incumbent)
            comm.run_prepared(fallback, flat)
        self.exploring_calls += 1
        self.explore_seconds += time.perf_counter() - t0
        if comm.rank == 0:
            sc = self.classes[key]
            line = sc.report(index, slowest, failures[0] if failures else "")
            if line and log.isEnabledFor(logging.INFO):
                log.info("online %s: explored %s: %s", _label(key, sc.nbytes),
                         sc.candidates[index].text(), line)

    def _install_candidate_zero(self, key: Any, flat: Any, backend: Any, op: str,
                                incumbent: Plan) -> Any:
        cfg = _config_of(incumbent)
        pkey = plan_key(flat, op, backend, cfg.algorithm, cfg.transport, dict(cfg.params))
        self._incumbent[key] = pkey
        return self.comm.cached_plan(pkey) or self.comm.prepare_plan(
            pkey, flat, backend, op, cfg.algorithm, cfg.transport, dict(cfg.params))

    def _install(self, key: Any, flat: Any, backend: Any, op: str, config: Config) -> Any:
        """Cache ``config``'s plan under the call's own key (algorithm ``None``): from now
        on this class runs it as a fixed profile's plan runs, no online code per call."""
        prepared = self.comm.prepare_plan(key, flat, backend, op, config.algorithm,
                                          config.transport, dict(config.params))
        p = prepared.plan
        prepared.plan = Plan(p.algorithm, p.params, p.transport, "online", None,
                             p.min_bytes, p.max_bytes, p.measured)
        return prepared

    def _note_settled(self, key: Any) -> None:
        sc = self.classes[key]
        st = self.settled[key]
        win = sc.winner if sc.winner is not None else 0
        st.calls = sc.calls
        s, inc = sc.score(win), sc.score(0)
        st.time_us = None if s is None else s * 1e6
        st.incumbent_us = None if inc is None else inc * 1e6
        natives = [(t, dict(c.params)) for i, c in enumerate(sc.candidates)
                   if c.algorithm == "native" and (t := sc.score(i)) is not None
                   and not sc.dropped.get(i, "").startswith("failed")]
        if natives:
            t, params = min(natives, key=lambda x: x[0])
            st.native = (params, t)
        if log.isEnabledFor(logging.INFO):
            vs = ""
            if s is not None and inc is not None and win != 0:
                vs = f", {inc / s:.2f}x the profile's choice ({inc * 1e6:.1f} us)"
            log.info("online %s: settled on %s after %d exploring call(s) (%s)%s; %d "
                     "dropped", _label(key, sc.nbytes), sc.candidates[win].text(), sc.calls,
                     st.reason, f": {s * 1e6:.1f} us" + vs if s is not None else "",
                     len(sc.dropped))

    # -- asking -------------------------------------------------------------------------

    def settled_for(self, nbytes: int) -> Config | None:
        """The winner settled for a message of ``nbytes`` (any dtype/op), if any."""
        for key, st in self.settled.items():
            if key[0] * _itemsize(key[1]) == nbytes:
                return st.config
        return None

    # -- persisting ---------------------------------------------------------------------

    def profile_dict(self) -> dict[str, Any]:
        """The profile this job tuned (rank 0's view): the loaded profile (or the built-in
        defaults) with each settled size's rule replaced, merged with its other shapes."""
        comm = self.comm
        prof = comm.profile
        data = _base_document(comm)
        winners: dict[int, _Settled] = {}
        for key, st in self.settled.items():
            winners.setdefault(key[0] * _itemsize(key[1]), st)
        for key, sc in self.classes.items():
            nb = key[0] * _itemsize(key[1])
            if key in self.settled or nb in winners:
                continue
            # Still exploring when the job ended (a size called a few times only, such as
            # DDP's first-step buckets): what was learnt is kept, so the next job does not
            # explore it again.
            b = sc.best()
            win = b[0] if b is not None else 0
            inc = sc.score(0)
            winners[nb] = _Settled(sc.candidates[win], sc.calls,
                                   None if b is None else b[1] * 1e6,
                                   None if inc is None else inc * 1e6,
                                   f"job ended after {sc.calls} exploring call(s)")
        base_rules = [dict(r) for r in _section(data, comm.size)["rules"]]
        # Transports that go without saying: the profile's own, and the engine's default
        # for each buffer kind (a job under the same engine maps the profile's to it).
        implied = {prof.transport}
        for key in self.settled:
            with contextlib.suppress(Exception):
                from .registry import get_backend

                implied.add(comm.default_transport(get_backend(key[3])))
        rules = merge_rules(base_rules, {nb: _rule_body(st, nb, comm.size, implied)
                                         for nb, st in winners.items() if not st.earlier})
        section = _section(data, comm.size)
        section["rules"] = rules
        if "source" in section:
            section["source"] = "tuned"
            section.pop("from_world_size", None)
        settled_sizes = sorted(set(self._earlier) | set(winners))
        previous = data.get("tuning")
        data["created"] = _utc_now()
        data["tool"] = {"name": "ringtune", "version": _version()}
        # The engine this job ran over, as an offline tune records it: a profile written
        # under torchrun that said nothing would read as MPI's and be set aside there.
        data["engine"] = _engine_record(comm)
        if data["engine"]["name"] != "mpi":
            data.pop("library", None)  # the MPI library's algorithms were not what ran
        data["tuning"] = {
            "mode": "online",
            "job": self.job,
            "started": self.started_utc,
            "ended": _utc_now(),
            "calls": self.calls,
            "exploring_calls": self.exploring_calls,
            "exploring_seconds": round(self.explore_seconds, 3),
            "base": prof.path if not prof.builtin else "built-in defaults",
            "options": self.opts.record(),
            "online_settled": settled_sizes,
            "classes": [
                {"bytes": nb, "algorithm": st.config.algorithm,
                 "params": _plain(dict(st.config.params)), "calls": st.calls,
                 "reason": st.reason,
                 **({"time_us": round(st.time_us, 3)} if st.time_us is not None else {}),
                 **({"incumbent_us": round(st.incumbent_us, 3)}
                    if st.incumbent_us is not None else {})}
                for nb, st in sorted(winners.items())],
            **({"previous": previous} if isinstance(previous, Mapping) else {}),
        }
        return data

    def save(self, path: str | None = None) -> str | None:
        """Rank 0 writes the tuned profile atomically to ``path`` (default: the tune_out
        file); other ranks write nothing. Returns the path written (rank 0) or ``None``."""
        target = path or self.out
        if target is None:
            raise ValueError(f"no file to write the tuned profile to: set {OUT_ENV} or pass "
                             "tune_out= (or a path)")
        if self.comm.rank != 0:
            return None
        from .profile import write_profile

        written = write_profile(self.profile_dict(), target)
        self.written = written
        log.info("online: wrote %s (%d size class(es) settled, %d exploring calls of %d)",
                 written, len(self.settled), self.exploring_calls, self.calls)
        return written

    def settled_reason(self, nbytes: int) -> str:
        """Why the size settled as it did, for ``explain``."""
        for key, st in self.settled.items():
            if key[0] * _itemsize(key[1]) == nbytes:
                return st.reason
        return "not settled"

    def discard(self) -> None:
        """Release the output lock without writing (construction failed)."""
        self._closed = True
        _EXIT_WRITERS.discard(self)
        if self.lock is not None:
            self.lock.release()

    def close(self) -> None:
        """Write the tuned profile (rank 0, where ``tune_out`` is set) and release the
        output lock; idempotent. Not collective: safe at interpreter exit."""
        if self._closed:
            return
        self._closed = True
        _EXIT_WRITERS.discard(self)
        try:
            if self.out is not None and self.comm.rank == 0:
                self.save()
        finally:
            if self.lock is not None:
                self.lock.release()


#: Tuners whose profile is still to be written at interpreter exit.
_EXIT_WRITERS: weakref.WeakSet[OnlineTuner] = weakref.WeakSet()


def connect_all(comm: Any) -> None:
    """Exchange one byte with every other rank of ``comm`` (collective), so that the
    connections a library opens on first use between two ranks (MPICH over libfabric's
    tcp, Open MPI's tcp BTL) are open before the first candidate is timed. Without it the
    first candidate to talk to a new peer pays for the connection and is judged slower
    than it is: the incumbent's warm-up call opened only its own peers.

    Ends with a barrier: a one-byte send to a peer whose connection is still being set up
    completes on the sender at once (MPICH over libfabric's tcp queues it) and reaches the
    peer only while the sender drives MPI's progress. A sender that went on to work that
    needs the peer through another library (DDP's first gloo collective) would never send
    it, and both would wait for ever. No rank leaves the barrier before every rank has
    entered it, i.e. received all its bytes; waiting in it, the senders make progress."""
    import numpy as np

    rank, size = comm.Get_rank(), comm.Get_size()
    out = np.zeros(1, dtype=np.uint8)
    got = np.zeros(1, dtype=np.uint8)
    for k in range(1, size):
        comm.Sendrecv(out, dest=(rank + k) % size, sendtag=0,
                      recvbuf=got, source=(rank - k) % size, recvtag=0)
    if size > 1:
        comm.Barrier()


@atexit.register
def _write_at_exit() -> None:
    for tuner in list(_EXIT_WRITERS):
        try:
            tuner.close()
        except Exception as exc:  # noqa: BLE001 - at exit: say it, do not hide others
            log.error("online: could not write %s: %s", tuner.out, exc)
            print(f"ringtune: online tuning: could not write {tuner.out}: {exc}",
                  file=sys.stderr, flush=True)


# -- helpers ---------------------------------------------------------------------------------


def _itemsize(dtype: Any) -> int:
    import numpy as np

    return int(np.dtype(dtype).itemsize) if str(dtype) != "bfloat16" else 2


def _label(key: Any, nbytes: int) -> str:
    return f"{nbytes} B {key[1]} {key[2]}"


def _config_of(plan: Plan) -> Config:
    return Config(plan.algorithm, dict(plan.params), plan.transport or None)


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _version() -> str:
    # The package's version, read from the package already imported (importing it here
    # would make a cycle: the package imports the communicator, which imports this).
    return str(getattr(sys.modules.get(__package__ or "collectives"), "__version__", "unknown"))


def _settled_sizes(prof: Any) -> frozenset[int]:
    """Sizes an earlier online job settled in this profile (``tuning.online_settled``)."""
    if prof.builtin:
        return frozenset()
    sizes = prof.tuning.get("online_settled")
    if not isinstance(sizes, list):
        return frozenset()
    return frozenset(s for s in sizes if isinstance(s, int) and not isinstance(s, bool))


def _rule_body(st: _Settled, nbytes: int, world: int, implied: set[str],
               ) -> dict[str, Any]:
    from .ops import busbw

    body: dict[str, Any] = {"algorithm": st.config.algorithm,
                            "params": _plain(dict(st.config.params))}
    if st.config.transport and st.config.transport not in implied:
        body["transport"] = st.config.transport
    if st.time_us:
        measured: dict[str, Any] = {"bytes": nbytes, "time_us": round(st.time_us, 3),
                                    "busbw_gbps": round(busbw(nbytes, st.time_us, world), 4)}
        body["measured"] = measured
    if st.native is not None and st.config.algorithm != "native":
        params, seconds = st.native
        entry: dict[str, Any] = {"bytes": nbytes, "impl": str(params.get("impl", "auto")),
                                 "busbw_gbps": round(busbw(nbytes, seconds * 1e6, world), 4),
                                 "time_us": round(seconds * 1e6, 3)}
        if params.get("composition"):
            entry["composition"] = str(params["composition"])
        body["native"] = [entry]
    return body


def merge_rules(base: list[dict[str, Any]], winners: Mapping[int, Mapping[str, Any]],
                ) -> list[dict[str, Any]]:
    """``base`` rules (sorted, contiguous, from 0 to ``None``) with each settled size's
    winner in force around it: from half to twice the size (the neighbourhood a bucket of
    ``ringtune tune``'s powers of 4 owns), within the base rule that holds it and split at
    the geometric midpoint with a settled neighbour; the rest of each base rule keeps its
    choice. Neighbours with the same choice are joined."""
    out: list[dict[str, Any]] = []
    sizes = sorted(winners)
    for rule in base:
        lo, hi = int(rule["min_bytes"]), rule["max_bytes"]
        inside = [s for s in sizes if s >= lo and (hi is None or s <= hi)]
        start = lo
        for j, s in enumerate(inside):
            own_lo = max(start, s // 2)
            own_hi = 2 * s
            if j + 1 < len(inside):
                own_hi = min(own_hi, max(s, math.isqrt(s * inside[j + 1])))
            if hi is not None:
                own_hi = min(own_hi, hi)
            if own_lo > start:
                out.append({**rule, "min_bytes": start, "max_bytes": own_lo - 1})
            out.append({"min_bytes": own_lo, "max_bytes": own_hi, **winners[s]})
            start = own_hi + 1
        if hi is None or start <= hi:
            out.append({**rule, "min_bytes": start, "max_bytes": hi})
    joined: list[dict[str, Any]] = []
    for r in out:
        prev = joined[-1] if joined else None
        if prev is not None and _same_choice(prev, r) and not (
                "measured" in prev and "measured" in r):
            prev["max_bytes"] = r["max_bytes"]
            if "measured" in r:
                prev["measured"] = r["measured"]
            if r.get("native"):
                prev["native"] = [*(prev.get("native") or []), *r["native"]]
            continue
        joined.append(dict(r))
    return joined


def _same_choice(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("algorithm") == b.get("algorithm") and a.get("transport") == b.get("transport")
            and Config(a["algorithm"], a.get("params") or {}) ==
            Config(b["algorithm"], b.get("params") or {}))


def _section(data: dict[str, Any], world: int) -> dict[str, Any]:
    """The mapping holding this world's ``rules`` in a whole profile document: the top level,
    or its ``shapes`` entry of that world size."""
    topo = data.get("topology") or {}
    if topo.get("world_size") == world:
        return data
    for sec in data.get("shapes") or []:
        if (sec.get("topology") or {}).get("world_size") == world:
            return sec  # type: ignore[no-any-return]
    return data


def _base_document(comm: Any) -> dict[str, Any]:
    """The whole document to merge into: the loaded profile file as it is (every shape),
    or a new profile for this world from the built-in defaults."""
    import copy

    prof = comm.profile
    if not prof.builtin and prof.path:
        from probes.safeload import InputError, parse_text, read_bounded

        try:
            whole = parse_text(read_bounded(prof.path, "profile"), prof.path)
        except (InputError, OSError):
            whole = None
        if isinstance(whole, Mapping):
            data = copy.deepcopy(dict(whole))
            if (data.get("topology") or {}).get("world_size") == comm.size or any(
                    (s.get("topology") or {}).get("world_size") == comm.size
                    for s in data.get("shapes") or [] if isinstance(s, Mapping)):
                return data
        data = copy.deepcopy(_plain(dict(prof.raw)))
        data.pop("shapes", None)
        return data
    topo: dict[str, Any] = {"world_size": comm.size}
    hosts = comm.hosts
    nh = len(set(hosts))
    counts = {hosts.count(h) for h in set(hosts)}
    topo["hosts"] = nh
    if len(counts) == 1:
        topo["ranks_per_host"] = counts.pop()
    t = comm.topology
    if t is not None and hasattr(t, "fingerprint"):
        with contextlib.suppress(Exception):
            topo["fingerprint"] = t.fingerprint()
            topo["summary"] = " ".join(str(t.summary()).split())[:200]
    from .registry import user_transport_names

    # A test-only transport (the in-process ``inproc``) is no profile's: written as mpi.
    transport = prof.transport if prof.transport in user_transport_names() else "mpi"
    data = {"format": "ringtune-profile", "version": 1, "topology": topo,
            "backend": prof.backend, "transport": transport,
            "dtype": prof.dtype, "op": prof.op,
            "rules": [r.to_dict() for r in prof.rules]}
    if comm.engine.name == "mpi":
        with contextlib.suppress(Exception):
            from .natives import library

            name, version = library()
            data["library"] = {"name": name, "version": version}
    return data


def _engine_record(comm: Any) -> dict[str, str]:
    """The profile's ``engine`` record for the engine behind ``comm`` (what
    ``autotune.choose.build_profile`` writes after an offline tune)."""
    desc = comm.engine.describe(comm.comm)
    record = {"name": desc["engine"]}
    if desc.get("backend"):
        record["backend"] = desc["backend"]
    if desc["engine"] == "torch":
        import torch

        record["version"] = str(torch.__version__)
    return record


def refuse_set_aside(comm: Any) -> None:
    """Online tuning over a loaded profile that does not fit this world (set aside for the
    built-in defaults): what it wrote would mix two shapes. ``TopologyMismatchError`` on
    every rank (the decision is alike everywhere), before the first step."""
    from .errors import TopologyMismatchError

    if comm.set_aside and comm.online is not None and comm.online.out is not None:
        raise TopologyMismatchError(
            f"rank {comm.rank}: {comm.set_aside}; online tuning would write {comm.online.out}"
            " for this shape from it: load a profile for this shape (or none), or write "
            f"another {OUT_ENV}")


__all__ = ["MODES", "OUT_ENV", "TUNE_ENV", "Decision", "OnlineOptions", "OnlineTuner",
           "SizeClass", "candidate_list", "merge_rules"]
