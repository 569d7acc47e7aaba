"""Training benchmarks of issue 11: DDP + ringtune hook against DDP's own gloo allreduce,
the overlap of background exchange with backward, and the hook's overhead per bucket.

Run under any MPI launch (one host or many; rank 0 prints Markdown for BENCHMARKS.md):

    .venv-torch/bin/mpiexec -n 2 .venv-torch/bin/python benchmarks/bench_training.py step
    .venv-torch/bin/mpiexec -n 2 .venv-torch/bin/python benchmarks/bench_training.py overlap
    .venv-torch/bin/mpiexec -n 2 .venv-torch/bin/python benchmarks/bench_training.py overhead

``step``: the digits MLP of examples/train_digits.py (``--hidden``/``--layers``; 2300x3 is
10.7 M parameters) wrapped twice in DDP on the same data, once with the ringtune hook and
once with DDP's default; rounds of ``--steps`` steps alternate between them so that drift
of a shared machine hits both alike. Median step time of each and the ratio.

``overlap``: the same model with small buckets (``--bucket-cap-mb``), three ways in
alternating rounds: compute only (a hook that returns each bucket untouched), comm only
(the same buckets averaged on the communication thread, no backward running), and
together (the ringtune hook). Hidden share of communication =
(compute + comm - together) / comm.

``overhead``: a 1 KiB bucket through ``ddp_hook`` (queue, thread hand-off, futures) against
``Communicator.allreduce`` of the same buffer on the calling thread; the difference is the
hook's cost per bucket. Also per bucket in bursts (DDP's pattern), the training thread's own
time in the hook, and a bare thread round trip (the operating system's share).

``--model embedding``: ``DigitsEmbedding``, a communication-bound model with ≥ 10 M
parameters and little compute. ``--mpi-progress=throttle``: MPICH sleeps in its waits
instead of spinning (``collectives.training.exchange.QUIET_PROGRESS_ENV``, set before MPI starts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import torch

if "--mpi-progress=throttle" in sys.argv:  # before MPI_Init: MPICH reads its CVARs there
    from collectives.training.exchange import QUIET_PROGRESS_ENV

    for _k, _v in QUIET_PROGRESS_ENV.items():
        os.environ.setdefault(_k, _v)
from mpi4py import MPI  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from train_digits import digits, init_gloo, make_model, shard, wrap  # noqa: E402

from collectives import Communicator  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


class DigitsEmbedding(nn.Module):
    """A communication-bound model: many parameters, little compute per step. Each digit's
    64 standardised pixels, quantised to 17 levels, pick 64 hashed rows of ``tables``
    embedding tables (``rows`` x ``dim`` each, dense gradients, so every step exchanges all
    of them, as a recommendation model's embeddings without sparse gradients do); the rows
    are summed and a linear layer gives the 10 classes."""

    def __init__(self, tables: int, rows: int, dim: int, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.rows = rows
        self.bags = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum")
                                  for _ in range(tables))
        self.out = nn.Linear(dim * tables, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        level = (x * 4).round().clamp(-8, 8).long() + 8  # 0..16
        key = torch.arange(64) * 17 + level
        parts = []
        for t, bag in enumerate(self.bags):
            idx = ((key + 1088 * t) * 2654435761) % self.rows
            parts.append(bag(idx))
        return self.out(torch.cat(parts, dim=1))


def build_model(args: argparse.Namespace) -> nn.Module:
    """The benchmark's model: ``--model mlp`` (examples/train_digits.py's MLP) or
    ``--model embedding`` (``DigitsEmbedding``)."""
    if args.model == "embedding":
        return DigitsEmbedding(args.tables, args.rows, args.dim)
    return make_model(args.hidden, args.layers)


def _sync_time(fn: Any) -> float:
    """Seconds of ``fn()`` on the slowest rank, started together."""
    WORLD.Barrier()
    t0 = time.perf_counter()
    fn()
    return WORLD.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def _steps(ddp: nn.Module, opt: Any, first: int, count: int, batch: int,
           data: Any) -> None:
    xtr, ytr = data[0], data[1]
    for step in range(first, first + count):
        idx = shard(step, len(xtr), batch, RANK, SIZE)
        opt.zero_grad(set_to_none=False)
        nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx]).backward()
        opt.step()


def _header(args: argparse.Namespace, what: str) -> None:
    hosts = len(set(WORLD.allgather(MPI.Get_processor_name())))  # collective: every rank
    if RANK == 0:
        params = sum(p.numel() for p in build_model(args).parameters())
        name = (f"embedding {args.tables}x{args.rows}x{args.dim}" if args.model == "embedding"
                else f"MLP {args.hidden}x{args.layers}")
        print(f"# {what}: {SIZE} ranks on {hosts} host(s), {name} "
              f"({params} parameters), batch "
              f"{args.batch}/rank, torch {torch.__version__}, {torch.get_num_threads()} "
              f"thread(s)/rank, {args.rounds} rounds x {args.steps} steps"
              + (", gradients as bucket views" if args.bucket_view else ""), flush=True)


def bench_step(args: argparse.Namespace, ring: Communicator) -> None:
    _header(args, "step time, DDP + ringtune hook vs DDP default (gloo)")
    from collectives.torch import HookState, ddp_hook

    data = digits()
    # hook name -> (DDP model, optimizer, its HookState; None for DDP's own gloo allreduce)
    models: dict[str, tuple[Any, Any, HookState | None]] = {}
    for c in _channel_counts(args):
        ddp, _ = wrap(build_model(args), "gloo", ring, args.bucket_cap_mb,
                      bucket_view=args.bucket_view)
        state = HookState(ring, channels=c)
        ddp.register_comm_hook(state, ddp_hook)
        models[_hook_name(c)] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), state)
    ddp, _ = wrap(build_model(args), "gloo", ring, args.bucket_cap_mb,
                  bucket_view=args.bucket_view)
    models["gloo"] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01), None)
    for ddp, opt, _ in models.values():  # warm-up: bucket rebuild, plans, gloo pairs
        _steps(ddp, opt, 0, 3, args.batch, data)
    times: dict[str, list[float]] = {h: [] for h in models}
    for r in range(args.rounds):
        for hook, (ddp, opt, _) in (models.items() if r % 2 == 0
                                    else reversed(list(models.items()))):
            first = 3 + r * args.steps
            t = _sync_time(lambda d=ddp, o=opt, f=first: _steps(d, o, f, args.steps,
                                                                args.batch, data))
            times[hook].append(t / args.steps)
    med = {h: statistics.median(v) * 1e3 for h, v in times.items()}
    if args.trace:
        for c in _channel_counts(args):
            ddp, opt, st = models[_hook_name(c)]
            assert st is not None  # a ringtune hook's entry, not gloo's
            _print_timeline(f"DDP + {_hook_name(c)} hook", _timeline(
                ddp, opt, 3 + args.rounds * args.steps, args.steps, args.batch, data,
                [ex for _, ex in st.channels]))
    first = models[_hook_name(_channel_counts(args)[0])][2]
    if RANK == 0 and first is not None:
        # What the profile chose for each bucket (the plans the hook cached while warming up).
        for index, (buf, _, prepared, _) in sorted(first._fast.items()):
            plan = prepared.plan
            print(f"bucket {index}: {buf.numel() * buf.element_size()} B -> "
                  f"{plan.algorithm} {plan.describe_params()} ({plan.source})")
        print("| hook | median step (ms) | rounds (ms) |")
        print("|---|---|---|")
        for h in models:
            print(f"| {h} | {med[h]:.2f} | {', '.join(f'{x * 1e3:.1f}' for x in times[h])} |")
        for c in _channel_counts(args):
            h = _hook_name(c)
            print(f"ratio gloo / {h}: {med['gloo'] / med[h]:.2f}x")
    for _, _, st in models.values():
        if st is not None:
            st.close()


def _channel_counts(args: argparse.Namespace) -> list[int]:
    return [int(c) for c in str(args.channels).split(",")]


def _hook_name(channels: int) -> str:
    return "ringtune" if channels == 1 else f"ringtune, {channels} channels"


def _noop_hook(state: Any, bucket: Any) -> Any:
    fut: Any = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


_noop_hook.__annotations__ = {"state": object, "bucket": torch.distributed.GradBucket,
                              "return": torch.futures.Future[torch.Tensor]}


def bench_overlap(args: argparse.Namespace, ring: Communicator) -> None:
    from thread_latency import set_thread_latency  # benchmarks/: an experiment, not runtime
    from torch.nn.parallel import DistributedDataParallel as DDP

    from collectives.torch import HookState, ddp_hook

    _header(args, f"overlap of exchange with backward, buckets of {args.bucket_cap_mb} MB")
    data = digits()
    compute = DDP(build_model(args), bucket_cap_mb=args.bucket_cap_mb,
                  gradient_as_bucket_view=args.bucket_view)
    compute.register_comm_hook(None, _noop_hook)
    opt_c = torch.optim.SGD(compute.parameters(), lr=0.01)
    _steps(compute, opt_c, 0, 3, args.batch, data)
    # One DDP model per channel count (HookState(channels=c)), each with its own optimizer.
    hooked: dict[int, tuple[nn.Module, Any, HookState]] = {}
    for c in _channel_counts(args):
        ddp = DDP(build_model(args), bucket_cap_mb=args.bucket_cap_mb,
                  gradient_as_bucket_view=args.bucket_view)
        st = HookState(ring, channels=c)
        ddp.register_comm_hook(st, ddp_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        _steps(ddp, opt, 0, 3, args.batch, data)
        hooked[c] = (ddp, opt, st)
    sizes = [int(s) for s in compute._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")]
    buckets = [torch.zeros(s // 4) for s in sizes]

    def comm_only(st: HookState) -> None:
        """The same buckets, averaged on the hook's channels in the hook's mapping."""
        chans = st.channels
        for _ in range(args.steps):
            futs = [chans[i % len(chans)][1].submit(chans[i % len(chans)][0].allreduce, b,
                                                    "avg") for i, b in enumerate(buckets)]
            for f in futs:
                f.result()

    def gloo_only() -> None:  # DDP's default exchange of the same buckets, for the ratio
        for _ in range(args.steps):
            works = [torch.distributed.all_reduce(b, async_op=True) for b in buckets]
            for w in works:
                w.wait()

    def latency(v: tuple[float, float] | None) -> None:
        """Every communication thread's slice and timer slack for the next measurement."""
        if v is not None:
            for _, _, st in hooked.values():
                for _, ex in st.channels:
                    ex.submit(set_thread_latency, v[0], v[1]).result()

    variants: list[tuple[float, float] | None] = [None]
    if args.variants:
        variants = [(float(a), float(b)) for a, b in
                    (v.split("/") for v in args.variants.split(","))]
    runs = [(c, v) for c in hooked for v in variants]

    def name(c: int, v: tuple[float, float] | None) -> str:
        return f"{c} ch" + ("" if v is None else f", {v[0]:g}/{v[1]:g} µs")

    t: dict[str, list[float]] = {"compute": [], "gloo": []}
    t.update({f"comm {c}": [] for c in hooked})
    t.update({name(c, v): [] for c, v in runs})
    for r in range(args.rounds):
        first = 3 + r * args.steps
        t["compute"].append(_sync_time(
            lambda f=first: _steps(compute, opt_c, f, args.steps, args.batch, data)))
        latency(variants[0])
        for c, (_, _, st) in hooked.items():
            t[f"comm {c}"].append(_sync_time(lambda s=st: comm_only(s)))
        # Variants in an order that turns each round, so that load drift within a round
        # does not favour one of them.
        for k in range(len(runs)):
            c, v = runs[(k + r) % len(runs)]
            latency(v)
            ddp, opt, _ = hooked[c]
            t[name(c, v)].append(_sync_time(
                lambda d=ddp, o=opt, f=first: _steps(d, o, f, args.steps, args.batch, data)))
        t["gloo"].append(_sync_time(gloo_only))
    latency(variants[-1])
    if args.trace:
        # Outside the timed rounds: the trace's own per-job cost stays out of the figures.
        first = 3 + args.rounds * args.steps
        for c, (ddp, opt, st) in hooked.items():
            exs = [ex for _, ex in st.channels]
            _print_timeline(f"together, ringtune hook, {c} channel(s)",
                            _timeline(ddp, opt, first, args.steps, args.batch, data, exs))
    med = {k: statistics.median(v) / args.steps * 1e3 for k, v in t.items()}
    if RANK == 0:
        print(f"buckets per step: {len(sizes)} ({', '.join(str(s) for s in sizes)} B)")
        print("| hook channels, exchange thread slice/slack | compute only (ms) | comm only (ms) "
              "| together (ms) | communication hidden | hidden, per round (median; range) |")
        print("|---|---|---|---|---|---|")
    for c, v in runs:
        n, m = name(c, v), f"comm {c}"
        hidden = (med["compute"] + med[m] - med[n]) / med[m]
        # Per round too (its figures measured back to back): load drift between rounds
        # moves compute-only by tens of percent on a shared machine.
        per_round = sorted((a + b - g) / b for a, b, g in zip(t["compute"], t[m], t[n]))
        if RANK == 0:
            print(f"| {n} | {med['compute']:.2f} | {med[m]:.2f} | {med[n]:.2f} | "
                  f"{100 * hidden:.0f}% | {100 * statistics.median(per_round):.0f}% "
                  f"({100 * per_round[0]:.0f} to {100 * per_round[-1]:.0f}%) |")
    if RANK == 0:
        c0 = next(iter(hooked))
        print(f"the same buckets through gloo's allreduce alone: {med['gloo']:.2f} ms "
              f"(gloo / ringtune comm only, {c0} channel(s): "
              f"{med['gloo'] / med[f'comm {c0}']:.2f}x)")
    for _, _, st in hooked.values():
        st.close()


