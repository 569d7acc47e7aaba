"""``native`` with ``impl``: MPICH's own allreduce algorithms chosen per call.

These tests fail if the control-variable write were ignored: at 3+ ranks MPICH's ring and
tree add float32 values in other orders than its default, so their
results differ bitwise from ``auto``'s on inputs with a wide spread of exponents; at 2 ranks
(where a+b = b+a exactly), reduce_scatter_allgather refuses a count below the power of two
under ``MPIR_CVAR_COLLECTIVE_FALLBACK=error``, which only a call that really ran it can see.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from collectives.natives import mpich

from .conftest import WORLD, agree

N = WORLD.Get_size()
RANK = WORLD.Get_rank()

pytestmark = pytest.mark.skipif(bool(mpich.unavailable_reason()),
                                reason=mpich.unavailable_reason() or "MPICH")

#: Algorithms whose float32 summation order differs from MPICH's default at 3 and 4 ranks.
ORDER_REVEALING = ("ring", "tree")


@contextmanager
def _fallback_is_an_error() -> Iterator[None]:
    """``MPIR_CVAR_COLLECTIVE_FALLBACK`` = error (0) inside, restored after: a call whose
    selected algorithm or composition cannot apply then fails instead of silently running
    another, which only a call that really selected it can show."""
    old = mpich.write_int_cvar("MPIR_CVAR_COLLECTIVE_FALLBACK", 0)
    try:
        yield
    finally:
        mpich.write_int_cvar("MPIR_CVAR_COLLECTIVE_FALLBACK", old)


def spread_input(rank: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(rank + 1)
    return (rng.standard_normal(count) * 10.0 ** rng.integers(-4, 4, count)).astype(np.float32)


def test_every_listed_algorithm_sums_correctly(comm) -> None:
    count = 3 * 1024 + 7
    want = sum(spread_input(r, count).astype(np.float64) for r in range(N))
    bad = []
    for impl in ["auto", *mpich.native_algorithms()]:
        buf = spread_input(RANK, count)
        comm.allreduce(buf, algorithm="native", impl=impl)
        if not np.allclose(buf, want, rtol=1e-4, atol=1e-3):
            bad.append(f"impl={impl}: wrong sum")
        digests = WORLD.allgather(hashlib.sha256(buf.tobytes()).hexdigest())
        if len(set(digests)) != 1:
            bad.append(f"impl={impl}: ranks disagree bitwise")
        if mpich.current_algorithm() != "auto":
            bad.append(f"impl={impl}: left the library on {mpich.current_algorithm()}")
    agree(bad)


def _flat_composition() -> str:
    """``beta`` where the world spans several hosts (there MPICH's default composition runs
    ``impl`` among one leader per host only, too few for its order to show), else auto."""
    from mpi4py import MPI

    return "beta" if len(set(WORLD.allgather(MPI.Get_processor_name()))) > 1 else "auto"


@pytest.mark.skipif(N < 3, reason="summation order is observable from 3 ranks")
def test_selected_algorithm_really_runs(comm) -> None:
    count = 1 << 16
    digests = {}
    comp = _flat_composition()
    for impl in ("auto", *ORDER_REVEALING):
        buf = spread_input(RANK, count)
        comm.allreduce(buf, algorithm="native", impl=impl, composition=comp)
        digests[impl] = hashlib.sha256(buf.tobytes()).hexdigest()
    bad = [f"impl={impl} gave auto's exact result: the selection did not reach MPICH"
           for impl in ORDER_REVEALING if digests[impl] == digests["auto"]]
    agree(bad)


@pytest.mark.skipif(N < 2, reason="MPICH runs no algorithm on one rank")
def test_restriction_error_proves_the_choice(comm, monkeypatch) -> None:
    from mpi4py import MPI

    # The MPI error must reach this test, not end the job (collectives.plumbing.abort).
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")

    # Across hosts every rank must run the algorithm (not only the hosts' leaders, which
    # would fail while the others wait in the bcast): the flat composition.
    comp = _flat_composition()
    bad = []
    with _fallback_is_an_error():
        buf = np.ones(1, np.float32)
        comm.allreduce(buf, algorithm="native")  # auto copes with any count
        try:
            comm.allreduce(buf, algorithm="native", impl="reduce_scatter_allgather",
                           composition=comp)
            bad.append("reduce_scatter_allgather accepted count 1 < pof2: not selected")
        except MPI.Exception:
            pass
    agree(bad)


def test_unknown_impl_names_the_installed_ones() -> None:
    from collectives.algorithms import get_algorithm

    with pytest.raises(ValueError, match="ring"):
        get_algorithm("native").check_params({"impl": "no_such_algorithm"}, N)


def test_every_composition_sums_correctly_and_restores_the_default(comm) -> None:
    count = 3 * 1024 + 7
    want = sum(spread_input(r, count).astype(np.float64) for r in range(N))
    bad = []
    for comp in ("auto", "alpha", "beta", "gamma", "delta"):
        for impl in ("auto", "ring"):
            buf = spread_input(RANK, count)
            comm.allreduce(buf, algorithm="native", composition=comp, impl=impl)
            if not np.allclose(buf, want, rtol=1e-4, atol=1e-3):
                bad.append(f"composition={comp} impl={impl}: wrong sum")
            digests = WORLD.allgather(hashlib.sha256(buf.tobytes()).hexdigest())
            if len(set(digests)) != 1:
                bad.append(f"composition={comp} impl={impl}: ranks disagree bitwise")
            if mpich.read_cvar(mpich.COMPOSITION_CVAR) != 0 or mpich.current_algorithm() != "auto":
                bad.append(f"composition={comp} impl={impl}: left the library on "
                           f"composition {mpich.read_cvar(mpich.COMPOSITION_CVAR)}, "
                           f"algorithm {mpich.current_algorithm()}")
    agree(bad)


@pytest.mark.skipif(N < 2, reason="MPICH runs no composition on one rank")
def test_composition_restriction_error_proves_the_choice(comm, monkeypatch) -> None:
    """On one host MPICH's multi-leader composition (delta) cannot apply; under
    ``MPIR_CVAR_COLLECTIVE_FALLBACK=error`` a call that really selected it fails, while
    the same call with composition auto or beta succeeds."""
    from mpi4py import MPI

    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    hosts = set(WORLD.allgather(MPI.Get_processor_name()))
    if len(hosts) != 1:
        pytest.skip("delta's restriction is observable on one host")
    bad = []
    with _fallback_is_an_error():
        buf = np.ones(1024, np.float32)
        comm.allreduce(buf, algorithm="native", composition="beta")
        try:
            comm.allreduce(buf, algorithm="native", composition="delta")
            bad.append("composition delta accepted a one-host communicator: not selected")
        except MPI.Exception:
            pass
        if mpich.read_cvar(mpich.COMPOSITION_CVAR) != 0:
            bad.append("a failed call left the composition set")
    agree(bad)


def test_unknown_composition_names_the_key() -> None:
    from collectives.algorithms import get_algorithm

    with pytest.raises(ValueError, match=r"^composition: .*alpha.*'omega'"):
        get_algorithm("native").check_params({"composition": "omega"}, N)


def test_composition_really_runs_across_hosts(comm, monkeypatch) -> None:
    """Across hosts with several ranks on a host: under alpha, ``impl=ring`` runs among the
    hosts' leaders only, under beta over every rank, and the two add float32 values in
    different orders (alpha and beta with their default algorithm happen to agree bit for
    bit on 2 x 2: both add each host's pair first). gamma needs the communicator on one
    node: under ``MPIR_CVAR_COLLECTIVE_FALLBACK=error`` every rank's call fails, which only
    a call that really selected it can show."""
    from mpi4py import MPI

    hosts = WORLD.allgather(MPI.Get_processor_name())
    if len(set(hosts)) < 2 or len(set(hosts)) == N:
        pytest.skip("needs several hosts with several ranks on one (run under emulate)")
    count = 1 << 16
    digests = {}
    for comp in ("alpha", "beta"):
        buf = spread_input(RANK, count)
        comm.allreduce(buf, algorithm="native", composition=comp, impl="ring")
        digests[comp] = hashlib.sha256(buf.tobytes()).hexdigest()
    bad = []
    if digests["alpha"] == digests["beta"]:
        bad.append("impl=ring under composition alpha and beta gave the same bits")
    monkeypatch.setenv("RINGTUNE_ON_ERROR", "raise")
    with _fallback_is_an_error():
        buf = np.ones(1024, np.float32)
        try:
            comm.allreduce(buf, algorithm="native", composition="gamma")
            bad.append("composition gamma accepted a communicator across hosts")
        except MPI.Exception:
            pass
    agree(bad)
