"""The objective of one tuning trial: check a candidate, time it briefly, prune or time it.

Use ``evaluate`` on every rank with the same arguments (it is collective): it returns the
same ``TrialOutcome`` everywhere, so rank 0 can tell Optuna while the other ranks move on
in step. Timing comes from ``collectives.bench`` (nccl-tests conventions: slowest rank per
iteration, median over iterations), so a trial's number means what ``ringtune bench``
prints.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectives import Communicator
from collectives.bench import check_allreduce, time_allreduce
from collectives.ops import itemsize
from collectives.plan import Config

COMPLETE = "complete"
FAIL = "fail"
PRUNED = "pruned"
#: A trial stopped by the watchdog (``--trial-timeout``): evidence about the machine at that
#: moment, not a verdict on the configuration, so it is retried once on a later run.
TIMEOUT = "timeout"


@dataclass(frozen=True)
class Timing:
    """How long to measure one candidate at one size (chosen per bucket)."""

    warmup: int = 2
    iters: int = 10
    #: Iterations of the short first timing that decides pruning.
    quick_iters: int = 3
    #: A candidate whose short timing is this many times the bucket's best is pruned.
    prune_factor: float = 2.0


@dataclass(frozen=True)
class TrialOutcome:
    """What one trial found: identical on every rank."""

    state: str
    time_us: float | None = None
    busbw_gbps: float | None = None
    reason: str | None = None


def timing_for(sample_time_us: float, target_s: float = 0.15) -> Timing:
    """Iterations so that one candidate's timing takes about ``target_s`` (3..20): long
    messages get few iterations, short ones the nccl-tests-like 20."""
    t = max(sample_time_us, 1.0) * 1e-6
    iters = int(max(3, min(20, round(target_s / t))))
    return Timing(warmup=max(1, min(5, iters // 4)), iters=iters,
                  quick_iters=max(2, min(5, iters // 4)))


def evaluate(comm: Communicator, nbytes: int, dtype: str, op: str, config: Config,
             timing: Timing, best_time_us: float | None = None,
             backend: str = "numpy") -> TrialOutcome:
    """Check ``config`` for correctness at ``nbytes``, then time it.

    A wrong result or an error is ``FAIL`` with the reason; a candidate whose short first
    timing is ``prune_factor`` times slower than ``best_time_us`` is ``PRUNED``; otherwise
    ``COMPLETE`` with the median time of ``timing.iters`` iterations. Collective.

    ``backend`` is where the buffers live (``numpy`` or ``cupy``); the configuration's
    ``transport`` (GPU configurations) is the one the candidate is checked and timed with.
    """
    count = nbytes // itemsize(dtype)
    algorithm, own, transport = config.algorithm, dict(config.params), config.transport
    try:
        check = check_allreduce(comm, count, dtype, op, algorithm, own, transport=transport,
                                backend=backend)
        if check.error:
            return TrialOutcome(FAIL, reason=f"error: {check.error}")
        if check.wrong:
            return TrialOutcome(FAIL, reason=f"wrong result: {check.wrong} mismatched "
                                             f"elements over all ranks")
        if best_time_us is not None and timing.quick_iters < timing.iters:
            quick = time_allreduce(comm, count, dtype, op, algorithm, own,
                                   warmup=1, iters=timing.quick_iters, transport=transport,
                                   backend=backend)
            if quick.time_us > timing.prune_factor * best_time_us:
                return TrialOutcome(PRUNED, quick.time_us, quick.busbw_gbps,
                                    reason=f"pruned: {quick.time_us:.1f} us > "
                                           f"{timing.prune_factor:g} x best "
                                           f"{best_time_us:.1f} us")
        m = time_allreduce(comm, count, dtype, op, algorithm, own,
                           warmup=timing.warmup, iters=timing.iters, transport=transport,
                           backend=backend)
        return TrialOutcome(COMPLETE, m.time_us, m.busbw_gbps)
    finally:
        # Plans keep scratch buffers as large as the message: drop them between candidates
        # so a 64 MiB bucket does not hold one scratch per configuration tried.
        comm.clear_plans()

