"""The tuning run: one Optuna study per size bucket, then the A/B choice, then the profile.

Use ``tune(comm, options)`` on every rank of the world to tune (``ringtune tune`` does).
Rank 0 owns the Optuna storage (SQLite has one writer) and asks for each trial
(``autotune.bucket_search``); the trial's configuration is broadcast, every rank checks and
times it (``autotune.objective.evaluate``), and rank 0 tells the result. Every decision that
changes control flow is broadcast from rank 0 (``autotune.lockstep``), so all ranks take the
same path and an error raises the same exception on every rank.

``--backend`` decides where the buffers live (``resolve_backend``, collective): on GPU
buffers (``cupy``) the search space gains ``transport`` over the GPU transports every rank
can use, ``native`` is measured with the best of them, and the profile records
``backend: cupy`` and each rule's transport. Host buffers (``numpy``) probe nothing GPU.

Each bucket's study is named from the topology fingerprint, backend, dtype, op and size
(``autotune.naming``); resume and timeout rules are in ``autotune.bucket_search``; the A/B
choice and the profile in ``autotune.choose``; the records in ``autotune.records``.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from typing import Any, TextIO

from collectives import Communicator
from collectives.bench import busbw, time_allreduce
from collectives.ops import itemsize
from collectives.profile import builtin_profile, dump_profile, write_profile

from . import replay, space, storage_errors
from .bucket_search import SAMPLERS, Driver
from .choose import AB_SHARE, ab_choice, build_profile, native_config
from .lockstep import abort, on_root
from .machine import BUSY_MODES, TuneWatch, load_record, save_record
from .naming import default_storage, study_name, world_identity
from .objective import TrialOutcome, evaluate, timing_for
from .progress import Progress, best_text, gbps_text, size_text
from .records import BucketSummary, Choice, TuneError, TuneOptions, TuneResult
from .storelock import storage_lock
from .watchdog import Watchdog

__all__ = ["TuneError", "TuneOptions", "TuneResult", "tune", "world_identity"]


def tune(comm: Any, opts: TuneOptions, out: TextIO = sys.stdout,
         write: bool = True) -> TuneResult:
    """The whole tuning run (collective over ``comm``, an mpi4py communicator), holding
    the storage's lock (``autotune.storelock``) from before it is opened until the profile
    is written. ``write=False``: build the profile but leave writing it to the caller
    (``--shapes``)."""
    with storage_lock(comm, opts):
        return _tune(comm, opts, out, write)


def _tune(comm: Any, opts: TuneOptions, out: TextIO, write: bool) -> TuneResult:
    t_start = time.monotonic()
    rank, n = comm.Get_rank(), comm.Get_size()
    if opts.sampler not in SAMPLERS:
        raise TuneError(f"--sampler: unknown sampler {opts.sampler!r}; use one of "
                        f"{', '.join(SAMPLERS)}", usage=True)
    if opts.busy not in BUSY_MODES:
        raise TuneError(f"--busy {opts.busy!r}: use one of {', '.join(BUSY_MODES)}",
                        usage=True)
    try:
        algorithms = space.searchable(opts.algorithms)
    except ValueError as exc:
        raise TuneError(str(exc), usage=True) from None
    opts.storage = opts.storage or default_storage(opts.out)
    opts.backend, opts.transports = resolve_backend(comm, opts.backend)
    if opts.backend == GPU_BACKEND and not opts.algorithms:
        # Host-memory algorithms (shm) cannot move GPU buffers: not worth a trial there.
        algorithms = space.searchable(None, gpu=True)
    identity = world_identity(comm)
    runtime = Communicator(comm, profile=builtin_profile(n))
    progress = Progress(opts.progress and rank == 0, len(opts.buckets))
    # How busy the host is, sampled on rank 0 from here to the end (autotune.machine).
    watch = TuneWatch(comm, opts.busy, opts.job_pids)

    storage: Any = None

    def open_storage() -> None:
        nonlocal storage
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage_errors.watch(str(opts.storage))
        try:
            storage = optuna.storages.RDBStorage(str(opts.storage))
        except Exception as exc:  # noqa: BLE001 - one clear line for a bad --storage
            raise TuneError(f"--storage {opts.storage}: cannot open the Optuna storage "
                            f"({type(exc).__name__}: {exc})", usage=True) from None
        if opts.fresh:
            names = {study_name(opts.study, identity["fingerprint"], opts.dtype, opts.op, b,
                                opts.backend, opts.transports)
                     for b in opts.buckets}
            for s in optuna.get_all_study_summaries(storage=storage,
                                                    include_best_trial=False):
                if s.study_name in names:
                    optuna.delete_study(study_name=s.study_name, storage=storage)

    on_root(comm, open_storage)
    busy_now = on_root(comm, watch.before)
    waited_s = 0.0
    if busy_now and opts.busy == "wait":
        t_wait = time.monotonic()
        busy_now = on_root(comm, functools.partial(watch.wait, opts.busy_wait_s, _say))
        waited_s = time.monotonic() - t_wait  # the wait is not the search's --budget
    watchdog = Watchdog(opts.trial_timeout_s if rank == 0 else None,
                        abort=lambda msg: abort(comm, msg))
    summaries: list[BucketSummary] = []
    budget_end = t_start + waited_s + opts.budget_s * (1 - AB_SHARE)
    try:
        for index, nbytes in enumerate(opts.buckets):
            name = study_name(opts.study, identity["fingerprint"], opts.dtype, opts.op,
                              nbytes, opts.backend, opts.transports)
            summaries.append(_tune_bucket(comm, runtime, opts, storage, name, nbytes, index,
                                          algorithms, budget_end, progress, watchdog))
            # Broadcast: the A/B stage's reuse of recorded choices depends on it.
            busy_now = on_root(comm, functools.partial(
                watch.sample, f"bucket {size_text(nbytes)}"))
    finally:
        watchdog.close()
    choices, remeasured = _choices(comm, runtime, opts, storage, summaries, progress,
                                   watch, bool(busy_now))
    # Seconds spent measuring, from the storage: true across resumed runs, and the same
    # on a rerun with nothing left to do (so the profile is too).
    seconds = sum(s.trial_seconds for s in summaries) + sum(c.seconds for c in choices)
    profile = build_profile(identity, opts, summaries, choices, seconds, algorithms,
                            engine=runtime.engine.describe(runtime.comm))
    if opts.tensor_bytes:
        from .fusion import tuned_fusion

        # Recorded in the storage like the A/B choices: a rerun reuses it (same bytes).
        profile["fusion"] = tuned_fusion(comm, storage, summaries[0].study, profile,
                                         opts.tensor_bytes, opts.dtype,
                                         max(5.0, 0.1 * opts.budget_s), say=progress.line)

    measured_now = remeasured or sum(s.added for s in summaries) > 0

    def machine() -> tuple[dict[str, Any] | None, str]:
        watch.sample("after")
        first = summaries[0].study if summaries else None
        if measured_now or first is None:
            record = watch.record()
            if first is not None:
                save_record(storage, first, record)
            return record, watch.reason
        # Nothing measured: the figures are the earlier run's, and so is the record (the
        # same profile bytes as that run wrote).
        record = load_record(storage, first)
        return record, str((record or {}).get("busy") or "")

    record, busy = on_root(comm, machine)
    if record:
        profile["tuning"]["machine"] = record
    if busy and opts.busy == "refuse" and write:
        raise TuneError(refusal(busy, opts.out), usage=True)

    def write_out() -> tuple[str, bool]:
        return _write_if_changed(profile, opts.out)

    path, rewritten = on_root(comm, write_out) if write else (opts.out, False)
    runtime.close()
    return TuneResult(profile, summaries, choices, time.monotonic() - t_start, path,
                      rewritten, busy=busy)


def refusal(busy: str, out: str) -> str:
    """``--busy refuse``'s one line: what was busy, that nothing was written, the ways on."""
    return (f"--busy refuse: the machine was busy during the tune ({busy}): no profile "
            f"written to {out}; the trials are kept: rerun on a quiet machine (the choices "
            "measured while busy are measured again; --fresh redoes the search too), or "
            "--busy warn to write it anyway")


