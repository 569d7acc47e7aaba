"""The records a tuning run passes around: what was asked, what each bucket found, what was
chosen, and the failure every rank raises alike.

Use these types to read or build the inputs and outputs of ``autotune.tuning.tune`` (the
``ringtune tune`` command fills ``TuneOptions``; the report and the profile builder read
``BucketSummary`` and ``Choice``). Plain data only: nothing here talks to MPI or Optuna.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collectives.plan import Config


class TuneError(Exception):
    """A tuning failure raised identically on every rank. ``usage`` means bad input."""

    def __init__(self, message: str, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class TuneOptions:
    """What ``ringtune tune`` was asked for (see its ``--help``)."""

    out: str
    buckets: list[int]
    trials: int = 30
    budget_s: float = 240.0
    storage: str | None = None
    study: str | None = None
    sampler: str = "tpe"
    seed: int = 0
    trial_timeout_s: float | None = 120.0
    margin: float = 0.03
    algorithms: list[str] | None = None
    dtype: str = "float32"
    op: str = "sum"
    fresh: bool = False
    report: str | None = None
    progress: bool = True
    #: Where the tuned buffers live: ``numpy`` (host), ``cupy`` (GPU) or ``auto`` (decided
    #: collectively by ``tune``, which replaces it with the backend it chose).
    backend: str = "numpy"
    #: GPU transports every rank can use, best first (``tune`` fills it in on ``cupy``; the
    #: search space's ``transport`` parameter). ``None`` for host buffers.
    transports: list[str] | None = None
    #: Seconds to wait for another run holding the storage to end instead of refusing
    #: (``--wait [SECONDS]``; ``math.inf``: no limit; 0: refuse at once).
    wait: float = 0.0
    #: ``--workload``: tensor sizes on which allreduce_many's bucket size is searched.
    tensor_bytes: list[int] | None = None
    #: ``--busy``: what a busy machine does to the run (``autotune.machine``): ``warn``
    #: (say so, mark, write), ``wait`` (wait up to ``busy_wait_s`` for a quiet machine
    #: first) or ``refuse`` (measure, but write no profile if it was busy).
    busy: str = "warn"
    busy_wait_s: float = 600.0
    #: The job's rank processes on rank 0's host when the tuned communicator is part of a
    #: larger job (``--shapes``: the other ranks spin too and are not "other processes");
    #: ``None``: the tuned communicator's own ranks.
    job_pids: list[int] | None = None


@dataclass
class BucketSummary:
    """What a bucket's study found (built on rank 0 from storage, broadcast to all)."""

    nbytes: int
    study: str
    reason: str
    evaluated: int
    #: Best distinct COMPLETE configurations, fastest first: (configuration, time_us).
    top: list[tuple[Config, float]] = field(default_factory=list)
    #: Fastest COMPLETE configuration of each algorithm: name -> (configuration, time_us).
    best_by_algorithm: dict[str, tuple[Config, float]] = field(default_factory=dict)
    #: When the bucket's measured trials ran, from the storage (UTC, ISO 8601; ``None``
    #: before any), and the seconds they took together: true across resumed runs.
    first_trial: str | None = None
    last_trial: str | None = None
    trial_seconds: float = 0.0
    #: Trials measured by this run (0 for a bucket finished by an earlier one).
    added: int = 0


@dataclass
class Choice:
    """The A/B outcome of one bucket."""

    nbytes: int
    config: Config
    time_us: float
    native_time_us: float
    busbw_gbps: float
    native_busbw_gbps: float
    #: Every configuration of the A/B with its median time (µs), native first.
    candidates: list[tuple[Config, float]] = field(default_factory=list)
    #: When the A/B ran (UTC, ISO 8601) and how long it took; a rerun on a finished study
    #: reuses the recorded choice with these (``autotune.replay``).
    measured_at: str | None = None
    seconds: float = 0.0
    #: Why native was kept over a faster-looking candidate ("" otherwise): not a win by
    #: ``--margin``, within native's noise, or lost in the confirmation (``choose.confirm``).
    note: str = ""
    #: The A/B's spread exceeded the difference between the choice and its runner-up
    #: (``choose.ab_stability``): the choice may be the machine's noise; ``spread`` is that
    #: spread (a fraction of the median).
    unstable: bool = False
    spread: float = 0.0
    #: The machine was busy while this A/B ran (``autotune.machine``): a rerun on a quiet
    #: machine measures it again instead of reusing it (``autotune.replay``).
    busy: bool = False

    @property
    def algorithm(self) -> str:
        return self.config.algorithm

    @property
    def params(self) -> dict[str, Any]:
        """The chosen algorithm's own parameters (a plain copy)."""
        return dict(self.config.params)

    @property
    def transport(self) -> str | None:
        return self.config.transport

    @property
    def speedup(self) -> float:
        return self.native_time_us / self.time_us if self.time_us > 0 else 1.0


@dataclass
class TuneResult:
    profile: dict[str, Any]
    buckets: list[BucketSummary]
    choices: list[Choice]
    seconds: float
    path: str
    #: False when the file already held exactly this profile (a rerun with nothing new).
    rewritten: bool = True
    #: Why the machine was busy during this run (``autotune.machine``), "" when it was not.
    busy: str = ""

    @property
    def added(self) -> int:
        """Trials this run measured (0 on a rerun of a finished tune)."""
        return sum(b.added for b in self.buckets)
