"""GPU benchmarks of issue 5: the reduction kernel against the device's copy bandwidth, and
``ringtune bench`` on GPU buffers.

    python benchmarks/bench_gpu.py kernel [--mib 256] [--iters 20] [--json FILE]
    python benchmarks/bench_gpu.py allreduce [-np 2] [-e 64M] [--json-dir DIR]

``kernel`` times, in one run on this rank's GPU, with CUDA events on the backend's stream:
a device-to-device copy of ``--mib`` MiB (``cudaMemcpyAsync``) and the backend's
``reduce_into(dst, src, "sum")`` on float32 buffers of that size — the 16-byte vector path
(aligned buffers), the scalar path (buffers misaligned against each other) and float16
(CuPy ElementwiseKernel). Both are memory-bound, so both are reported as bytes of memory
traffic per second: a copy reads and writes the buffer (2 × size), a sum reads two buffers
and writes one (3 × size). The target of issue 5: the float32 sum reaches ≥ 80% of the
copy's bandwidth.

``allreduce`` runs ``ringtune bench -G`` (GPU buffers) under mpiexec for ``native`` and for
``multiring`` over the ``staged`` transport, printing the nccl-tests-style tables.
Speed is reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any


def _time_ms(fn: Any, stream: Any, iters: int, reps: int = 5) -> float:
    """Median over ``reps`` of the mean time of ``iters`` back-to-back calls (CUDA events
    on ``stream``: GPU time, launches overlap with execution)."""
    import cupy

    for _ in range(3):
        fn()
    stream.synchronize()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(iters):
            fn()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / iters)
    return statistics.median(times)


def kernel(args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    from collectives.cuda import current_binding
    from collectives.registry import get_backend

    be: Any = get_backend("cupy")
    stream = be.stream
    nbytes = args.mib << 20
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(be.device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    with cupy.cuda.Device(be.device), stream:
        # +16 bytes so that a view shifted by one element keeps the full size.
        src_raw = cupy.zeros(nbytes + 16, dtype=cupy.uint8)
        dst_raw = cupy.zeros(nbytes + 16, dtype=cupy.uint8)
    n = nbytes // 4
    src = src_raw[:nbytes].view(cupy.float32)
    dst = dst_raw[:nbytes].view(cupy.float32)
    src_mis = src_raw[4:4 + nbytes].view(cupy.float32)  # misaligned against dst

    def copy() -> None:
        rt.memcpyAsync(int(dst.data.ptr), int(src.data.ptr), nbytes,
                       rt.memcpyDeviceToDevice, stream.ptr)

    t_copy = _time_ms(copy, stream, args.iters)
    t_vec = _time_ms(lambda: be.reduce_into(dst, src, "sum"), stream, args.iters)
    t_scalar = _time_ms(lambda: be.reduce_into(dst, src_mis, "sum"), stream, args.iters)
    h_src, h_dst = src.view(cupy.float16), dst.view(cupy.float16)
    t_half = _time_ms(lambda: be.reduce_into(h_dst, h_src, "sum"), stream, args.iters)

    def gbps(bytes_moved: int, ms: float) -> float:
        return bytes_moved / (ms * 1e-3) / 1e9

    copy_bw = gbps(2 * nbytes, t_copy)
    binding = current_binding()
    out = {
        "gpu": name, "binding": binding.describe() if binding is not None else "",
        "mib": args.mib, "elements_float32": n, "iters": args.iters,
        "copy_ms": t_copy, "copy_gbps": copy_bw,
        "sum_f32_vec_ms": t_vec, "sum_f32_vec_gbps": gbps(3 * nbytes, t_vec),
        "sum_f32_scalar_ms": t_scalar, "sum_f32_scalar_gbps": gbps(3 * nbytes, t_scalar),
        "sum_f16_ms": t_half, "sum_f16_gbps": gbps(3 * nbytes, t_half),
    }
    out["sum_f32_vec_vs_copy"] = out["sum_f32_vec_gbps"] / copy_bw
    out["sum_f32_scalar_vs_copy"] = out["sum_f32_scalar_gbps"] / copy_bw
    out["sum_f16_vs_copy"] = out["sum_f16_gbps"] / copy_bw
    print(f"# GPU {name}; {args.mib} MiB buffers; median of 5 x {args.iters} iterations; "
          "bandwidth = bytes of memory traffic / time (copy 2x, sum 3x the buffer)")
    print(f"{'operation':<34}{'time(ms)':>10}{'GB/s':>10}{'vs copy':>9}")
    rows = [("device-to-device copy", t_copy, copy_bw, 1.0),
            ("sum float32 (16-byte vectors)", t_vec, out["sum_f32_vec_gbps"],
             out["sum_f32_vec_vs_copy"]),
            ("sum float32 (misaligned, scalar)", t_scalar, out["sum_f32_scalar_gbps"],
             out["sum_f32_scalar_vs_copy"]),
            ("sum float16 (ElementwiseKernel)", t_half, out["sum_f16_gbps"],
             out["sum_f16_vs_copy"])]
    for label, ms, bw, ratio in rows:
        print(f"{label:<34}{ms:>10.3f}{bw:>10.1f}{ratio:>9.2f}")
    verdict = "meets" if out["sum_f32_vec_vs_copy"] >= 0.8 else "misses"
    print(f"# float32 sum at {out['sum_f32_vec_vs_copy']:.0%} of copy bandwidth: {verdict} "
          "the 80% target")
    if args.json:
        from collectives.plumbing.atomic import write_text_atomic

        write_text_atomic(args.json, json.dumps(out, indent=2))
    return out


def allreduce(args: argparse.Namespace) -> int:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.access(mpiexec, os.X_OK):
        mpiexec = "mpiexec"
    runs = [("native", ["--algo", "native"]),
            ("multiring-staged", ["--algo", "multiring", "--param", "rings=2", "--param",
                                  "chunk_bytes=1048576", "--transport", "staged"])]
    code = 0
    for label, extra in runs:
        cmd = [mpiexec, "-n", str(args.np), sys.executable, "-m", "mpi4py", "-m",
               "ringtune.cli", "bench", "-G", "-b", args.b, "-e", args.e, "-f", "4",
               "-w", "2", "-n", str(args.iters), "-c", "1", *extra]
        if args.json_dir:
            cmd += ["--json", os.path.join(args.json_dir, f"bench_{label}.json")]
        print("$ " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd) or code
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kernel", help="reduction kernel vs device-to-device copy")
    k.add_argument("--mib", type=int, default=256, help="buffer size in MiB (default 256)")
    k.add_argument("--iters", type=int, default=20, help="iterations per repetition")
    k.add_argument("--json", help="write the figures as JSON to this file")
    a = sub.add_parser("allreduce", help="ringtune bench -G: native and multiring/staged")
    a.add_argument("-np", type=int, default=2, help="ranks (default 2)")
    a.add_argument("-b", default="64K", help="smallest size (default 64K)")
    a.add_argument("-e", default="64M", help="largest size (default 64M)")
    a.add_argument("--iters", type=int, default=10, help="timed iterations per size")
    a.add_argument("--json-dir", help="write each table as JSON into this folder")
    args = p.parse_args(argv)
    from collectives.cuda.detect import cupy_status

    ok, why = cupy_status()
    if not ok:
        print(f"bench_gpu.py: no GPU here: {why}", file=sys.stderr)
        return 2
    if args.what == "kernel":
        kernel(args)
        return 0
    return allreduce(args)


if __name__ == "__main__":
    sys.exit(main())
