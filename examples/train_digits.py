"""Data-parallel training of a small network on scikit-learn's digits, DDP + ringtune.

Run under torchrun (one process per rank; ``--nnodes`` for several hosts), where the
registered ``ringtune`` backend gives DDP ringtune's allreduce with no hook::

    torchrun --nproc-per-node 4 examples/train_digits.py                # --backend ringtune
    torchrun --nproc-per-node 2 examples/train_digits.py --backend gloo --steps 200
    torchrun --nproc-per-node 2 examples/train_digits.py --backend gloo --hook ringtune

or under any MPI launch, where ringtune's DDP hook averages the gradients over MPI::

    .venv-torch/bin/mpiexec -n 4 .venv-torch/bin/python examples/train_digits.py
    .venv-torch/bin/mpiexec -n 2 .venv-torch/bin/python examples/train_digits.py \\
        --hook gloo --steps 200                  # DDP's own allreduce, for comparison
    ... --staleness 1 | --average-every 4         # bounded staleness / local SGD

The data (1797 8x8 images, 10 classes) ships with scikit-learn: no download. Every rank
takes its slice of each global batch; DDP averages the gradients. ``--backend`` is the
process group's (``ringtune``: its all_reduce runs the profile's choice, the rest is gloo's;
``gloo``: gloo's own). ``--hook ringtune`` registers ringtune's comm hook instead, over
``Communicator(MPI.COMM_WORLD.Dup())`` under mpiexec or ``Communicator(group.WORLD)`` under
torchrun; ``--hook none`` (``gloo``) leaves DDP's own allreduce, the backend's; ``--hook
noop`` skips the exchange (torch's ``noop_hook``: the gradients are not averaged, so the
model is not the one the job would train) — the step's time without communication, the most
any allreduce could gain, for headroom analysis. Defaults: ``--backend ringtune --hook
none`` under torchrun, ``--backend gloo --hook ringtune`` under mpiexec. Under mpiexec the
process group is set up from MPI: rank 0's address and a free port are broadcast
(``MASTER_ADDR`` overrides the address, e.g. on hosts with several interfaces). Rank 0
prints the loss, the test accuracy and the median step time; ``--json FILE`` writes them,
with each step's loss.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from collectives.mpi.launcher import under_torchrun


def init_gloo(comm: Any, backend: str = "gloo") -> None:
    """The process group (``backend``: gloo, or ringtune after ``import collectives.torch``)
    of this MPI world (collective over ``comm``)."""
    if dist.is_initialized():
        return
    addr = port = None
    if comm.Get_rank() == 0:
        addr = os.environ.get("MASTER_ADDR") or _my_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port), root=0)
    # Rank 0's bcast may return before its message left: over libfabric's tcp provider (MPI
    # between hosts) data moves only while the sender calls into MPI, and rank 0 next blocks
    # in the store's rendezvous, which waits for the ranks the message has not reached. The
    # barrier keeps every rank in MPI until all have the address.
    comm.Barrier()
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}",
                            rank=comm.Get_rank(), world_size=comm.Get_size())


def _my_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1,797 8x8 images), read from the file it ships: what
    ``sklearn.datasets.load_digits(return_X_y=True)`` returns, without importing
    scikit-learn (seconds of CPU per rank, more than the rest of a short job)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("train_digits: scikit-learn is not installed (it ships the digits "
                         "data set): pip install 'ringtune[torch]'")
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data",
                        "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def digits(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standardised digits, 80/20 train/test split with a fixed seed."""
    x, y = _load_digits()
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, te = order[:cut], order[cut:]
    f = torch.tensor
    return (f(x[tr], dtype=torch.float32), f(y[tr]), f(x[te], dtype=torch.float32),
            f(y[te]))


def make_model(hidden: int = 64, layers: int = 2, seed: int = 0) -> nn.Module:
    """An MLP 64 -> hidden (x layers) -> 10, the same initial weights on every rank."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    width = 64
    for _ in range(layers):
        mods += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    mods.append(nn.Linear(width, 10))
    return nn.Sequential(*mods)


def shard(step: int, n: int, batch: int, rank: int, world: int,
          seed: int = 0) -> torch.Tensor:
    """Rank ``rank``'s indices of global batch ``step`` (every rank draws the same global
    batch; ``batch`` is per rank)."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    idx = torch.randint(0, n, (batch * world,), generator=g)
    return idx[rank * batch:(rank + 1) * batch]


