"""Run a command across an emulated cluster under Hydra, the way ``mpiexec -hosts …`` would,
or under torchrun: one agent per emulated host (``run_torchrun``).

``mpiexec`` runs inside the first host's namespace (so that every proxy can reach it) with
``-launcher rsh -launcher-exec SHIM``: Hydra calls the shim as it would call ``ssh HOST CMD``,
and the shim runs CMD inside HOST's namespace under its own hostname (``unshare -u``).
``MPIR_CVAR_CH4_NETMOD=ofi`` is required: the mpich wheel's UCX finds the other namespaces'
shared memory (same machine, same /dev/shm) and would never touch the shaped link.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from .netns import STATE_DIR, TEARDOWN_SIGNALS, Network, run_shielded

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
    for sig in TEARDOWN_SIGNALS:
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


#: torchrun's rendezvous and store: the static (c10d TCPStore) rendezvous on host 0, so
#: that ``--node-rank i`` is host i and the ranks are numbered host by host (``block``).
TORCHRUN_RDZV = "static"
#: Seconds the other agents get to end their workers after one agent failed (SIGTERM),
#: before their process groups are killed.
AGENT_GRACE_S = 5.0


def find_torchrun() -> str | None:
    """The torchrun of this interpreter's environment (``sys.executable``'s bin/), else the
    one on PATH; ``None`` when there is none."""
    here = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("torchrun")


def torchrun_arguments(command: Sequence[str]) -> list[str]:
    """``command`` as torchrun's entry point: a ``.py`` script as is (torchrun runs it with
    its own Python), anything else (``ringtune``, ``python``, a binary) after
    ``--no-python``."""
    if command[0].endswith(".py"):
        return list(command)
    return ["--no-python", *command]


def free_port(namespace: str) -> int:
    """A TCP port no process listens on inside ``namespace`` (the kernel picks it there)."""
    probe = ("import socket; s = socket.socket(); s.bind(('', 0)); "
             "print(s.getsockname()[1])")
    # Through netns's runner: a set-up step, run with the teardown signals held.
    res = run_shielded(["ip", "netns", "exec", namespace, sys.executable, "-c", probe],
                       check=False)
    if res.returncode != 0 or not res.stdout.strip().isdigit():
        from ringtune.errors import CommandFailed

        raise CommandFailed(f"emulate: no free port in {namespace}: "
                            f"{(res.stderr or res.stdout).strip()}")
    return int(res.stdout.strip())


def torchrun_commands(net: Network, torchrun: str, port: int,
                      command: Sequence[str]) -> list[list[str]]:
    """One torchrun agent per host of ``net``, inside the host's namespace under its
    hostname: ``--nnodes H --nproc-per-node R --node-rank i``, the rendezvous (and the job's
    store) on host 0's address."""
    first = net.hosts[0]
    out = []
    for h in net.hosts:
        out.append(["ip", "netns", "exec", h.namespace, "unshare", "-u", "sh", "-c",
                    'hostname "$0" && exec "$@"', h.hostname,
                    torchrun, "--nnodes", str(net.spec.hosts),
                    "--nproc-per-node", str(net.spec.ranks_per_host),
                    "--node-rank", str(h.index), "--rdzv-backend", TORCHRUN_RDZV,
                    "--rdzv-endpoint", f"{first.address}:{port}",
                    "--rdzv-id", f"ringtune-emulate-{net.run_id}", "--max-restarts", "0",
                    *torchrun_arguments(command)])
    return out


#: Variables a torchrun (or MPI) launcher gave this process: the agents must not inherit
#: them (a worker would read the outer job's rank or store).
_LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                  "MASTER_ADDR", "MASTER_PORT")


def run_torchrun(net: Network, torchrun: str, command: Sequence[str],
                 verbose: bool = True) -> list[subprocess.Popen[bytes]]:
    """Start one torchrun agent per host of ``net`` (each its own process group, killed
    with ``ringtune emulate``); returns them in host order."""
    port = free_port(net.hosts[0].namespace)
    cmds = torchrun_commands(net, torchrun, port, command)
    env = {k: v for k, v in os.environ.items()
           if k not in _LAUNCHER_VARS and not k.startswith("TORCHELASTIC_")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["RINGTUNE_EMULATED"] = net.spec.name
    if verbose:
        print(f"ringtune emulate: torchrun --nnodes {net.spec.hosts} --nproc-per-node "
              f"{net.spec.ranks_per_host} --rdzv-endpoint {net.hosts[0].address}:{port} "
              f"{shlex.join(torchrun_arguments(command))} (one agent per host)",
              file=sys.stderr, flush=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(cmd, env=env, start_new_session=True,
                                          preexec_fn=_die_with_parent))
    except BaseException:
        for p in procs:
            stop(p)
        raise
    return procs


def wait_agents(procs: Sequence[subprocess.Popen[bytes]], poll: float = 0.05,
                grace: float = AGENT_GRACE_S) -> tuple[int, int | None]:
    """Wait for every agent; when one fails, end the others (SIGTERM: torchrun ends its
    workers; their process groups are killed after ``grace`` s). Returns (the job's exit
    status: the first failed agent's, else 0; the index of that agent, or ``None``)."""
    failed: int | None = None
    code = 0
    while True:
        running = 0
        for i, p in enumerate(procs):
            c = p.poll()
            if c is None:
                running += 1
            elif c != 0 and failed is None:
                failed, code = i, 128 - c if c < 0 else c
        if failed is not None or running == 0:
            break
        time.sleep(poll)
    if failed is not None:
        stop_all(procs, signal.SIGTERM, grace)
    return code, failed


def stop_all(procs: Sequence[subprocess.Popen[bytes]], sig: int = signal.SIGINT,
             grace: float = 2.0) -> None:
    """``stop`` for several process groups at once: ``sig`` to each, then SIGKILL to those
    still running ``grace`` s later (one wait for all, not one per process)."""
    for s, wait_s in ((sig, grace), (signal.SIGKILL, 1.0)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            try:
                os.killpg(p.pid, s)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.02)


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
