# ringtune: the two commands of the README.
#   make tune   tune this machine (venv, install, `ringtune tune`) -> profiles/local.yaml
#   make test   lint, type-check, unit tests, MPI tests at 1..4 ranks, GPU tests (skip w/o GPU)
# Everything is installed from nothing into .venv (Python packages only; MPI is the mpich wheel).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
MPIEXEC := $(VENV)/bin/mpiexec
NP_LIST ?= 1 2 3 4
# Oversubscribed ranks on a small machine are slow but correct; this bounds a hung test.
MPI_TEST_TIMEOUT ?= 900
PYTEST_MPI := $(PY) -m mpi4py -m pytest -q -p no:cacheprovider

.PHONY: all install test lint unit mpi gpu tune bench clean

all: test

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

unit: install
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

mpi: install
	@set -e; for n in $(NP_LIST); do \
	  echo "== tests/mpi under mpiexec -n $$n"; \
	  timeout $(MPI_TEST_TIMEOUT) $(MPIEXEC) -n $$n $(PYTEST_MPI) tests/mpi; \
	done

gpu: install
	$(PY) -m pytest -q -p no:cacheprovider -rs tests/gpu

# GPU tests first: without a GPU they all skip, and the run should end on tests that ran.
test: lint gpu unit mpi

tune: install
	$(VENV)/bin/ringtune tune --out profiles/local.yaml

bench: install
	$(VENV)/bin/ringtune bench -b 4K -e 64M -f 4 -c 1

clean:
	rm -rf $(VENV) build *.egg-info
