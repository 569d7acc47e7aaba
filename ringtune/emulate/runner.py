"""Run a command across an emulated cluster under Hydra, the way ``mpiexec -hosts …`` would.

``mpiexec`` runs inside the first host's namespace (so that every proxy can reach it) with
``-launcher rsh -launcher-exec SHIM``: Hydra calls the shim as it would call ``ssh HOST CMD``,
and the shim runs CMD inside HOST's namespace under its own hostname (``unshare -u``).
``MPIR_CVAR_CH4_NETMOD=ofi`` is required: the mpich wheel's UCX finds the other namespaces'
shared memory (same machine, same /dev/shm) and would never touch the shaped link.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .netns import STATE_DIR, Network

_SHIM = """#!/bin/sh
# Launcher for Hydra (-launcher rsh): skip rsh/ssh options, take the host, run the rest of
# the line inside that host's namespace under its hostname. Written by `ringtune emulate`.
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1; shift
case "$host" in
{cases}
*) echo "ringtune emulate shim: unknown host $host" >&2; exit 255 ;;
esac
exec ip netns exec "$ns" unshare -u sh -c 'hostname "$0" && exec sh -c "exec $1"' "$name" "$*"
"""


def write_run_files(net: Network, placement: str) -> tuple[str, str, str]:
    """The shim and the hostfile for ``net``, in this run's directory; returns (directory,
    shim path, Hydra's ``-hosts`` argument)."""
    run_dir = os.path.join(STATE_DIR, str(net.run_id))
    os.makedirs(run_dir, exist_ok=True)
    cases = "\n".join(
        f"{h.address}|{h.hostname}) ns={h.namespace}; name={h.hostname} ;;" for h in net.hosts)
    shim = os.path.join(run_dir, "shim.sh")
    with open(shim, "w", encoding="utf-8") as f:
        f.write(_SHIM.format(cases=cases))
    os.chmod(shim, 0o755)
    per = 1 if placement == "round-robin" else net.spec.ranks_per_host
    hosts = ",".join(f"{h.hostname}:{per}" for h in net.hosts)
    with open(os.path.join(run_dir, "hostfile"), "w", encoding="utf-8") as f:
        f.write("".join(f"{h.hostname}:{per}  # {h.address} ({h.namespace})\n"
                        for h in net.hosts))
    return run_dir, shim, hosts


def mpiexec_command(net: Network, mpiexec: str, shim: str, hosts: str,
                    command: Sequence[str]) -> list[str]:
    first = net.hosts[0]
    return ["ip", "netns", "exec", first.namespace, "unshare", "-u", "sh", "-c",
            'hostname "$0" && exec "$@"', first.hostname,
            mpiexec, "-hosts", hosts, "-n", str(net.spec.ranks), "-launcher", "rsh",
            "-launcher-exec", shim, "-iface", "eth0",
            "-genv", "MPIR_CVAR_CH4_NETMOD", "ofi",
            "-genv", "RINGTUNE_EMULATED", net.spec.name,
            *command]


class Terminated(Exception):
    """SIGTERM/SIGHUP arrived: end the run and tear the cluster down."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals received, in order: Python drops an exception raised while a finalizer runs
#: ("Exception ignored in: Popen.__del__"), so a Ctrl-C landing there would be lost and the
#: set-up would go on to launch the command; ``raise_pending`` raises it again.
_received: list[int] = []


def _raise_terminated(signum: int, frame: object) -> None:
    _received.append(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


def raise_pending() -> None:
    """Raise (again) the first signal received since the handlers were installed: called
    between the steps of a run, it turns a signal whose exception was swallowed into the
    teardown it asked for."""
    if _received:
        if _received[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(_received[0])


def install_signal_handlers() -> dict[int, object]:
    """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP ``Terminated``, so that the
    ``finally`` that tears the cluster down runs on each of them; each is also recorded
    for ``raise_pending``."""
    _received.clear()
    old: dict[int, object] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, _raise_terminated)
    return old


def restore_signal_handlers(old: dict[int, object]) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGINT, grace: float = 2.0) -> None:
    """Ask mpiexec (its own process group) to stop with ``sig``, then kill the group."""
    for s, wait in ((sig, grace), (signal.SIGKILL, 1.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, s)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


def run_command(net: Network, mpiexec: str, command: Sequence[str], placement: str,
                verbose: bool = True) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``command`` across ``net``; returns the running mpiexec and its command line."""
    _, shim, hosts = write_run_files(net, placement)
    cmd = mpiexec_command(net, mpiexec, shim, hosts, command)
    env = dict(os.environ)
    # `ringtune …` and `python …` as the command resolve to this installation's.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    quiet = net.spec.progress_env(env)  # Hydra passes the environment on to every rank
    env.update(quiet)
    if verbose:
        print(f"ringtune emulate: mpiexec -hosts {hosts} -n {net.spec.ranks} "
              f"{shlex.join(command)}", file=sys.stderr, flush=True)
        if net.spec.throttled:
            print("ringtune emulate: MPICH waits throttled (emulate.progress: throttle; "
                  f"{'set: ' + ' '.join(sorted(quiet)) if quiet else 'already set'})",
                  file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    return proc, cmd


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when ``ringtune emulate`` dies (even by SIGKILL).
    ``ip netns exec``, ``unshare`` and ``sh -c exec`` all exec in place, so this reaches
    mpiexec itself, and the proxies and ranks end when mpiexec's sockets close."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the next run's leftover cleanup removes what is left


def wait(proc: subprocess.Popen[bytes]) -> int:
    """mpiexec's exit status; a signal ending it reads as 128 + signal, as in a shell."""
    code = proc.wait()
    return 128 - code if code < 0 else code


def elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.2f} s"
