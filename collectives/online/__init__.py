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

The package, one concept a module: ``options`` (the options and the ``RINGTUNE_TUNE*``
variables), ``settings`` (each rank's settings and their agreement at construction),
``lock`` (the output file's lock), ``guesses`` (a size class's candidates), ``race`` (rank
0's decisions: the race between the candidates), ``tuner`` (the call path on every rank,
``OnlineTuner``) and ``document`` (the tuned profile it writes). It works on a
``Communicator`` through its public plan cache only (``cached_plan``, ``prepare_plan``,
``evict_plan``, ``run_prepared``, ``fail``, ``default_transport``).
"""

from __future__ import annotations

from ..candidates import PIPELINE_GUESS_BYTES
from .document import merge_rules
from .guesses import candidate_list
from .lock import TuneOutLock
from .options import (
    MODES,
    OUT_ENV,
    TUNE_ENV,
    OnlineOptions,
    resolve_mode,
    resolve_options,
    resolve_out,
)
from .race import Decision, SizeClass
from .settings import agree_settings, prepare_settings, refuse_set_aside
from .tuner import OnlineTuner, connect_all, job_name

__all__ = ["MODES", "OUT_ENV", "PIPELINE_GUESS_BYTES", "TUNE_ENV", "Decision",
           "OnlineOptions", "OnlineTuner", "SizeClass", "TuneOutLock", "agree_settings",
           "candidate_list", "connect_all", "job_name", "merge_rules", "prepare_settings",
           "refuse_set_aside", "resolve_mode", "resolve_options", "resolve_out"]
