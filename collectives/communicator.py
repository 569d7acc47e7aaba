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
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from .algorithms import Context, get_algorithm
from .backend import Backend, check_buffer_dtype
from .engines import Engine, engine_for
from .errors import AgreementError, ProfileError, TopologyMismatchError, require_agreement
from .ops import check_op
from .plan import Plan
from .plan import plan_key as _plan_key
from .plumbing.abort import abort_world, name_abrupt_exits, on_error_mode, rank_line
from .plumbing.logs import configure as configure_logging
from .plumbing.logs import log_level
from .profile import Profile, builtin_profile, load_profile
from .registry import backend_for, get_backend, make_transport
from .tensors import as_buffer
from .transport import Transport

log = logging.getLogger("ringtune")
#: Environment variables naming files, read (and their errors agreed on) where they are
#: used, not in the construction's early check.
FILE_VARIABLES: tuple[str, ...] = ("RINGTUNE_PROFILE", "RINGTUNE_TOPOLOGY")

_NP_BACKEND = get_backend("numpy")


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Prepared:
    """A cached, executable plan: the algorithm instance and what ``run`` needs. Made by
    ``Communicator.prepare_plan`` (or ``prepared``), run by ``Communicator.run_prepared``."""

    __slots__ = ("plan", "algo", "run", "avg", "size", "backend")

    def __init__(self, plan: Plan, algo: Any, avg: bool, size: int, backend: Backend) -> None:
        self.plan = plan
        self.algo = algo
        self.run = algo.run
        self.avg = avg
        self.size = size
        self.backend = backend