def _timeline(ddp: nn.Module, opt: Any, first: int, count: int, batch: int, data: Any,
              ex: Any) -> list[dict[str, Any]]:
    """``count`` steps with the exchange thread's ``JobTrace`` on: per step, the training
    thread's forward/backward/optimizer marks and its time waiting for a core, and the
    communication thread's jobs (hand-over, start, end, CPU, waiting for a core)."""
    from collectives.training.exchange import _schedstat

    xtr, ytr = data[0], data[1]
    exs = ex if isinstance(ex, list) else [ex]
    traces = [e.trace(True) for e in exs]
    steps = []
    for step in range(first, first + count):
        idx = shard(step, len(xtr), batch, RANK, SIZE)
        WORLD.Barrier()
        for trace in traces:
            trace.clear()
        _, w0 = _schedstat()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(ddp(xtr[idx]), ytr[idx])
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        _, w1 = _schedstat()
        jobs = sorted((j for trace in traces for j in trace.jobs), key=lambda j: j[1])
        steps.append({"t0": t0, "fwd": t1 - t0, "bwd": t2 - t1, "opt": t3 - t2,
                      "waited": w1 - w0, "jobs": jobs})
    for e in exs:
        e.trace(False)
    return steps


def _print_timeline(title: str, steps: list[dict[str, Any]]) -> None:
    """Rank 0 prints the median (over steps) of each bucket's marks, in ms from the start
    of backward (from the step's start where there is no backward)."""
    every = WORLD.gather(steps, root=0)
    if RANK != 0 or every is None:  # the root alone receives the list
        return
    med = statistics.median
    print(f"timeline, {title} (ms from the start of backward; medians over "
          f"{len(steps)} steps x {SIZE} ranks)")
    flat = [s for r in every for s in r]
    print(f"training thread: forward {med(s['fwd'] for s in flat) * 1e3:.1f}, backward "
          f"{med(s['bwd'] for s in flat) * 1e3:.1f}, optimizer "
          f"{med(s['opt'] for s in flat) * 1e3:.1f}, waited for a core "
          f"{med(s['waited'] for s in flat) * 1e3:.1f}")
    print("| job (bucket, bytes) | handed over | started | ended | on CPU | waited for a core |")
    print("|---|---:|---:|---:|---:|---:|")
    njobs = min(len(s["jobs"]) for s in flat)
    for j in range(njobs):
        rows = [(s["jobs"][j], s["t0"] + s["fwd"]) for s in flat]
        label = rows[0][0][0]
        sub, st, en, cpu, wt = (med((job[k] - base) if k < 4 else job[k]
                                    for job, base in rows) * 1e3 for k in range(1, 6))
        print(f"| {label} | {sub:.1f} | {st:.1f} | {en:.1f} | {cpu:.1f} | {wt:.1f} |")


