#!/usr/bin/env bash
# tests/gpu/device_check.sh [LOG_DIR] — the GPU check of issue 5, for a machine with a GPU.
#
# Installs what is missing (only from wheels in .whl/ at the repository root: the machine
# may have no network), then runs, each step under its own timeout:
#   1. the CPU-side CUDA unit tests (tests/unit/test_cuda_*.py),
#   2. the GPU tests under mpiexec at 1 and 2 ranks (tests/gpu),
#   3. the reduction-kernel benchmark (256 MiB float32 sum vs device-to-device copy),
#   4. `ringtune bench -G` at 2 ranks: native and multiring over the staged transport.
# and, between the GPU tests and the benchmarks, the torch engine's NCCL side
# (tests/gpu/test_torch_engine.py: torchrun workers over nccl, cpu:gloo,cuda:nccl and gloo
# worlds; skipped, with the reason, where torch is not installed).
# Every step writes LOG_DIR/<step>.log; LOG_DIR/summary.txt has the verdicts and timings,
# LOG_DIR/env.txt the machine (GPU, CUDA, NCCL, CUDA-aware MPI, binding).
# RINGTUNE_CHECK_KERNEL_MIB sets the kernel benchmark's buffer size (default 256, issue 5's).
# RINGTUNE_GPU_PYTHON picks the interpreter (default: .venv, else a venv in /tmp that sees
# the system's packages). Total time stays under RINGTUNE_CHECK_BUDGET seconds (default 285: < 5 minutes on one
# H200); steps that no longer fit are skipped and say so. Each step is PASS, FAIL, or for
# a benchmark that ran but missed its target BELOW-TARGET (tests/gpu/verdict.sh). Exit 0
# when every test step passed, else 1: benchmarks are reported (a missed target or a
# failed run is named in the summary's last line), never judged.
# RINGTUNE_CHECK_COLLECT_ONLY=1 (the CPU rehearsal in `make gpu-sim`, which has just run the
# same tests itself): the test steps only collect their tests, so the rehearsal checks the
# script, its interpreter, paths and imports without running every test a second time.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT" || exit 1
LOG_DIR="${1:-$ROOT/gpu-logs}"
mkdir -p "$LOG_DIR" && LOG_DIR="$(cd "$LOG_DIR" && pwd)"
BUDGET="${RINGTUNE_CHECK_BUDGET:-285}"
T0=$(date +%s)
SUMMARY="$LOG_DIR/summary.txt"
: >"$SUMMARY"
FAILED=0
BELOW=""
BENCH_FAILED=""
# shellcheck source=tests/gpu/verdict.sh
. "$ROOT/tests/gpu/verdict.sh"

elapsed() { echo $(($(date +%s) - T0)); }
log() { echo "[device_check +$(elapsed)s] $*" | tee -a "$SUMMARY"; }

# -- Python and the packages ------------------------------------------------------------
if [ -n "${RINGTUNE_GPU_PYTHON:-}" ]; then
  PY="$RINGTUNE_GPU_PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ] && "$ROOT/.venv/bin/python" -c "import numpy" 2>/dev/null; then
  PY="$ROOT/.venv/bin/python"
else
  VENV="${RINGTUNE_GPU_VENV:-/tmp/ringtune-gpu-venv}"
  if [ ! -x "$VENV/bin/python" ]; then
    # System site packages: reuse whatever the machine has (CuPy, PyTorch, NCCL...).
    python3 -m venv --system-site-packages "$VENV" >>"$LOG_DIR/install.log" 2>&1 ||
      { log "FATAL: cannot create a virtual environment at $VENV"; exit 1; }
  fi
  PY="$VENV/bin/python"
fi
log "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

# need MODULE_CHECK DIST: import check, else install DIST from .whl/ (no index, no network).
need() {
  if "$PY" -c "$1" >/dev/null 2>&1; then return 0; fi
  if [ -d "$ROOT/.whl" ] &&
    "$PY" -m pip install -q --no-index --find-links "$ROOT/.whl" "$2" >>"$LOG_DIR/install.log" 2>&1 &&
    "$PY" -c "$1" >/dev/null 2>&1; then
    log "installed $2 from .whl/"
    return 0
  fi
  log "MISSING: $2 (check: $1); put its wheel (and its dependencies') in .whl/"
  return 1
}
need "import numpy" numpy || exit 1
need "import yaml" pyyaml || exit 1
need "import pytest" pytest || exit 1
# The mpich wheel has no importable module: check its distribution metadata instead.
"$PY" -c "from mpi4py import MPI" >/dev/null 2>&1 ||
  need "import importlib.metadata as m; m.version('mpich')" mpich || true
need "from mpi4py import MPI" mpi4py || exit 1
need "import cupy" cupy-cuda12x || exit 1
if [ "${RINGTUNE_FAKE_GPU:-}" != 1 ]; then  # the simulated GPU (make gpu-sim) compiles no CUDA
  need "from cupy_backends.cuda.libs import nvrtc; nvrtc.getVersion()" nvidia-cuda-nvrtc-cu12 ||
    log "NVRTC not found through CuPy: kernels compile only if the machine's CUDA toolkit has it"
fi
need "from cupy.cuda import nccl; assert nccl.available" nvidia-nccl-cu12 ||
  log "NCCL unavailable: the nccl transport is skipped (its tests say why)"
need "import pynvml" nvidia-ml-py || log "NVML unavailable: bindings carry no NVML index"
need "import ml_dtypes" ml_dtypes || log "ml_dtypes unavailable: bfloat16 tests skip"
need "import torch" torch || log "torch unavailable: the torch engine's GPU tests skip"

