"""Which profile a ``Communicator``'s world runs, and what it picks.

``WorldProfile`` is the part of ``collectives.communicator.Communicator`` that owns the
profile in force: loading it on every rank (an error kept, not raised, until the ranks have
agreed), the one construction allgather that checks every rank loaded the same one, the
built-in defaults for the layout the ranks agreed on, the fingerprint check that sets a
profile of another world aside, and the rule each message size gets (``plan_for``,
``explain``). A mixin: its state (``profile``, ``hosts``, ``set_aside``...) is the
communicator's, set in its constructor.
"""

from __future__ import annotations

import os
import warnings
from collections import Counter
from typing import TYPE_CHECKING, Any

from .errors import AgreementError, ProfileError, TopologyMismatchError
from .plan import Plan
from .profile import Profile, builtin_profile, load_profile
from .registry import get_backend

_NP_BACKEND = get_backend("numpy")


class WorldProfile:
    """The profile a communicator's world runs (a mixin of ``Communicator``)."""

    if TYPE_CHECKING:
        from .engines import Engine

        comm: Any
        engine: Engine
        rank: int
        size: int
        strict: bool
        topology: Any
        hosts: tuple[int, ...]
        profile: Profile
        set_aside: str | None
        online: Any

        def default_transport(self, backend: Any) -> str: ...

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
        hosts = prof.topology.hosts if prof.topology is not None else None
        there = _shape(prof.world_size, hosts)
        here = _shape(self.size, len(set(self.hosts)))
        retune = self.engine.retune_hint(self.size)
        tuned_on = prof.engine_name
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



def _shape(world_size: int | None, hosts: Any) -> str:
    """``3 ranks on 1 host`` (the host count only where known)."""
    ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
    if isinstance(hosts, int) and not isinstance(hosts, bool):
        return f"{ranks} on {hosts} host{'s' if hosts != 1 else ''}"
    return ranks
