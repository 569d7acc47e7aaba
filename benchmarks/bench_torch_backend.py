"""Per-call cost of the registered ``ringtune`` backend against gloo's: ``dist.all_reduce``
of a small tensor (default 1 KiB), synchronous, back to back, under torchrun::

    torchrun --standalone --nproc-per-node 2 benchmarks/bench_torch_backend.py --backend gloo
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_torch_backend.py --backend ringtune

Rank 0 prints the median and the best of ``--rounds`` rounds of ``--calls`` calls, in µs
per call. The difference between the two runs is the backend's own cost per call (the
target: at most 50 µs above gloo at 1 KiB). At 1 rank both reduce nothing, so the figure
is the call path alone.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="ringtune", choices=("ringtune", "gloo"))
    p.add_argument("--bytes", type=int, default=1024)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    if args.backend == "ringtune":
        import collectives.torch  # noqa: F401 - registers the backend
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    t = torch.ones(max(1, args.bytes // 4))
    for _ in range(200):
        dist.all_reduce(t)
    per_call = []
    for _ in range(args.rounds):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            dist.all_reduce(t)
        per_call.append((time.perf_counter() - t0) / args.calls * 1e6)
    if dist.get_rank() == 0:
        print(f"{args.backend}: {dist.get_world_size()} rank(s), {args.bytes} B, "
              f"median {statistics.median(per_call):.1f} us/call, best {min(per_call):.1f} "
              f"us/call over {args.rounds} rounds of {args.calls}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