MPIEXEC="$(dirname "$PY")/mpiexec"
[ -x "$MPIEXEC" ] || MPIEXEC="$(command -v mpiexec || command -v mpirun || true)"
[ -n "$MPIEXEC" ] || { log "FATAL: no mpiexec (install the mpich wheel into .whl/)"; exit 1; }
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

# -- the machine ---------------------------------------------------------------------------
{
  echo "# date: $(date -u +%FT%TZ)"
  echo "# host: $(hostname)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,driver_version,pci.bus_id --format=csv
  echo "# mpiexec: $MPIEXEC"
  "$PY" - <<'EOF'
import sys
import numpy, mpi4py
from mpi4py import MPI
print("python", sys.version.split()[0], "numpy", numpy.__version__, "mpi4py", mpi4py.__version__)
print("MPI:", MPI.Get_library_version().splitlines()[0])
from collectives.cuda import detect, available_transports, default_gpu_transport
print("cupy:", detect.cupy_status())
import cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion())
print("nccl:", detect.nccl_status())
print("CUDA-aware MPI:", detect.cuda_aware_mpi(), "-", detect.cuda_aware_reason())
print("GPU transports here:", available_transports(), "default:", default_gpu_transport())
from collectives.registry import get_backend
be = get_backend("cupy")
print("binding:", be.binding.describe(), "bfloat16:", "bfloat16" in be.extra_dtypes)
EOF
} >"$LOG_DIR/env.txt" 2>&1
log "environment recorded in env.txt: $(grep -E '^GPU transports|^binding' "$LOG_DIR/env.txt" | tr '\n' ' ')"

if ! "$PY" -c "from collectives.cuda.detect import cupy_status as s; import sys; sys.exit(0 if s()[0] else 1)" 2>/dev/null; then
  log "FATAL: no usable GPU: $("$PY" -c 'from collectives.cuda.detect import cupy_status as s; print(s()[1])' 2>&1 | tail -1)"
  exit 1
fi

# step NAME TIMEOUT KIND CMD...: run within what is left of the budget; KIND test|bench.
step() {
  local name=$1 want=$2 kind=$3
  shift 3
  local left=$((BUDGET - $(elapsed) - 5))
  if [ "$left" -lt 15 ]; then
    log "SKIP $name: only ${left}s of the ${BUDGET}s budget left"
    [ "$kind" = test ] && FAILED=1
    return
  fi
  local limit=$((want < left ? want : left))
  local t=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$LOG_DIR/$name.log" 2>&1
  local rc=$?
  local took=$(($(date +%s) - t))
  local verdict
  verdict=$(step_verdict "$kind" "$rc" "$LOG_DIR/$name.log")
  if [ "$verdict" != FAIL ]; then
    [ "$verdict" = BELOW-TARGET ] && BELOW="$BELOW $name"
    log "$verdict $name (${took}s): $(grep -E 'passed|skipped|failed|collected|target|Avg bus' "$LOG_DIR/$name.log" | tail -1)"
  else
    [ "$rc" -eq 124 ] && rc="timeout after ${limit}s"
    log "FAIL $name (${took}s, rc=$rc); last lines of $name.log:"
    tail -n 25 "$LOG_DIR/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    # Benchmarks are reported, never judged: only a test step decides the exit status.
    if [ "$kind" = test ]; then FAILED=1; else BENCH_FAILED="$BENCH_FAILED $name"; fi
  fi
}

COLLECT=()
[ "${RINGTUNE_CHECK_COLLECT_ONLY:-0}" = 1 ] && COLLECT=(--collect-only)
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rs "${COLLECT[@]}")
step unit_cuda 40 test "${PYTEST[@]}" tests/unit/test_cuda_detect.py tests/unit/test_cuda_packages.py \
  tests/unit/test_cuda_kernels.py tests/unit/test_cuda_transports.py
# n1 compiles every reduction kernel (NVRTC, ~1 s per ElementwiseKernel) into CuPy's
# on-disk cache; n2 and the benchmarks then reuse it.
# The torch engine's test starts its own torchrun workers: its own step, after these.
TORCH_GPU_TEST=tests/gpu/test_torch_engine.py
step gpu_tests_n1 90 test "$MPIEXEC" -n 1 "$PY" -m mpi4py -m pytest -q -p no:cacheprovider -rs \
  "${COLLECT[@]}" --ignore="$TORCH_GPU_TEST" tests/gpu
step gpu_tests_n2 90 test "$MPIEXEC" -n 2 "$PY" -m mpi4py -m pytest -q -p no:cacheprovider -rs \
  "${COLLECT[@]}" --ignore="$TORCH_GPU_TEST" tests/gpu
step torch_engine 75 test "${PYTEST[@]}" "$TORCH_GPU_TEST"
step bench_kernel 30 bench "$PY" benchmarks/bench_gpu.py kernel --mib "${RINGTUNE_CHECK_KERNEL_MIB:-256}" \
  --json "$LOG_DIR/kernel.json"
step bench_allreduce 40 bench "$PY" benchmarks/bench_gpu.py allreduce -np 2 -b 64K -e 64M \
  --iters 5 --json-dir "$LOG_DIR"

[ -f "$LOG_DIR/bench_kernel.log" ] && sed 's/^/    /' "$LOG_DIR/bench_kernel.log" | tee -a "$SUMMARY" >/dev/null
log "done in $(elapsed)s: $([ "$FAILED" -eq 0 ] && echo 'all test steps passed' || echo 'SOME TEST STEPS FAILED')$([ -n "$BELOW" ] && echo "; below target (reported, not judged):$BELOW")$([ -n "$BENCH_FAILED" ] && echo "; benchmarks that did not run to the end (not judged):$BENCH_FAILED")"
exit "$FAILED"
