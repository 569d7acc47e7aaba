"""Rank 0's decisions in online tuning: the race between a size class's candidates.

``SizeClass`` holds one class's candidates and their times and says what each call does
(``Decision``: explore a candidate, hold the best so far, or settle). Pure logic, no
communication and no clock (the job's time is passed in), so it is tested on its own.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..plan import Config
from .options import OnlineOptions


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

    def fastest_native(self) -> tuple[dict[str, Any], float] | None:
        """The fastest ``native`` candidate that did not fail, as (params, score): what
        ``ringtune export`` writes for a rule the library cannot run. ``None``: none
        measured."""
        natives = [(t, dict(c.params)) for i, c in enumerate(self.candidates)
                   if c.algorithm == "native" and (t := self.score(i)) is not None
                   and not self.dropped.get(i, "").startswith("failed")]
        if not natives:
            return None
        t, params = min(natives, key=lambda x: x[0])
        return params, t

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
