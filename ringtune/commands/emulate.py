"""ringtune emulate — run a command across a cluster emulated on this machine.

Each host of the cluster file (the ``profiles/clusters/`` format that ``ringtune simulate``
reads) becomes a network namespace with its own hostname and address, joined through a
switch namespace (two tiers of switches with racks) by veth pairs whose rate is shaped with
``tc tbf``; COMMAND then runs as the MPI ranks, as ``mpiexec -hosts … COMMAND`` would run it,
and its exit status is this command's. Everything is removed on exit, failure, Ctrl-C or
SIGTERM. Needs root; where namespaces cannot be built it exits 77 with the reason.

With ``--launcher torchrun`` COMMAND runs as a torchrun job instead: one torchrun agent per
emulated host, started inside that host's namespace (``--nnodes H --nproc-per-node R
--node-rank i``), the rendezvous and the job's store on host 0's address at a free port;
a ``.py`` COMMAND is torchrun's script, anything else runs with ``--no-python``. The
torchrun is the one beside this Python (else PATH's). Ranks are numbered host by host
(``--placement block`` only). A failed agent ends the others within seconds; the exit
status is the failed agent's.

  ringtune emulate --cluster profiles/clusters/emulated-2x2.yaml -- ringtune tune --out p.yaml
  ringtune emulate --cluster profiles/clusters/emulated-2x2.yaml --placement round-robin \\
      -- ringtune bench -b 1M -e 16M
  ringtune emulate --cluster profiles/clusters/emulated-2x2.yaml --launcher torchrun \\
      -- examples/train_digits.py --backend ringtune
  ringtune emulate --cleanup         # remove what a killed earlier run left behind

One run at a time per machine (a lock); leftovers of a killed run are removed by the next.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..flags import add_wait

if TYPE_CHECKING:
    from ringtune.emulate.spec import EmulatedCluster

HELP = "run a command across emulated hosts with shaped links (network namespaces)"

#: Seconds to wait for another emulation to end when ``--wait`` is not given (a test suite
#: or a shared machine that queues emulations sets it once).
WAIT_ENV = "RINGTUNE_EMULATE_WAIT"

#: Exit status when this machine cannot emulate (not root, no namespaces): a test skips.
EXIT_UNAVAILABLE = 77


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="FILE",
                   help="cluster description (YAML, see profiles/clusters/emulated-*.yaml)")
    p.add_argument("--placement", choices=("block", "round-robin"), default="block",
                   help="ranks 0..k-1 on the first host (block, default) or rank r on host "
                        "r mod hosts (round-robin, as mpiexec -ppn 1 cycling)")
    p.add_argument("--launcher", choices=("mpiexec", "torchrun"), default="mpiexec",
                   help="start COMMAND as MPI ranks under MPICH's mpiexec (default), or as "
                        "a torchrun job: one torchrun agent per emulated host "
                        "(torch.distributed; needs ringtune[torch])")
    p.add_argument("--hostname-prefix", metavar="P",
                   help="name the hosts P0, P1, … (default: the file's emulate."
                        "hostname_prefix, else 'host')")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove namespaces and files left by earlier runs, then exit")
    add_wait(p, "another `ringtune emulate` runs on this machine (one at a time)",
             f"default: ${WAIT_ENV}, else 0")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no set-up/teardown lines on stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="what to run as the ranks (after --)")


def run(args: argparse.Namespace) -> int:
    from collectives.mpi.launcher import under_torchrun
    from ringtune.emulate import netns, runner
    from ringtune.emulate.spec import HOSTNAME_PREFIX, load_emulated
    from ringtune.errors import UsageError
    from ringtune.launch import under_mpiexec

    def say(text: str) -> None:
        if not args.quiet:
            print(f"ringtune emulate: {text}", file=sys.stderr, flush=True)

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if args.cleanup:
        if command or args.cluster:
            raise UsageError("emulate --cleanup takes no --cluster and no command")
    else:
        if not args.cluster:
            raise UsageError("emulate: --cluster FILE is required (see profiles/clusters/"
                             "emulated-2x2.yaml)")
        if not command:
            raise UsageError("emulate: no command; give one after --, e.g. `ringtune emulate "
                             "--cluster c.yaml -- ringtune probe`")
    if args.hostname_prefix is not None and not HOSTNAME_PREFIX.fullmatch(args.hostname_prefix):
        raise UsageError(f"emulate --hostname-prefix {args.hostname_prefix!r}: expected "
                         f"lower-case letters, digits and '-', starting with a letter")
    if under_mpiexec() or under_torchrun():
        raise UsageError("emulate: run it from a shell, not under mpiexec or torchrun (it "
                         "starts its own)")
    wait = _wait_seconds(args.wait)
    spec = None if args.cleanup else load_emulated(args.cluster)  # bad input: exit 2 first
    if args.cleanup:
        launcher = ""
    elif args.launcher == "torchrun":
        launcher = _torchrun(args, command)
    else:
        launcher = _hydra_mpiexec()
    try:
        netns.preflight()
    except netns.EmulationUnavailable as exc:
        print(f"ringtune: emulate unavailable here: {exc}", file=sys.stderr, flush=True)
        return EXIT_UNAVAILABLE

    old = runner.install_signal_handlers()
    try:
        with netns.run_lock(wait, say):
            left = netns.cleanup_leftovers()
            if left:
                say(f"removed {len(left)} namespace(s) left by an earlier run "
                    f"({', '.join(left)})")
            if spec is None:
                if not left:
                    say("nothing to clean up")
                return 0
            return _emulate(spec, args, command, launcher, say, os.getpid())
    except KeyboardInterrupt:
        say("interrupted; the emulated cluster is removed")
        return 130
    except runner.Terminated as exc:
        say(f"{exc}; the emulated cluster is removed")
        return 128 + exc.signum
    finally:
        runner.restore_signal_handlers(old)


def _wait_seconds(flag: float | None) -> float:
    """``--wait``, else ``$RINGTUNE_EMULATE_WAIT``, else 0; a negative or non-number value is
    one line naming where it came from."""
    from ringtune.errors import UsageError

    if flag is not None:
        if not flag >= 0:  # --wait alone is inf: no limit
            raise UsageError(f"emulate --wait {flag:g}: expected seconds >= 0")
        return flag
    from collectives.plumbing.stall import env_seconds

    try:
        return env_seconds(WAIT_ENV, "how long `ringtune emulate` waits for another one "
                           "to end")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _hydra_mpiexec() -> str:
    """The mpiexec to run across the namespaces: it must be Hydra (MPICH's or Intel MPI's
    launcher: ``-hosts``, ``-launcher rsh -launcher-exec SHIM``, ``-genv``) and fit the
    library mpi4py loads; otherwise one line (exit 2) saying what to install."""
    from ringtune.errors import UsageError
    from ringtune.launch import check_launcher, find_mpiexec, library_family, mpiexec_family

    mpiexec = find_mpiexec()
    launcher = mpiexec_family(mpiexec)
    if launcher == "openmpi":
        raise UsageError(
            f"emulate: {mpiexec} is Open MPI's launcher; ringtune emulate starts the ranks "
            "with MPICH's Hydra across the emulated hosts (its rsh launcher and its ofi "
            "netmod), which Open MPI's launcher does not take: run emulate from an "
            "environment with MPICH (pip install 'ringtune[mpich]'), or set "
            "RINGTUNE_MPIEXEC to a Hydra mpiexec of the same library as mpi4py")
    check_launcher(mpiexec, launcher, library_family())
    return mpiexec


def _torchrun(args: argparse.Namespace, command: list[str]) -> str:
    """The torchrun to start the agents with, after the checks of ``--launcher torchrun``
    (each a one-line ``UsageError``, exit 2)."""
    from ringtune.emulate import runner
    from ringtune.errors import UsageError

    if args.placement != "block":
        raise UsageError(f"emulate --launcher torchrun --placement {args.placement}: torchrun "
                         "numbers ranks host by host; use --placement block (the default) "
                         "or --launcher mpiexec")
    torchrun = runner.find_torchrun()
    if torchrun is None:
        raise UsageError(f"emulate --launcher torchrun: no torchrun beside {sys.executable} "
                         "nor on PATH; install PyTorch (pip install 'ringtune[torch]')")
    script = command[0]
    if script.endswith(".py"):
        if not os.path.isfile(script):
            raise UsageError(f"emulate --launcher torchrun: script {script} not found")
    else:
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        if shutil.which(script, path=path) is None:
            raise UsageError(f"emulate --launcher torchrun: command {script} not found (give "
                             "a .py script, or a program on PATH)")
    return torchrun


def _emulate(spec: EmulatedCluster, args: argparse.Namespace, command: list[str],
             launcher: str, say: Callable[[str], None], run_id: int) -> int:
    """Build, run, tear down; the command's exit status."""
    from ringtune.emulate import netns, runner
    from ringtune.emulate.monitor import HostMonitor

    t0 = time.monotonic()
    net = netns.Network(spec, run_id, netns.pick_subnet(), args.hostname_prefix)
    procs: list[Any] = []
    monitor = None
    interrupted: int | None = None
    try:
        net.build()
        runner.raise_pending()  # a signal during the set-up ends the run here at the latest
        say(f"{spec.describe()}; hosts "
            f"{', '.join(f'{h.hostname}={h.address}' for h in net.hosts)}; "
            f"set up in {runner.elapsed(t0)}")
        if args.launcher == "torchrun":
            procs = runner.run_torchrun(net, launcher, command, not args.quiet)
        else:
            procs = [runner.run_command(net, launcher, command, args.placement,
                                        not args.quiet)[0]]
        monitor = HostMonitor(net.hosts)
        monitor.start()
        try:
            runner.raise_pending()
            if args.launcher == "torchrun":
                code, failed = runner.wait_agents(procs)
            else:
                code, failed = runner.wait(procs[0]), None
            monitor.stop()
            if code != 0:
                _explain_failure(net, args.placement, code, monitor, failed)
            return code
        except KeyboardInterrupt:
            interrupted = signal.SIGINT
            raise
        except runner.Terminated as exc:
            interrupted = exc.signum
            raise
    finally:
        t1 = time.monotonic()
        if monitor is not None:
            monitor.stop()
        # A second Ctrl-C must not cut the teardown short and leave namespaces behind.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if procs:
            runner.stop_all(procs, signal.SIGINT if interrupted is None else interrupted)
        net.teardown()
        shutil.rmtree(os.path.join(netns.STATE_DIR, str(run_id)), ignore_errors=True)
        say(f"torn down in {runner.elapsed(t1)}")