class _Bucket:
    """Stands in for DDP's ``GradBucket`` (what ``ddp_hook`` reads of it)."""

    def __init__(self, buf: torch.Tensor, index: int = 0, last: bool = True) -> None:
        self.buf = buf
        self.i = index
        self.last = last

    def index(self) -> int:
        return self.i

    def buffer(self) -> torch.Tensor:
        return self.buf

    def is_last(self) -> bool:
        return self.last

    def parameters(self) -> list[torch.Tensor]:
        return [self.buf]


def _wakeup_floor(calls: int) -> float:
    """Seconds of one bare thread round trip (lock released by the other thread and back):
    the operating system's part of every hand-off, with no ringtune code in it."""
    import queue
    import threading

    jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def loop() -> None:
        while (lock := jobs.get()) is not None:
            lock.release()

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    lock = threading.Lock()
    t0 = time.perf_counter()
    for _ in range(calls):
        lock.acquire()
        jobs.put(lock)
        lock.acquire()
        lock.release()
    dt = (time.perf_counter() - t0) / calls
    jobs.put(None)
    th.join()
    return dt


def bench_overhead(args: argparse.Namespace, ring: Communicator) -> None:
    """Per 1 KiB bucket, medians over rounds and ranks: ``allreduce`` of the tensor on the
    calling thread; one bucket through ``ddp_hook`` waited for at once (two thread hand-offs
    on its critical path); a burst of ``--burst`` buckets queued, then waited for, as DDP
    does within one backward (per bucket); the training thread's own time in ``ddp_hook``
    (what backward pays); and the bare thread round trip of the operating system."""
    from collectives.torch import HookState, ddp_hook

    if RANK == 0:
        print(f"# hook overhead per 1 KiB bucket: {SIZE} ranks, {args.calls} calls x "
              f"{args.rounds} rounds, bursts of {args.burst}", flush=True)
    state = HookState(ring)
    bufs = [torch.zeros(256) for _ in range(args.burst)]
    buckets = [_Bucket(b, i, i == args.burst - 1) for i, b in enumerate(bufs)]
    bucket = buckets[0]
    for _ in range(50):
        ddp_hook(state, bucket).wait()
        ring.allreduce(bufs[0], op="avg")
    for b in buckets:
        ddp_hook(state, b).wait()
    res: dict[str, list[float]] = {k: [] for k in ("direct", "one", "burst", "dispatch",
                                                   "floor")}
    bursts = max(1, args.calls // args.burst)
    for _ in range(args.rounds):
        WORLD.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            ring.allreduce(bufs[0], op="avg")
        res["direct"].append((time.perf_counter() - t0) / args.calls)
        WORLD.Barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            ddp_hook(state, bucket).wait()
        res["one"].append((time.perf_counter() - t0) / args.calls)
        WORLD.Barrier()
        t0 = time.perf_counter()
        spent = 0.0
        for _ in range(bursts):
            futs = []
            for b in buckets:
                t1 = time.perf_counter()
                futs.append(ddp_hook(state, b))
                spent += time.perf_counter() - t1
            for f in futs:
                f.wait()
        n = bursts * args.burst
        res["burst"].append((time.perf_counter() - t0) / n)
        res["dispatch"].append(spent / n)
        res["floor"].append(_wakeup_floor(args.calls))
    med = {k: statistics.median(WORLD.allgather(statistics.median(v))) * 1e6
           for k, v in res.items()}
    state.close()
    if RANK == 0:
        print("| allreduce on the calling thread (µs) | ddp_hook, one bucket waited (µs) | "
              "overhead (µs) | ddp_hook in a burst, per bucket (µs) | overhead (µs) | "
              "training thread's time in ddp_hook (µs) | bare thread round trip (µs) |")
        print("|---|---|---|---|---|---|---|")
        print(f"| {med['direct']:.1f} | {med['one']:.1f} | {med['one'] - med['direct']:.1f} | "
              f"{med['burst']:.1f} | {med['burst'] - med['direct']:.1f} | "
              f"{med['dispatch']:.1f} | {med['floor']:.1f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("step", "overlap", "overhead"))
    p.add_argument("--model", choices=("mlp", "embedding"), default="mlp")
    p.add_argument("--tables", type=int, default=4, help="embedding: tables")
    p.add_argument("--rows", type=int, default=40000, help="embedding: rows per table")
    p.add_argument("--dim", type=int, default=64, help="embedding: row width")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--burst", type=int, default=16, help="overhead: buckets per burst")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bucket-view", action="store_true",
                   help="step, overlap: DDP's gradient_as_bucket_view=True for every model "
                        "(gloo's too)")
    p.add_argument("--profile", default=None)
    p.add_argument("--variants", default="",
                   help="overlap: 'SLICE/SLACK,...' (µs): measure 'together' once per "
                   "variant each round with the exchange thread's scheduler slice and timer "
                   "slack set so (benchmarks/thread_latency.py; slice 0 = the "
                   "kernel's default), e.g. 0/50,100/50")
    p.add_argument("--channels", default="1",
                   help="step: exchange channels of the ringtune hook (HookState(channels=)); "
                   "a list such as 1,2 measures one DDP model per count, side by side")
    p.add_argument("--trace", action="store_true",
                   help="overlap: after the timed rounds, print each bucket's timeline on "
                   "the communication thread against backward "
                   "(collectives.training.exchange.JobTrace)")
    p.add_argument("--mpi-progress", choices=("spin", "throttle"), default="spin",
                   help="MPICH's waits: its default busy polling, or QUIET_PROGRESS_ENV "
                   "(collectives/training/exchange.py: sleep after empty polls); give it as "
                   "--mpi-progress=throttle (read before MPI starts)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    init_gloo(WORLD)
    ring = Communicator(WORLD.Dup(), profile=args.profile)
    {"step": bench_step, "overlap": bench_overlap, "overhead": bench_overhead}[args.what](
        args, ring)
    ring.close()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
