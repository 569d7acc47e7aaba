"""The online tuner on every rank: the call path of a ``Communicator`` that tunes online.

``OnlineTuner`` runs one call of a size class that has not settled (collective: rank 0's
decision is broadcast, every rank runs it, the times and failures are allgathered),
installs a settled class's winner in the communicator's plan cache, and writes the tuned
profile (``collectives.online.document``) at ``close()``, at exit or on ``save``. It uses
the communicator's public plan cache only. ``connect_all`` opens every pair's connection
before the first candidate is timed.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import socket
import sys
import time
import weakref
from typing import Any

from ..plan import Config, Plan, plan_key
from .document import Settled, itemsize, tuned_document, utc_now
from .guesses import candidate_list
from .lock import TuneOutLock
from .options import OUT_ENV, OnlineOptions
from .race import SizeClass

log = logging.getLogger("ringtune")


def job_name() -> str:
    """Which job this is, for the profile's header: the batch system's job id where one
    is set, else rank 0's host and process id."""
    for var in ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "FLUX_JOB_ID",
                "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var, "").strip()
        if value and value != "none":
            return f"{var}={value}"
    return f"{socket.gethostname()}:{os.getpid()}"


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
        self.started_utc = utc_now()
        self.job = job_name()
        self.rng = random.Random(opts.seed)
        #: rank 0: class key -> its exploration.
        self.classes: dict[Any, SizeClass] = {}
        #: every rank: class key -> its winner.
        self.settled: dict[Any, Settled] = {}
        #: every rank: class key -> (candidate index, plan key) of the candidate prepared last.
        self._current: dict[Any, tuple[int, Any]] = {}
        #: every rank: class key -> plan key of its incumbent's explicit plan.
        self._incumbent: dict[Any, Any] = {}
        self.calls = 0
        self.exploring_calls = 0
        self.explore_seconds = 0.0
        self.written: str | None = None
        self._closed = False
        #: Sizes an earlier online job settled in the loaded profile: not explored again.
        self.earlier = _settled_sizes(comm.profile)
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
        from ..backend import check_buffer_dtype
        from ..ops import check_op

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
        if comm.size == 1 or nbytes in self.earlier:
            # Nothing to explore (one rank), or settled by the job that wrote the profile:
            # the same on every rank, no decision to broadcast.
            why = "one rank" if comm.size == 1 else "settled by an earlier job"
            self.settled[key] = Settled(_config_of(incumbent), reason=why,
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
            self.settled[key] = Settled(config, reason=reason)
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
            from ..profile import builtin_profile

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
        st.native = sc.fastest_native()
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
            if key[0] * itemsize(key[1]) == nbytes:
                return st.config
        return None

    # -- persisting ---------------------------------------------------------------------

    def profile_dict(self) -> dict[str, Any]:
        """The profile this job tuned (rank 0's view): the loaded profile (or the built-in
        defaults) with each settled size's rule replaced, merged with its other shapes."""
        return tuned_document(self)

    def save(self, path: str | None = None) -> str | None:
        """Rank 0 writes the tuned profile atomically to ``path`` (default: the tune_out
        file); other ranks write nothing. Returns the path written (rank 0) or ``None``."""
        target = path or self.out
        if target is None:
            raise ValueError(f"no file to write the tuned profile to: set {OUT_ENV} or pass "
                             "tune_out= (or a path)")
        if self.comm.rank != 0:
            return None
        from ..profile import write_profile

        written = write_profile(self.profile_dict(), target)
        self.written = written
        log.info("online: wrote %s (%d size class(es) settled, %d exploring calls of %d)",
                 written, len(self.settled), self.exploring_calls, self.calls)
        return written

    def settled_reason(self, nbytes: int) -> str:
        """Why the size settled as it did, for ``explain``."""
        for key, st in self.settled.items():
            if key[0] * itemsize(key[1]) == nbytes:
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


def _label(key: Any, nbytes: int) -> str:
    return f"{nbytes} B {key[1]} {key[2]}"


def _config_of(plan: Plan) -> Config:
    return Config(plan.algorithm, dict(plan.params), plan.transport or None)



def _settled_sizes(prof: Any) -> frozenset[int]:
    """Sizes an earlier online job settled in this profile (``tuning.online_settled``)."""
    if prof.builtin:
        return frozenset()
    sizes = prof.tuning.get("online_settled")
    if not isinstance(sizes, list):
        return frozenset()
    return frozenset(s for s in sizes if isinstance(s, int) and not isinstance(s, bool))