def host_ranks(hosts: int, per_host: int, placement: str) -> list[list[int]]:
    """The ranks of each host for ``placement`` (how ``runner`` lays them out)."""
    n = hosts * per_host
    if placement == "round-robin":
        return [list(range(h, n, hosts)) for h in range(hosts)]
    return [list(range(h * per_host, (h + 1) * per_host)) for h in range(hosts)]


def _explain_failure(net: Any, placement: str, code: int, monitor: Any,
                     failed_agent: int | None = None) -> None:
    """One line on stderr naming the host (and its ranks) that failed first, when known:
    where a rank process ended first (the monitor), else the host whose torchrun agent
    failed first."""
    ranks = host_ranks(net.spec.hosts, net.spec.ranks_per_host, placement)
    lost = monitor.first_lost
    if lost is not None:
        rank = monitor.first_rank
        where = (f"host {lost.hostname} ({lost.address}, ranks "
                 f"{', '.join(map(str, ranks[lost.index]))}): a rank there ended first"
                 + (f" (rank {rank})" if rank is not None else ""))
    elif failed_agent is not None:
        h = net.hosts[failed_agent]
        where = (f"host {h.hostname} ({h.address}, ranks "
                 f"{', '.join(map(str, ranks[h.index]))}): its torchrun agent failed first")
    else:
        where = "ranks by host: " + "; ".join(
            f"{h.hostname} {', '.join(map(str, ranks[h.index]))}" for h in net.hosts)
        if monitor.why:
            where += f" (which ended first is not known: {monitor.why})"
    print(f"ringtune emulate: the command failed (exit status {code}); {where}",
          file=sys.stderr, flush=True)
