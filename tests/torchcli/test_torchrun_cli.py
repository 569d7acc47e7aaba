"""``ringtune`` verbs, the training example and the registered backend started by torchrun:
exit codes, tables, the profile's engine record, the engine-mismatch warning and the bad
inputs' one line. Every job is bounded by a timeout and small (2 ranks, few sizes)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.proctree import run_bounded

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TIMEOUT_S = 400


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGTUNE_", "TORCHELASTIC_", "PMI_", "OMPI_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    # A rank that dies of a signal (SIGABRT, SIGSEGV) prints every thread's Python stack.
    env["PYTHONFAULTHANDLER"] = "1"
    # These tests check what a tune records, not its speed: other work on the cores (a
    # loaded CI machine) may make a re-measurement 10x off the search, which stops a tune
    # by default (autotune.choose); tests/__init__.py sets the same, stripped above.
    env["RINGTUNE_TIMING_CHECK"] = "warn"
    env.update(extra)
    return env


def _ringtune() -> list[str]:
    """The contract's command: the console script next to this Python, else the module."""
    script = BIN / "ringtune"
    return [str(script)] if script.exists() else [sys.executable, "-m", "ringtune.cli"]


def torchrun(args: list[str], nproc: int = 2, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(nproc),
           "--no-python", *args]
    # run_bounded: a timeout ends the ranks too, not only torchrun.
    return run_bounded(cmd, TIMEOUT_S, cwd=ROOT, env=_env(**env), stdin=subprocess.DEVNULL)


#: torchrun's own lines: its log records ("W1205 08:46:43.890000 19703 .../api.py:1002]")
#: and the ChildFailedError report, which fill the end of stderr and hide the ranks' words.
_TORCHRUN_LOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d")


def _why(res: subprocess.CompletedProcess[str]) -> str:
    """What the ranks said on stderr (torchrun's log lines left out), for a failure."""
    ranks = [ln for ln in res.stderr.splitlines() if not _TORCHRUN_LOG.match(ln)]
    cut = next((i for i, ln in enumerate(ranks) if ln.startswith("Traceback (most recent call "
                                                                  "last):") and any(
        "torch/distributed/run.py" in later for later in ranks[i:i + 12])), len(ranks))
    codes = [ln.strip() for ln in ranks[cut:] if "exitcode" in ln]  # each rank's end
    return f"exit {res.returncode}:\n" + "\n".join(ranks[:cut])[-6000:] + "\n" + \
        "\n".join(codes)


def _lines(text: str, word: str) -> list[str]:
    return [ln for ln in text.splitlines() if word in ln]