def capped_ddp(model: nn.Module, bucket_cap_mb: float = 25.0, **kwargs: Any) -> nn.Module:
    """``DistributedDataParallel(model, bucket_cap_mb=..., **kwargs)`` whose every bucket,
    the first included, holds at most ``bucket_cap_mb`` MiB: use it where the number of
    buckets matters (several in flight per step, one per exchange channel).

    Older torch (2.7 among them) capped DDP's first bucket at
    ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) whatever ``bucket_cap_mb``
    said, so a model under 1 MiB always got one bucket; newer torch caps it at
    ``bucket_cap_mb`` when that is given. DDP reads the module constant while it is built,
    so lowering it for the construction alone gives every torch the same buckets (on newer
    torch it changes nothing)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    # DDP has no argument for its first bucket's size: the module constant is the only way
    # (checked on torch 2.13.0 and 2.14.1).
    first = dist._DEFAULT_FIRST_BUCKET_BYTES  # noqa: SLF001
    dist._DEFAULT_FIRST_BUCKET_BYTES = min(first, int(bucket_cap_mb * 1024 * 1024))  # noqa: SLF001
    try:
        return DDP(model, bucket_cap_mb=bucket_cap_mb, **kwargs)
    finally:
        dist._DEFAULT_FIRST_BUCKET_BYTES = first  # noqa: SLF001


def wrap(model: nn.Module, hook: str, comm: Any = None, bucket_cap_mb: float = 25.0,
         staleness: int = 0, average_every: int = 1,
         bucket_view: bool = False, process_group: Any = None) -> tuple[nn.Module, Any]:
    """DDP around ``model`` over ``process_group`` (default: the default group); with
    ``hook='ringtune'`` the ringtune hook averages buckets, with ``gloo``/``none`` DDP's
    own allreduce (the group's backend's) does, with ``noop`` nothing is exchanged (the
    step's compute alone). ``bucket_view``: DDP's
    ``gradient_as_bucket_view`` (gradients live in the buckets: no copy into a bucket
    before its exchange nor back out after it)."""
    ddp = capped_ddp(model, bucket_cap_mb, gradient_as_bucket_view=bucket_view,
                     process_group=process_group)
    state = None
    if hook == "ringtune":
        from collectives.torch import HookState, ddp_hook

        state = HookState(comm, staleness=staleness, average_every=average_every)
        ddp.register_comm_hook(state, ddp_hook)
    elif hook == "noop":
        from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

        ddp.register_comm_hook(None, noop_hook)
    elif hook not in ("gloo", "none"):
        raise ValueError(f"--hook {hook!r}: use ringtune, gloo, none or noop")
    return ddp, state


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def train(args: argparse.Namespace, comm: Any = None) -> dict[str, Any]:
    """Train for ``args.steps`` steps; returns losses, accuracy and step times (rank 0's
    view; every rank returns its own)."""
    from collectives import Communicator

    resolve_defaults(args)
    if args.backend == "ringtune":
        import collectives.torch  # noqa: F401 - registers the ringtune backend

    world: Any = None
    if under_torchrun():
        if not dist.is_initialized():
            dist.init_process_group(args.backend)
    else:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        init_gloo(world, args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    xtr, ytr, xte, yte = digits()
    model = make_model(args.hidden, args.layers)
    ring = comm
    if args.hook == "ringtune" and ring is None:
        # Its own communicator: the hook's exchange thread must not share one with the
        # job's other collectives.
        ring = Communicator(world.Dup() if world is not None else dist.new_group(
            backend="gloo"), profile=args.profile)
    ddp, state = wrap(model, args.hook, ring, args.bucket_cap_mb, args.staleness,
                      args.average_every, args.bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    lossf = nn.CrossEntropyLoss()
    losses, times = [], []
    for step in range(args.steps):
        idx = shard(step, len(xtr), args.batch, rank, size)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = lossf(ddp(xtr[idx]), ytr[idx])
        loss.backward()
        opt.step()
        if state is not None:
            state.average_parameters(ddp.parameters())
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if state is not None:
        state.wait()
    # The global loss of every step in one reduction after the loop, not one MPI call per
    # step: with gloo exchanging the gradients, a rank leaving an MPI call whose message to
    # another host is still queued (libfabric tcp sends only while the sender is in MPI)
    # would block in gloo's allreduce while its peer waits for that message.
    total = np.array(losses, dtype=np.float64)
    if world is not None:
        from mpi4py import MPI

        world.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    else:
        summed = torch.from_numpy(total)
        dist.all_reduce(summed)  # through the job's backend (ringtune's, or gloo's)
    losses = [float(v) / size for v in total]
    out = {"hook": args.hook, "backend": args.backend,
           "launcher": "mpiexec" if world is not None else "torchrun", "ranks": size,
           "steps": args.steps, "staleness": args.staleness,
           "average_every": args.average_every,
           "parameters": sum(p.numel() for p in model.parameters()),
           "final_loss": float(np.mean(losses[-10:])), "test_accuracy": accuracy(model, xte, yte),
           "median_step_ms": 1e3 * statistics.median(times[min(5, len(times) - 1):]),
           "losses": losses}
    if state is not None:
        state.close()
    if ring is not None and comm is None:
        ring.close()
    return out


def write_workload(args: argparse.Namespace, path: str) -> None:
    """A workload file for ``ringtune tune --workload`` / ``ringtune simulate``: this
    model's gradient sizes in the order backward produces them (last layer first) and the
    measured compute time of one step on this process (forward and backward, no exchange)."""
    import yaml

    from collectives.plumbing.atomic import write_text_atomic

    model = make_model(args.hidden, args.layers)
    xtr, ytr = digits()[:2]
    lossf = nn.CrossEntropyLoss()
    times = []
    for step in range(6):
        idx = shard(step, len(xtr), args.batch, 0, 1)
        t0 = time.perf_counter()
        model.zero_grad()
        lossf(model(xtr[idx]), ytr[idx]).backward()
        times.append(time.perf_counter() - t0)
    sizes = [p.numel() * p.element_size() for p in model.parameters()][::-1]
    data = {"name": f"digits-mlp-{args.hidden}x{args.layers}",
            "description": f"examples/train_digits.py --hidden {args.hidden} --layers "
                           f"{args.layers} --batch {args.batch}: "
                           f"{sum(p.numel() for p in model.parameters())} float32 parameters",
            "gradient_bytes": sum(sizes), "tensor_bytes": sizes,
            "compute_seconds": round(statistics.median(times[1:]), 6),
            "overlap": 0.0,
            "sources": [f"measured by examples/train_digits.py --write-workload, torch "
                        f"{torch.__version__}, {torch.get_num_threads()} thread(s)"]}
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False, width=99))
    print(f"wrote {path}: {len(sizes)} tensors, {sum(sizes)} B, compute "
          f"{data['compute_seconds'] * 1e3:.1f} ms per step")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default=None, choices=("ringtune", "gloo"),
                   help="the process group's backend (default: ringtune under torchrun, "
                   "gloo under mpiexec)")
    p.add_argument("--hook", default=None, choices=("ringtune", "gloo", "none", "noop"),
                   help="ringtune: ringtune's DDP comm hook; gloo or none: DDP's own "
                   "allreduce through the backend; noop: no exchange at all (the step's "
                   "compute alone, for headroom analysis) (default: none under torchrun, "
                   "ringtune under mpiexec)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP's gradient_as_bucket_view=True (no gradient copies into and "
                        "out of the buckets)")
    p.add_argument("--staleness", type=int, default=0, choices=(0, 1))
    p.add_argument("--average-every", type=int, default=1, metavar="H")
    p.add_argument("--profile", default=None, help="ringtune profile (default: "
                   "$RINGTUNE_PROFILE or built-in)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--write-workload", default=None, metavar="FILE",
                   help="write this model's workload file (tensor sizes, compute time) and "
                        "exit; no MPI launch needed")
    return p


def resolve_defaults(args: argparse.Namespace) -> None:
    """``--backend``/``--hook`` defaults by launcher (see the module docstring)."""
    torchrun = under_torchrun()
    if args.backend is None:
        args.backend = "ringtune" if torchrun else "gloo"
    if args.hook is None:
        args.hook = "none" if torchrun else "ringtune"


def main() -> None:
    args = parser().parse_args()
    resolve_defaults(args)
    torch.set_num_threads(args.threads)
    if args.write_workload:
        write_workload(args, args.write_workload)
        return
    result = train(args)
    if dist.get_rank() == 0:
        print(f"{result['launcher']}, {result['backend']} backend, {result['hook']} hook, "
              f"{result['ranks']} ranks, {result['parameters']} "
              f"parameters, staleness {args.staleness}, average every {args.average_every}: "
              f"loss {result['final_loss']:.4f}, test accuracy {result['test_accuracy']:.3f}, "
              f"median step {result['median_step_ms']:.2f} ms")
        if args.json:
            from collectives.plumbing.atomic import write_text_atomic

            write_text_atomic(args.json, json.dumps(result, indent=1))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