def _say(text: str) -> None:
    """A line to the user from rank 0 (stderr, like the progress display), even under
    --no-progress: a wait must not look like a hang."""
    print(f"ringtune: {text}", file=sys.stderr, flush=True)


def _choices(comm: Any, runtime: Communicator, opts: TuneOptions, storage: Any,
             summaries: list[BucketSummary], progress: Progress, watch: TuneWatch,
             busy_now: bool) -> tuple[list[Choice], bool]:
    """Each bucket's A/B choice: the one recorded in its study when it was made from the
    same candidates (``autotune.replay``) and, under ``--busy wait|refuse``, not on a busy
    machine while this one is quiet (``busy_now``), else measured now and recorded.
    Returns the choices and whether any was measured now."""
    n = comm.Get_size()
    recorded = on_root(comm, lambda: replay.load_choices(storage, [s.study for s in summaries]))
    choices: list[Choice] = []
    announced = False
    for i, s in enumerate(summaries):
        inputs = replay.choice_inputs(opts, summaries, i, n)
        choice = replay.reuse(recorded[i], inputs)
        if choice is not None and choice.busy and not busy_now and opts.busy != "warn":
            # Measured on a busy machine, and a quiet machine's figures asked for (--busy
            # wait|refuse): this quiet one measures it again. Under warn (the default) a
            # rerun with nothing new keeps writing the same bytes.
            choice = None
        if choice is None:
            if not announced:
                progress.line("re-measuring the best candidates against native "
                              "(interleaved A/B)")
                announced = True
            t0 = time.monotonic()
            measured = ab_choice(runtime, opts, summaries, i)
            measured.seconds = time.monotonic() - t0

            def save(measured: Choice = measured, study: str = s.study,
                     inputs: dict[str, Any] = inputs, nbytes: int = s.nbytes) -> Choice:
                measured.busy = bool(watch.sample(f"A/B {size_text(nbytes)}"))
                return replay.save_choice(storage, study, measured, inputs)

            choice = on_root(comm, save)
        choices.append(choice)
    if not announced:
        progress.line("every bucket's A/B choice is recorded in the storage: reused")
    return choices, announced