def test_bench_under_torchrun_runs_over_torch() -> None:
    res = torchrun([*_ringtune(), "bench", "-b", "1K", "-e", "16K", "-f", "4", "-w", "1",
                    "-n", "3"])
    assert res.returncode == 0, _why(res)
    header = _lines(res.stdout, "# ringtune bench:")
    assert len(header) == 1, res.stdout  # rank 0 alone prints
    assert "2 ranks" in header[0] and "engine torch (gloo)" in header[0]
    assert "transport torch" in header[0]
    assert _lines(res.stdout, "Out of bounds values : 0 OK"), res.stdout
    rows = [ln.split() for ln in res.stdout.splitlines() if ln.strip()[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [1024, 4096, 16384]
    assert all(r[-1] == "0" for r in rows)


def test_tune_records_engine_and_other_engine_sets_it_aside(tmp_path: Path) -> None:
    out = tmp_path / "torch-profile.yaml"
    res = torchrun([*_ringtune(), "tune", "--out", str(out), "--buckets", "4K,64K",
                    "--trials", "3", "--budget", "60", "--no-progress"])
    assert res.returncode == 0, _why(res)
    assert "over torch" in res.stdout
    from collectives.profile import load_profile

    prof = load_profile(str(out))
    assert prof.engine is not None
    assert prof.engine.name == "torch" and prof.engine.backend == "gloo"
    assert prof.engine.version
    assert prof.transport == "torch"
    # Loaded under MPI: warned once and set aside for the built-in defaults.
    mpiexec = shutil.which("mpiexec", path=str(BIN))
    if mpiexec is None:
        pytest.skip("no mpiexec next to this Python")
    code = ("import os, warnings\n"
            "from mpi4py import MPI\n"
            "from collectives import Communicator\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    c = Communicator(MPI.COMM_WORLD, profile=os.environ['P'])\n"
            "print('SET_ASIDE', c.set_aside)\n"
            "print('WARNINGS', [str(x.message) for x in w])\n")
    res = run_bounded([mpiexec, "-n", "2", sys.executable, "-c", code], TIMEOUT_S,
                      cwd=ROOT, env=_env(P=str(out)), stdin=subprocess.DEVNULL)
    assert res.returncode == 0, _why(res)
    # Counted, not split into lines: the two ranks' output may interleave.
    assert res.stdout.count("set aside: tuned over the torch engine, this job runs over "
                            "mpi") == 2, res.stdout
    assert res.stdout.count("; using built-in defaults (re-tune") == 1, res.stdout  # rank 0
    strict = run_bounded([mpiexec, "-n", "2", sys.executable, "-c", code], TIMEOUT_S,
                         cwd=ROOT, env=_env(P=str(out), RINGTUNE_STRICT="1"),
                         stdin=subprocess.DEVNULL)
    assert strict.returncode != 0
    assert "TopologyMismatchError" in strict.stderr
    assert "tuned over the torch engine, this job runs over mpi (strict)" in strict.stderr


def test_cli_bad_input_is_one_line() -> None:
    # --engine torch without torchrun's environment: exit 2, one line, before anything.
    res = subprocess.run([*_ringtune(), "bench", "--engine", "torch"], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "start the command under torchrun" in res.stderr
    # -np under torchrun: the ranks are torchrun's; exit 2 and the line once (rank 0).
    res = torchrun([*_ringtune(), "bench", "-np", "2"])
    assert res.returncode != 0
    lines = _lines(res.stderr, "ringtune: error: -np launches ranks under mpiexec")
    assert len(lines) == 1, _why(res)


def test_init_process_group_ringtune_outside_a_launcher() -> None:
    """torch's own env:// rendezvous refuses first: one ValueError line naming RANK."""
    code = ("import collectives.torch, torch.distributed as dist\n"
            "dist.init_process_group('ringtune')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                         capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError") and "RANK" in last, last


def test_example_ringtune_backend_tracks_gloo(tmp_path: Path) -> None:
    """examples/train_digits.py under torchrun: --backend ringtune (DDP's own allreduce is
    ringtune's) and --backend gloo train to the same losses."""
    results = {}
    for backend in ("ringtune", "gloo"):
        out = tmp_path / f"{backend}.json"
        res = torchrun([sys.executable, str(ROOT / "examples" / "train_digits.py"),
                        "--backend", backend, "--steps", "25", "--json", str(out)])
        assert res.returncode == 0, _why(res)
        assert f"torchrun, {backend} backend, none hook, 2 ranks" in res.stdout
        results[backend] = json.loads(out.read_text())
    a, b = results["ringtune"]["losses"], results["gloo"]["losses"]
    assert len(a) == len(b) == 25
    assert all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b)), (a, b)


def test_example_noop_hook_exchanges_nothing(tmp_path: Path) -> None:
    """--hook noop (the headroom arm of the DDP benchmark) runs DDP with no exchange: the
    first step's loss is the averaged job's (same initial model), later ones differ, since
    each rank then steps with its own shard's gradient alone."""
    results = {}
    for hook in ("noop", "none"):
        out = tmp_path / f"{hook}.json"
        res = torchrun([sys.executable, str(ROOT / "examples" / "train_digits.py"),
                        "--backend", "gloo", "--hook", hook, "--steps", "6",
                        "--json", str(out)])
        assert res.returncode == 0, _why(res)
        assert f"torchrun, gloo backend, {hook} hook, 2 ranks" in res.stdout
        results[hook] = json.loads(out.read_text())["losses"]
    noop, averaged = results["noop"], results["none"]
    assert abs(noop[0] - averaged[0]) <= 1e-6 * max(1.0, abs(averaged[0])), (noop, averaged)
    assert any(abs(x - y) > 1e-4 * max(1.0, abs(y)) for x, y in zip(noop[1:], averaged[1:])), (
        noop, averaged)


def test_ringtune_group_again_after_destroy(tmp_path: Path) -> None:
    """init_process_group('ringtune') twice in one job (destroy in between): the second
    backend's groups must not meet the first one's keys in the store (a hang or a refused
    connection before the fix)."""
    script = tmp_path / "twice.py"
    # destroy_process_group frees every group the backend made (their sockets close then,
    # on every rank after a barrier), not at the next init or at exit: a rank freeing its
    # gloo pairs on its own, at exit, aborted (SIGABRT) about 1 run in 14.
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "import collectives.torch\n"
        "def sockets():\n"
        "    fds = os.listdir('/proc/self/fd')\n"
        "    return sum(os.readlink(f'/proc/self/fd/{f}').startswith('socket:')\n"
        "               for f in fds if os.path.exists(f'/proc/self/fd/{f}'))\n"
        "before = sockets()\n"
        "for k in range(2):\n"
        "    dist.init_process_group('ringtune')\n"
        "    t = torch.ones(4) * (dist.get_rank() + 1)\n"
        "    dist.all_reduce(t)\n"
        "    assert t.tolist() == [3.0] * 4, t\n"
        "    dist.destroy_process_group()\n"
        "    n = sockets()\n"
        "    assert n <= before, f'{n} sockets open after destroy, {before} before'\n"
        "print('TWICE OK', flush=True)\n")
    res = torchrun([sys.executable, str(script)])
    assert res.returncode == 0, _why(res)
    assert res.stdout.count("TWICE OK") == 2


def test_example_reads_scikit_learns_digits_without_importing_it() -> None:
    """The example reads the digits file scikit-learn ships (importing scikit-learn cost
    each rank seconds): the same arrays as ``load_digits``, and no sklearn module loaded."""
    code = ("import sys; sys.path.insert(0, 'examples'); import train_digits as t; "
            "x, y = t._load_digits(); import numpy as np; "
            "assert not [m for m in sys.modules if m.startswith('sklearn')]; "
            "from sklearn.datasets import load_digits; a, b = load_digits(return_X_y=True); "
            "assert x.shape == (1797, 64) and np.array_equal(x, a) and np.array_equal(y, b); "
            "assert y.dtype == b.dtype; print('SAME')")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and "SAME" in res.stdout, _why(res)
