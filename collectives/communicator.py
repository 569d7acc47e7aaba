"""``Communicator``: the public allreduce of ringtune.

Use it in a training job in place of ``comm.Allreduce``::

    comm = Communicator(MPI.COMM_WORLD)          # profile from $RINGTUNE_PROFILE if set
    comm.allreduce(grad, op="avg")              # in place; the profile picks the algorithm

Construction is collective (all ranks of ``comm``): it gathers host names, loads the
profile and checks with one small collective that every rank loaded the same one. Every
``allreduce`` call is collective too. Plans are built on first use of a (size, dtype, op,
choice) and cached, so steady-state calls run only the algorithm's hot loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .algorithms import Context
from .engines import Engine, engine_for
from .failures import Failures
from .plan import plan_key as _plan_key
from .plan_cache import PlanCache
from .plan_cache import Prepared as Prepared
from .plumbing.abort import name_abrupt_exits
from .plumbing.logs import configure as configure_logging
from .plumbing.logs import log_level
from .profile import Profile
from .registry import backend_for, get_backend
from .tensors import as_buffer
from .transport import Transport
from .world_profile import WorldProfile

log = logging.getLogger("ringtune")
#: Environment variables naming files, read (and their errors agreed on) where they are
#: used, not in the construction's early check.
FILE_VARIABLES: tuple[str, ...] = ("RINGTUNE_PROFILE", "RINGTUNE_TOPOLOGY")

_NP_BACKEND = get_backend("numpy")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Communicator(WorldProfile, PlanCache, Failures):
    """Allreduce over an mpi4py communicator or a ``torch.distributed`` process group
    (``group.WORLD``, a ``new_group``; see ``collectives.engines``), choosing the algorithm
    per message size.

    ``comm``: an mpi4py communicator or a process group; ``None`` is ``MPI.COMM_WORLD``
    (where no MPI library loads, ``collectives.mpi.mpilib.NoMpiError`` says what to install),
    except under torchrun, where it is refused naming ``init_process_group``.
    ``profile``: a path or a loaded ``Profile``; ``None`` reads ``$RINGTUNE_PROFILE``, else
    the built-in heuristic. ``strict``: raise instead of warning when the profile was tuned
    on a different topology (also ``RINGTUNE_STRICT=1``).

    ``tune="online"`` (or ``RINGTUNE_TUNE=online``): choose each message size's algorithm
    on the job's own calls (``collectives.online``); ``tune_out`` (or
    ``RINGTUNE_TUNE_OUT``): the profile file rank 0 writes the settled choices to at
    ``close()``, at exit or at ``save_tuning()``; ``tune_options``: ``calls``, ``samples``,
    ``share``, ``candidates``, ``margin``, ``prune``, ``seed`` (``RINGTUNE_TUNE_*``).
    """

    def __init__(self, comm: Any = None,
                 profile: str | os.PathLike[str] | Profile | None = None,
                 strict: bool = False, topology: Any = None, tune: str | None = None,
                 tune_out: str | os.PathLike[str] | None = None,
                 tune_options: Mapping[str, Any] | None = None) -> None:
        log_level()  # an unknown RINGTUNE_LOG: ValueError on every rank, before any message
        # Every RINGTUNE_* variable, likewise before any message (probes/environment.py).
        # Imported here: ``import collectives`` stays light (probes loads the topology).
        from probes.environment import check_environment

        # Files named by the environment may exist on some hosts only: the profile loader
        # reads them, and the ranks fail together after agreeing (one rank raising here
        # alone would leave the others waiting in the first collective).
        check_environment(skip=FILE_VARIABLES)
        if comm is None:
            from .mpi.launcher import under_torchrun

            # Under torchrun ``None`` is most likely ``torch.distributed.group.WORLD`` read
            # before ``init_process_group``: the engine registry says so in one line. Else
            # it is MPI's world.
            if not under_torchrun():
                from .mpi.mpilib import load_mpi

                comm = load_mpi().COMM_WORLD
        #: The distributed runtime behind ``comm`` (``mpi``, ``torch``: collectives.engines).
        self.engine: Engine = engine_for(comm)
        # The engine's mpi4py-like communicator object: the mpi4py Comm itself, or a
        # TorchComm over a process group. Everything below talks to it.
        comm = self.engine.communicator(comm)
        # A world that is not the job's (an MPI singleton under torchrun) or a group ringtune
        # cannot move bytes over: refused on every rank, before any step.
        self.engine.check_world(comm)
        self.comm = comm
        self.rank: int = comm.Get_rank()
        self.size: int = comm.Get_size()
        self.strict = bool(strict) or _env_flag("RINGTUNE_STRICT")
        self.check_args = _env_flag("RINGTUNE_CHECK")
        self.topology = topology
        self._plans: dict[Any, Prepared] = {}
        self._contexts: dict[tuple[str, str], Context] = {}
        self._transports: list[Transport] = []
        #: Why the given profile was set aside for built-in defaults (topology mismatch);
        #: ``None`` when it is in use or none was given. ``explain`` says it.
        self.set_aside: str | None = None
        #: Online tuning (``collectives.online``), ``None`` when off.
        self.online: Any = None
        loaded = self._resolve_profile(profile)
        if isinstance(loaded, Profile) and loaded.library is not None:
            from .natives.base import warn_other_library

            warn_other_library(loaded)
        from .online.settings import prepare_settings

        # Read on every rank, agreed on in the construction's allgather: an unknown value,
        # an unwritable output or ranks that differ fail together, before any step.
        tune_setting, tune_lock = prepare_settings(self.rank, tune, tune_out, tune_options)
        try:
            #: The profile in use (built-in defaults where none was given or set aside).
            self.profile: Profile
            self.profile, self.hosts, tuning = self._agree_at_construction(loaded,
                                                                           tune_setting)
            self._defaults_for_layout()
            name_abrupt_exits(comm)  # os._exit on this rank says which rank (abort.py)
            if self.topology is None:
                self.topology = self._detect_topology()
            self._check_fingerprint()
            if tuning is not None:
                from .online.settings import refuse_set_aside
                from .online.tuner import OnlineTuner

                self.online = OnlineTuner(self, tuning[0], tuning[1], tune_lock)
                refuse_set_aside(self)
        except BaseException:
            if self.online is not None:
                self.online.discard()
            elif tune_lock is not None:
                tune_lock.release()
            raise
        #: RINGTUNE_LOG=debug: one line per call (rank 0), checked once here, not per call;
        #: a caller with its own fast path (the DDP hook) takes ``allreduce`` while it is set.
        self.logs_calls = self.rank == 0 and log.isEnabledFor(logging.DEBUG)
        self._calls = 0
        if self.logs_calls:
            prof = self.profile
            src = (f"profile {prof.path} (sha256 {prof.sha256[:12]}…, {len(prof.rules)} "
                   f"rules)" if not prof.builtin else
                   f"built-in defaults ({self.set_aside or 'no profile given'})")
            log.debug("communicator: %d ranks on %d host(s), %s; strict=%s check=%s", self.size,
                      len(set(self.hosts)), src, self.strict, self.check_args)

    # -- running --------------------------------------------------------------------

    def allreduce(self, buf: Any, op: str = "sum", algorithm: str | None = None,
                  transport: str | None = None, **params: Any) -> Any:
        """Allreduce ``buf`` in place across all ranks and return it.

        Without ``algorithm`` the profile's rule for ``buf.nbytes`` decides; with it, that
        algorithm runs with ``params`` (e.g. ``rings=2, chunk_bytes=1 << 20``). Collective:
        every rank must call with the same size, dtype, op and choice (``RINGTUNE_CHECK=1``
        verifies that per call).
        """
        if type(buf) is np.ndarray:
            backend, arr = _NP_BACKEND, buf
        else:
            arr = as_buffer(buf)  # a torch tensor's zero-copy view (collectives/tensors.py)
            backend = backend_for(arr)
        flat = backend.as_flat(arr)
        key = _plan_key(flat, op, backend, algorithm, transport, params)
        if self.check_args:
            # Before preparing: building a plan can be collective (sub-communicators).
            self._check_agreement(key)
        prepared = self._plans.get(key)
        cached = prepared is not None
        if prepared is None:
            if self.online is not None and algorithm is None and transport is None \
                    and not params:
                # Not settled yet (a settled size's plan is cached under ``key``).
                self.online.call(key, flat, backend, op)
                return buf
            prepared = self.prepare_plan(key, flat, backend, op, algorithm, transport, params)
        if self.logs_calls:
            self._log_call(prepared, flat, op, cached)
        self.run_prepared(prepared, flat)
        return buf

    def run_prepared(self, prepared: Prepared, flat: Any) -> None:
        """Run a plan from ``prepared`` on the flat view it was prepared for: what every
        ``allreduce`` call does after finding its plan, and the one path the benchmark
        harness times, so every candidate pays the same per-call cost. Collective."""
        backend = prepared.backend
        try:
            prepared.run(flat)
            if prepared.avg:
                backend.divide(flat, self.size)
            if backend.on_gpu:
                # GPU work is queued on the backend's own stream: wait for it, so the caller
                # may use ``buf`` on any stream (see collectives/cuda/backend.py).
                backend.synchronize()
        except Exception as exc:
            self.fail(exc, prepared.plan, flat)

    def _log_call(self, prepared: Prepared, flat: Any, op: str, cached: bool) -> None:
        self._calls += 1
        plan = prepared.plan
        log.debug("call %d: %d B %s %s -> %s%s over %s (%s plan)", self._calls,
                  int(flat.size) * int(flat.dtype.itemsize), flat.dtype, op, plan.algorithm,
                  f" {plan.describe_params()}" if plan.params else "", plan.transport,
                  "cached" if cached else "new")

    def allreduce_many(self, buffers: Sequence[Any], op: str = "sum",
                       bucket_bytes: int | None = None) -> list[Any]:
        """Allreduce many arrays or tensors in place, packed into fused buckets of
        ``bucket_bytes`` (``None``: the profile's tuned size); see
        collectives/training/fusion.py."""
        from .training.fusion import allreduce_many

        return allreduce_many(self, buffers, op, bucket_bytes)

    # -- online tuning ----------------------------------------------------------------

    def save_tuning(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """Online tuning: write the choices settled so far as a profile (rank 0, atomically;
        ``path`` or the ``tune_out`` file). Returns the path on rank 0, ``None`` elsewhere.
        Not collective. ``ValueError`` when online tuning is off."""
        if self.online is None:
            raise ValueError(f"rank {self.rank}: save_tuning: online tuning is off; build the "
                             "Communicator with tune='online' (or RINGTUNE_TUNE=online)")
        return self.online.save(None if path is None else os.fspath(path))

    def enable_online(self, tune_out: str | os.PathLike[str] | None = None,
                      tune_options: Mapping[str, Any] | None = None,
                      tune: str | None = "online") -> None:
        """Turn online tuning on for an existing communicator (``HookState(tune=...)``);
        collective: the ranks' settings are compared (one allgather) and bad or differing
        ones raise on every rank. Keeps the tuning already on."""
        from .online.settings import agree_settings, prepare_settings, refuse_set_aside
        from .online.tuner import OnlineTuner

        # Already tuning (RINGTUNE_TUNE): its own output and lock stand.
        setting, lock = prepare_settings(self.rank, tune, tune_out, tune_options,
                                         take_lock=self.online is None)
        made = None
        try:
            tuning = agree_settings(self.comm.allgather(setting), self.rank)
            if tuning is None and self.online is not None:
                raise ValueError(f"rank {self.rank}: tune={tune!r} on a Communicator that "
                                 "tunes online (RINGTUNE_TUNE=online or its tune=): leave "
                                 "tune unset, or build the Communicator without tuning")
            if tuning is None or self.online is not None:
                return
            self.online = made = OnlineTuner(self, tuning[0], tuning[1], lock)
            refuse_set_aside(self)
        except BaseException:
            if made is not None:
                made.discard()
                self.online = None
            elif lock is not None:
                lock.release()
            raise

    def close(self) -> None:
        """Free scratch buffers and transport resources (NCCL communicators); with online
        tuning, rank 0 first writes the tuned profile (``tune_out``)."""
        from .training.exchange import close_exchanger

        close_exchanger(self)  # after the communication thread's queued work
        if self.online is not None:
            self.online.close()
        self._plans.clear()
        for ctx in self._contexts.values():
            ctx.close()
        for t in self._transports:
            t.close()
        self._transports.clear()
        self._contexts.clear()


configure_logging()