def _write_if_changed(profile: dict[str, Any], path: str) -> tuple[str, bool]:
    """Write the profile unless the file already holds exactly this text (a rerun with
    nothing new): ``(path, rewritten)``."""
    text = dump_profile(profile)
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                return path, False
    except (OSError, UnicodeDecodeError):
        pass
    return write_profile(profile, path), True


#: The backend whose buffers live on GPUs and whose transports the tuner searches (the GPU
#: plug-in's); any other registered backend is tuned over its default transport.
GPU_BACKEND = "cupy"


def tunable_backends() -> list[str]:
    """``--backend`` values: ``auto`` and every registered backend (``collectives.registry``:
    the built-in ``numpy``, and the plug-ins')."""
    from collectives.registry import backend_names

    return ["auto", *backend_names()]


#: The one-line fix for GPU tuning where CuPy or a GPU is missing.
CUPY_FIX = ("install the GPU extra (pip install 'ringtune[cuda]') on a machine with an "
            "NVIDIA GPU on every rank, or tune host buffers with --backend numpy")


def cupy_missing(why: str, where: str = "") -> str:
    """The one-line error of ``--backend cupy`` where CuPy or a GPU is missing."""
    why = why.split("; install it with")[0]  # the fix follows once, in full
    return f"--backend cupy: no usable GPU{where} ({why}): {CUPY_FIX}"


def common_transports(lists: list[list[str]]) -> list[str]:
    """The transports in every rank's list, in rank 0's order of preference."""
    if not lists:
        return []
    return [t for t in lists[0] if all(t in other for other in lists[1:])]