class Communicator:
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
        if isinstance(loaded, Profile) and "library" in loaded.raw:
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

    # -- construction ---------------------------------------------------------------

    def _resolve_profile(self, profile: Any) -> Profile | Exception:
        """Load the profile locally; an error is kept (not raised) so that all ranks can
        raise it together after the agreement collective."""
        if isinstance(profile, Profile):
            return profile
        path = profile if profile is not None else os.environ.get("RINGTUNE_PROFILE")
        if path is None:
            return builtin_profile(self.size)
        if not os.fspath(path).strip():
            # An empty name is a mistake (a variable set from an empty shell variable), not a
            # request for the defaults: say so rather than run untuned without a word.
            where = "RINGTUNE_PROFILE" if profile is None else "profile="
            return ProfileError(f"{where} is empty: name a profile file, or unset it (pass "
                                "None) for the built-in defaults")
        try:
            # Not ``world_size=self.size``: a profile of another world size is a topology
            # mismatch (warn and fall back, or raise when strict; ``_check_fingerprint``),
            # not a broken file. A profile with sections for several shapes gives the one
            # for this communicator's size.
            return load_profile(os.fspath(path), section_for=self.size)
        except (ProfileError, OSError) as exc:
            text = str(exc) if isinstance(exc, ProfileError) else (
                f"{path}: cannot read profile: {exc.strerror or exc}")
            if profile is None:
                # The job did not name this file: say where the path came from.
                text = f"RINGTUNE_PROFILE={os.fspath(path)!r}: {text}"
            return ProfileError(text)

    def _agree_at_construction(self, prof: Profile | Exception, tune_setting: Any = ("off",)
                               ) -> tuple[Profile, tuple[int, ...], Any]:
        """One allgather: host names (for ring orders), and the profile's digest and
        backend, which must be equal on every rank; returns the profile and each rank's
        host index, and the online tuning settings every rank set alike
        (``collectives.online.agree_settings``). A profile that failed to load on any rank,
        bad tuning settings, or a disagreement, raises the same on every rank. The digest is
        the file's bytes' (``Profile.source_digest``) where a file was read; only where those
        differ (another copy laid out otherwise, or a ``Profile`` object) is the content
        hash computed and compared, in a second allgather."""
        mine = (
            self.engine.host_name(self.comm),
            None if isinstance(prof, Exception) else prof.source_digest or prof.sha256,
            str(prof) if isinstance(prof, Exception) else None,
            None if isinstance(prof, Exception) else prof.backend,
            tune_setting,
        )
        everyone = self.comm.allgather(mine)
        errors = [(r, e) for r, (_, _, e, _, _) in enumerate(everyone) if e]
        if errors:
            r, e = errors[0]
            raise ProfileError(e if r == self.rank or len(errors) == len(everyone)
                               else f"rank {r}: {e}")
        assert isinstance(prof, Profile)  # this rank's load error would be in ``errors``
        from .online.settings import agree_settings

        tuning = agree_settings([t for *_, t in everyone], self.rank)
        hashes = {h for _, h, _, _, _ in everyone}
        if len(hashes) > 1:
            # Every rank saw the same list, so every rank takes this branch: files that
            # differ byte for byte may still hold the same profile.
            content = self.comm.allgather(prof.sha256)
            hashes = set(content)
        if len(hashes) > 1:
            groups: dict[str, list[int]] = {}
            for r, h in enumerate(content):
                groups.setdefault(h[:12], []).append(r)
            detail = "; ".join(f"ranks {v} loaded {k}…" for k, v in groups.items())
            raise AgreementError(
                f"ranks loaded different profiles ({detail}): give every rank the same "
                "file (same RINGTUNE_PROFILE and content on every host)"
            )
        backends = {b for _, _, _, b, _ in everyone}
        if len(backends) > 1:
            raise AgreementError(f"ranks disagree on the backend ({sorted(backends)}): every "
                                 "rank must use the same profile and buffer kind")
        names: dict[str, int] = {}
        return prof, tuple(names.setdefault(name, len(names)) for name, *_ in everyone), tuning

    def _detect_topology(self) -> Any:
        """Probe this world once (collective, ~0.1 s; ``$RINGTUNE_TOPOLOGY`` replaces
        detection): ring orders follow it and the profile's fingerprint is checked
        against it. Imported here so ``import collectives`` stays light."""
        try:
            import probes
        except ImportError:  # the runtime works without the probes package
            return None
        return probes.detect(self.comm)

    def _check_fingerprint(self) -> None:
        """Compare the profile's world size and topology fingerprint with this world's:
        on a mismatch warn once and use built-in defaults, or raise when strict. The same
        decision on every rank (they agreed on the profile, and the world is common)."""
        prof = self.profile
        if prof.builtin:
            return
        found = self._mismatch(prof)
        if found is None:
            return
        reason, fix = found
        if self.strict:
            raise TopologyMismatchError(f"{prof.path}: {reason} (strict): {fix}, or unset "
                                        "RINGTUNE_STRICT to fall back to built-in defaults")
        if self.rank == 0:
            warnings.warn(f"{prof.path}: {reason}; using built-in defaults ({fix})",
                          RuntimeWarning, stacklevel=3)
        self.set_aside = f"profile {prof.path} set aside: {reason}"
        self.profile = builtin_profile(self.size)
        self._defaults_for_layout()

    def _defaults_for_layout(self) -> None:
        """Built-in defaults that know the layout the ranks agreed on: on one host, the
        shared-memory allreduce (``profile.builtin_profile``). Alike on every rank."""
        if self.profile.builtin:
            per_host = Counter(self.hosts).values()
            even = len(set(per_host)) == 1 and min(per_host) > 1
            self.profile = builtin_profile(self.size, len(per_host), self.engine.name, even)

    def _mismatch(self, prof: Profile) -> tuple[str, str] | None:
        """``(why prof does not fit this world, what to do)``; ``None`` when it fits."""
        hosts = prof.topology.get("hosts")
        there = _shape(prof.world_size, hosts)
        here = _shape(self.size, len(set(self.hosts)))
        retune = self.engine.retune_hint(self.size)
        tuned_on = str(prof.engine.get("name", "mpi"))
        if tuned_on != self.engine.name:
            # Another engine's choices were measured against another native allreduce
            # (MPI_Allreduce vs gloo's or NCCL's) over other transports: not this job's.
            return (f"tuned over the {tuned_on} engine, this job runs over "
                    f"{self.engine.name}", retune)
        if prof.world_size is not None and prof.world_size != self.size:
            return (f"tuned for {there}, this job has {here}",
                    f"{retune} or run with {prof.world_size} ranks")
        if not prof.fingerprint or self.topology is None:
            return None
        fingerprint = self.topology.fingerprint()
        if fingerprint == prof.fingerprint:
            return None
        if isinstance(hosts, int) and hosts != len(set(self.hosts)):
            return f"tuned for {there}, this job has {here}", retune
        return (f"tuned on topology {prof.fingerprint[:19]}…, this world is "
                f"{fingerprint[:19]}…", retune)

    # -- choosing -------------------------------------------------------------------

    def plan_for(self, nbytes: int, tuned: bool = True) -> Plan:
        """The plan the profile picks for a message of ``nbytes`` bytes; with online tuning
        (and ``tuned``), the choice settled for that size once it has settled."""
        if tuned and self.online is not None:
            won = self.online.settled_for(int(nbytes))
            if won is not None:
                return Plan(won.algorithm, dict(won.params), won.transport or
                            self.profile.transport, "online", None, int(nbytes), int(nbytes))
        prof = self.profile
        idx, rule = prof.select(int(nbytes))
        transport = rule.transport or prof.transport
        if not self.engine.runs_transport(transport):
            # A transport of another engine (the built-in profile's 'mpi' under torch).
            transport = self.engine.default_transport(self.comm, _NP_BACKEND)
        return Plan(
            algorithm=rule.algorithm,
            params=dict(rule.params),
            transport=transport,
            source="default" if prof.builtin else "profile",
            rule=idx,
            min_bytes=rule.min_bytes,
            max_bytes=rule.max_bytes,
            measured=rule.measured,
        )

    def explain(self, nbytes: int) -> str:
        """One line for people: what runs for ``nbytes`` and why."""
        p = self.plan_for(nbytes)
        hi = "∞" if p.max_bytes is None else str(p.max_bytes)
        params = f" ({p.describe_params()})" if p.params else ""
        if p.source == "online":
            return (f"{nbytes} B -> {p.algorithm}{params} over {p.transport}: settled by "
                    f"online tuning in this job ({self.online.settled_reason(int(nbytes))})")
        prof = self.profile
        if not prof.builtin:
            src = f"profile {prof.path}"
        elif self.set_aside:
            src = f"built-in defaults ({self.set_aside})"
        else:
            src = "built-in defaults (no profile: pass profile= or set RINGTUNE_PROFILE)"
        if getattr(prof, "section", ""):
            src += f", {prof.section}"
        text = (f"{nbytes} B -> {p.algorithm}{params} over {p.transport}: rule {p.rule} "
                f"[{p.min_bytes}..{hi}] of {src}")
        if prof.backend != _NP_BACKEND.name:
            # The profile's transports were chosen for its own buffers (``prepare_plan``): say
            # what host buffers get, or a cupy/nccl profile reads as NCCL for NumPy arrays.
            text += (f" (for {prof.backend} buffers; host buffers run over "
                     f"{self.default_transport(_NP_BACKEND)})")
        m = p.measured
        if m:
            bw, nat = m.get("busbw_gbps"), m.get("native_busbw_gbps")
            parts = [f"measured busbw {bw} GB/s at {m.get('bytes')} B"]
            if nat:
                ratio = f" ({bw / nat:.2f}x native)" if isinstance(bw, (int, float)) else ""
                parts.append(f"native {nat} GB/s{ratio}")
            text += "; " + ", ".join(parts)
        else:
            text += "; not measured"
        return text

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

    def prepared(self, buf: Any, op: str = "sum", algorithm: str | None = None,
                 transport: str | None = None, **params: Any) -> Prepared:
        """The cached executable plan ``allreduce`` would run for these arguments (for the
        benchmark harness and overhead measurements). Collective on first use."""
        arr = as_buffer(buf)
        backend = backend_for(arr)
        flat = backend.as_flat(arr)
        key = _plan_key(flat, op, backend, algorithm, transport, params)
        return self._plans.get(key) or self.prepare_plan(key, flat, backend, op, algorithm,
                                                     transport, params)

    # -- the plan cache: what online tuning (collectives.online) and any caller that
    # chooses its own plans use; nothing outside this module touches ``_plans``.

    def cached_plan(self, key: Any) -> Prepared | None:
        """The plan cached under ``key`` (a ``collectives.plan.plan_key``), ``None`` when
        there is none: look here before ``prepare_plan``, which always builds. Local."""
        return self._plans.get(key)

    def prepare_plan(self, key: Any, flat: Any, backend: Backend, op: str,
                     algorithm: str | None = None, transport: str | None = None,
                     params: Mapping[str, Any] | None = None) -> Prepared:
        """Build the plan for ``flat`` (a backend's flat view of the buffer), ``op`` and the
        choice (``algorithm`` ``None``: the profile's for the size; ``transport`` ``None``:
        the profile's or the default), and install it in the cache under ``key``, replacing
        what was there: later ``allreduce`` calls whose arguments give ``key`` run it.
        Collective (setting up may build sub-communicators and transports); bad input is a
        ``ValueError``/``TypeError`` alike on every rank, any other failure goes the way of
        ``fail``."""
        params = {} if params is None else params
        check_op(op)
        dtype = check_buffer_dtype(backend, flat.dtype)
        nbytes = int(flat.size) * int(flat.dtype.itemsize)
        if algorithm is None:
            if params:
                raise ValueError(
                    f"parameters {sorted(params)} given without algorithm=...: name the "
                    "algorithm they belong to"
                )
            chosen = self.plan_for(nbytes)
            prof_backend = getattr(self.profile, "backend", backend.name)
            if transport is None and prof_backend != backend.name:
                # The profile's transports were chosen for its own kind of buffer (a host
                # profile, like the built-in one, says 'mpi'): other buffers use theirs.
                transport = self.default_transport(backend)
            elif transport is None and not self.engine.runs_transport(chosen.transport):
                # A profile's transport of another engine (the built-in profile's 'mpi'
                # under torch): this engine's own for these buffers.
                transport = self.default_transport(backend)
            if transport is not None:
                chosen = Plan(chosen.algorithm, chosen.params, transport, chosen.source,
                              chosen.rule, chosen.min_bytes, chosen.max_bytes, chosen.measured)
            if (chosen.source == "default" and backend.on_gpu
                    and get_algorithm(chosen.algorithm).intra_host_only):
                # The defaults' host-memory choice (shm) is no choice for GPU buffers: the
                # defaults of a layout not known to be one host.
                _, rule = builtin_profile(self.size).select(nbytes)
                chosen = Plan(rule.algorithm, dict(rule.params), chosen.transport,
                              chosen.source, None, rule.min_bytes, rule.max_bytes)
        else:
            chosen = Plan(algorithm=algorithm, params=dict(params),
                          transport=transport or "", source="explicit")
        cls = get_algorithm(chosen.algorithm)
        with self._tuned_with(chosen):
            checked = cls.check_params(chosen.params, self.size)
        tname = chosen.transport or self.default_transport(backend)
        plan = Plan(chosen.algorithm, checked, tname, chosen.source, chosen.rule,
                    chosen.min_bytes, chosen.max_bytes, chosen.measured)
        # ``avg``: an algorithm that fuses it divides what it owns before its all-gather;
        # for the others this communicator sums and divides the whole result.
        divide_after = op == "avg" and not cls.fuses_average
        try:
            ctx = self._context(backend, tname)
            with self._tuned_with(chosen):
                algo = cls(ctx, int(flat.size), dtype, "sum" if divide_after else op, checked)
        except (ValueError, TypeError):
            raise  # bad input found alike on every rank (AgreementError is a ValueError)
        except Exception as exc:
            # Setting up may be collective (transports, sub-communicators): a failure
            # here can leave the other ranks waiting, as one inside ``run`` does.
            self.fail(exc, plan, flat)
        prepared = Prepared(plan, algo, divide_after, self.size, backend)
        self._plans[key] = prepared
        if log.isEnabledFor(logging.INFO) and self.rank == 0:
            log.info("allreduce %d B %s %s -> %s", nbytes, dtype, op, self.explain(nbytes)
                     if algorithm is None else f"{plan.algorithm} {plan.describe_params()}")
            log.debug("plan %d B %s %s: %s with %s over %s (source %s)", nbytes, dtype, op,
                      plan.algorithm, plan.describe_params() or "no parameters",
                      plan.transport, plan.source)
        return prepared

    def _tuned_with(self, chosen: Plan) -> Any:
        """``collectives.natives.tuned_with`` the profile's MPI library for a plan the
        profile chose (its ``native`` impl names are that library's); nothing for an
        explicit choice, which must be one of the running library's."""
        from .natives import tuned_with

        raw = self.profile.raw or {}
        lib = raw.get("library") if chosen.source != "explicit" else None
        return tuned_with(lib.get("name") if isinstance(lib, dict) else None)

    def evict_plan(self, key: Any) -> None:
        """Drop the plan cached under ``key`` (its scratch buffers with it), if any: the
        next call with that key plans again. Local."""
        self._plans.pop(key, None)

    def default_transport(self, backend: Backend) -> str:
        """The transport for ``backend``'s buffers when neither the call nor (a profile of
        this engine) names one: the backend's own under MPI, the engine's elsewhere."""
        return self.engine.default_transport(self.comm, backend)

    def _context(self, backend: Backend, tname: str) -> Context:
        ctx = self._contexts.get((backend.name, tname))
        if ctx is None:
            if self.size > 1:
                # Ranks that picked different transports (e.g. CUDA-aware MPI detected on
                # some hosts only) would never match each other's messages: fail together.
                require_agreement(
                    self.comm.allgather(f"{backend.name}/{tname}"), "backends/transports",
                    "name the transport explicitly (transport=... or in the profile) or set "
                    "RINGTUNE_CUDA_AWARE the same on every host")
            transport = make_transport(tname, self.comm, backend)
            self._transports.append(transport)
            ctx = Context(comm=self.comm, backend=backend, transport=transport,
                          hosts=self.hosts, topology=self.topology,
                          world_ranks=tuple(range(self.size)))
            self._contexts[(backend.name, tname)] = ctx
        return ctx

    @property
    def raises_failures(self) -> bool:
        """Whether a failure inside a call goes to the caller (one rank has no peers to
        leave waiting; ``RINGTUNE_ON_ERROR=raise``) rather than ending every rank."""
        return self.size == 1 or on_error_mode() == "raise"

    def fail(self, exc: BaseException, plan: Plan, flat: Any) -> NoReturn:
        """This rank failed running or preparing ``plan`` on ``flat`` where its peers may
        be waiting for it: raise ``exc`` to the caller where ``raises_failures``, else end
        every rank with a line naming this one (``collectives.plumbing.abort``). Use it in the
        ``except`` of any call that runs a plan outside ``allreduce``."""
        if self.raises_failures:
            raise exc
        nbytes = int(flat.size) * int(flat.dtype.itemsize)
        what = plan.algorithm + (f" ({plan.describe_params()})" if plan.params else "")
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        kind = type(exc).__name__
        if type(exc).__module__.startswith("torch"):
            kind = "torch." + kind
        if type(exc).__module__.startswith("mpi4py"):
            kind = "MPI." + kind
            if "MPI_ERROR field" in first:  # MPI_ERR_IN_STATUS: the detail is per request
                first = ("a send or receive failed (MPI_ERR_IN_STATUS; usually a message "
                         "larger than its receive buffer)")
        abort_world(self.comm, rank_line(
            self.comm, f"allreduce of {nbytes} B with {what} failed: "
            f"{kind}: {first}; ending every rank (every rank must call "
            "allreduce with the same size, dtype, op and choice: RINGTUNE_CHECK=1 checks "
            "it; RINGTUNE_ON_ERROR=raise hands such failures to the caller)"))

    def _check_agreement(self, key: Any) -> None:
        """RINGTUNE_CHECK=1: every rank passed the same size, dtype, op and choice."""
        require_agreement(
            self.comm.allgather(repr(key)),
            "allreduce arguments (size, dtype, op, backend, algorithm, transport, params)",
            "every rank must call allreduce with the same arguments in the same order")

    def clear_plans(self) -> None:
        """Drop cached plans (and their scratch buffers); the next call plans again. The
        tuner calls it between candidates so memory does not grow with every trial."""
        self._plans.clear()

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


def _shape(world_size: int | None, hosts: Any) -> str:
    """``3 ranks on 1 host`` (the host count only where known)."""
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    if isinstance(hosts, int) and not isinstance(hosts, bool):
        return f"{ranks} on {hosts} host{'s' if hosts != 1 else ''}"
    return ranks


configure_logging()