def resolve_backend(comm: Any, asked: str) -> tuple[str, list[str] | None]:
    """``(backend, transports)`` for ``--backend asked`` (collective; the same on every
    rank). ``numpy``: host buffers, nothing probed. ``cupy``: GPU buffers, searched over the
    transports every rank can use (``TuneError`` usage when there are none). ``auto``:
    ``cupy`` when rank 0 has GPU transports and every rank shares one, else ``numpy``. Any
    other registered backend: its buffers over its default transport, nothing probed."""
    names = tunable_backends()
    if asked not in names:
        raise TuneError(f"--backend {asked!r}: use one of {', '.join(names)}", usage=True)
    if asked not in ("auto", GPU_BACKEND):
        return asked, None
    from collectives.cuda import available_transports
    from collectives.cuda.detect import cupy_status

    error = ""
    try:
        # The collective form: ``nccl`` is decided from every rank's bound GPU.
        mine = available_transports(comm)
    except Exception as exc:  # noqa: BLE001 - e.g. a bad $RINGTUNE_CUDA_AWARE: every rank
        mine, error = [], f"{type(exc).__name__}: {exc}"  # must learn of it, not just one
    why = "" if mine else error or cupy_status()[1] or "no GPU transport"
    everyone = comm.allgather((mine, why, error))
    failed = [(r, e) for r, (_, _, e) in enumerate(everyone) if e]
    if failed:
        raise TuneError(f"--backend {asked}: rank {failed[0][0]}: {failed[0][1]}", usage=True)
    lists = [m for m, _, _ in everyone]
    common = common_transports(lists)
    if asked == "auto":
        return ("cupy", common) if lists[0] and common else ("numpy", None)
    if not common:
        missing = [r for r, (m, _, _) in enumerate(everyone) if not m]
        if missing:
            r = missing[0]
            raise TuneError(cupy_missing(everyone[r][1], f" on rank {r}"), usage=True)
        detail = "; ".join(f"rank {r}: {', '.join(m)}"
                           for r, (m, _, _) in enumerate(everyone))
        raise TuneError(f"--backend cupy: the ranks share no GPU transport ({detail}): "
                        f"{CUPY_FIX}", usage=True)
    return "cupy", common


def _record(driver: Driver | None, outcome: TrialOutcome) -> None:
    assert driver is not None
    driver.record(outcome)


def _tune_bucket(comm: Any, runtime: Communicator, opts: TuneOptions, storage: Any,
                 name: str, nbytes: int, index: int, algorithms: list[str],
                 budget_end: float, progress: Progress, watchdog: Watchdog) -> BucketSummary:
    rank, n = comm.Get_rank(), comm.Get_size()
    driver: Driver | None = None

    def open_study() -> str | None:
        nonlocal driver
        driver = Driver(opts, storage, name, nbytes, n, algorithms,
                        len(set(runtime.hosts)))
        if driver.finished:
            return driver.finished
        driver.prepare()
        return None

    finished = on_root(comm, open_study)
    if finished:
        summary = on_root(comm, lambda: driver.finish(finished))  # type: ignore[union-attr]
        progress.line(f"bucket {index + 1}/{len(opts.buckets)} {size_text(nbytes)}: finished "
                      f"earlier ({finished}, {summary.evaluated} trials), not redone")
        return summary
    # Iterations per candidate from a short timing of native (same on every rank).
    native = native_config(opts, n)
    count = nbytes // itemsize(opts.dtype)
    sample = time_allreduce(runtime, count, opts.dtype, opts.op, native.algorithm,
                            dict(native.params), warmup=1, iters=3,
                            transport=native.transport, backend=opts.backend)
    timing = timing_for(sample.time_us)
    # This bucket's share of what is left of the search budget (later buckets are larger).
    weights = [1.0 + math.log(b / opts.buckets[0] + 1, 64) for b in opts.buckets[index:]]
    deadline = time.monotonic() + max(0.0, budget_end - time.monotonic()) * (
        weights[0] / sum(weights))

    while True:
        cmd = on_root(comm, lambda: driver.next_command(deadline))  # type: ignore[union-attr]
        if cmd["op"] == "done":
            reason = cmd["reason"]
            break
        desc = f"{cmd['number']} of bucket {size_text(nbytes)} ({cmd['config'].text()})"
        if rank == 0:
            assert driver is not None
            watchdog.arm(desc, functools.partial(driver.record_timeout,
                                                 timeout_s=watchdog.timeout_s or 0))
        outcome = evaluate(runtime, nbytes, opts.dtype, opts.op, cmd["config"], timing,
                           cmd["best"], backend=opts.backend)
        if rank == 0:
            watchdog.disarm()
        on_root(comm, functools.partial(_record, driver, outcome))
        if rank == 0 and driver is not None:
            progress.update(index, nbytes, driver.evaluated, opts.trials,
                            best_text(driver.best, nbytes, n))
    summary = on_root(comm, lambda: driver.finish(reason))  # type: ignore[union-attr]
    if summary.top:
        cfg, t = summary.top[0]
        best = f"{cfg.text()} {gbps_text(busbw(nbytes, t, n))}"
    else:
        best = "nothing passed the check"
    progress.line(f"bucket {index + 1}/{len(opts.buckets)} {size_text(nbytes)}: "
                  f"{summary.evaluated} trials ({reason}); best {best}")
    return summary
