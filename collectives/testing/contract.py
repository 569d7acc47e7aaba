"""The allreduce contract, written once: what every registered algorithm must do, over any
backend, transport and communicator.

Shipped in the package so that a plug-in (an algorithm, transport or MPI library outside
the tree) runs the same contract as the built-ins (CONTRIBUTING.md, "Run the contract on
your plug-in"). ringtune's runners: ``tests/unit/test_contract_inproc.py`` (threads as
ranks, ``tests/inproc.py``, every world size 1..16), ``tests/mpi/test_contract.py``
(``mpiexec``, 1..4 ranks, and across emulated hosts), ``tests/torchrun/test_contract.py``
and ``tests/gpu/test_gpu_allreduce.py`` (GPU buffers over ``staged``, ``nccl`` and
CUDA-aware ``mpi``; on the simulated GPU in ``make gpu-sim``). Nothing here needs pytest
but ``kind_comm_fixture``, which imports it when called.

The contract: for every registered algorithm (``algorithm_names()``; only the test-only
``sleep`` family is left out) with its default parameters and every parameter family named
in ``FAMILIES``, on sizes {0, 1, 2, n−1, n·rings·3+1, 37, 97}, every dtype and op, the
result equals the closed form of ``collectives.testing.results`` and is bitwise identical on every
rank — on the world communicator, a ``Dup()`` of it and a ``Split()`` whose groups hold
non-contiguous world ranks in reversed order (``communicator``). An algorithm registered
tomorrow is tested here with its defaults without an edit; its module may add families.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import product
from typing import Any

import numpy as np

from collectives.algorithms import algorithm_names, get_algorithm
from collectives.algorithms.hierarchical import factorisations
from collectives.ops import DTYPES, OPS
from collectives.testing.results import check_input, disagreement, mismatches

#: Registered algorithms the contract leaves out: test-only ones that sleep on purpose.
TEST_ONLY = frozenset({"sleep"})
#: Communicator kinds every runner sweeps (see ``communicator``).
COMM_KINDS: tuple[str, ...] = ("world", "dup", "split")

Config = tuple[str, dict[str, Any]]


def _multiring(n: int, light: bool) -> list[dict[str, Any]]:
    reverse = {"rings": 3, "chunk_bytes": 64, "order": [list(reversed(range(n)))] * 3}
    if light:
        return [{"rings": 1, "chunk_bytes": 8}, {"rings": 4, "chunk_bytes": 32},
                {"rings": 2, "chunk_bytes": 0, "order": "identity"}, reverse]
    out: list[dict[str, Any]] = [{"rings": r, "chunk_bytes": 8} for r in (1, 2, 3, 4)]
    return out + [{"rings": 2, "chunk_bytes": 0, "order": "identity"}, reverse]


def grids(n: int) -> list[list[int]]:
    """Flat, the deepest grid (3-D from 8 ranks), dimensions of size 1 first and last, and
    a 2-D grid ([2, 2] at 4 ranks)."""
    facs = factorisations(n)
    two = [g for g in facs if len(g) == 2]
    found = [[n], facs[-1], [1, n], [n, 1]] + ([two[len(two) // 2]] if two else [])
    unique: list[list[int]] = []
    for g in found:
        if g not in unique:
            unique.append(g)
    return unique


def _hierarchical(n: int, light: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    inners = ("multiring", "rhd", "native")
    for i, grid in enumerate(grids(n)):
        d = len(grid)
        mixed = {"dims": grid, "rings": 1 + i % 2, "chunk_bytes": 16,
                 "inner": [inners[(i + j) % 3] for j in range(d)]}
        # Pipelined: pieces of their own interleaved (inners that pipeline; more pieces
        # than most sizes' elements, so pieces are uneven, single elements or absent).
        piped = {"dims": grid, "rings": 2 - i % 2, "chunk_bytes": 8 * (i % 2),
                 "inner": [("multiring", "rhd")[(i + j) % 2] for j in range(d)],
                 "pipeline": (3, 4, 64)[i % 3]}
        if light:
            # The flat grid is multiring's (or rhd's) own run: covered by those.
            out += [] if grid == [n] and n > 1 else [mixed, piped]
            continue
        out.append({"dims": grid, "rings": 2 + i % 2, "chunk_bytes": 8})
        out += [{"dims": grid, "rings": 1, "chunk_bytes": 8, "inner": [inner] * d}
                for inner in inners[1:]]
        out.append(mixed)
        out += [piped, {"dims": grid, "pipeline": 2}]
    return out


#: Parameter families per algorithm (beyond its defaults) on a communicator of n ranks;
#: ``light``: the subset of the in-process sweep over every world size up to 16.
def _shm(n: int, light: bool) -> list[dict[str, Any]]:
    """Chunks of 64 and 128 bytes: every size of the contract takes several steps, so both
    sets of slots alternate and a step's slices are uneven."""
    return [{"chunk_bytes": 64}] if light else [{"chunk_bytes": 64}, {"chunk_bytes": 128}]


def _shm_grids(n: int, light: bool) -> list[dict[str, Any]]:
    """``hierarchical`` with ``shm`` along every dimension (all ranks share a host here),
    and mixed with multiring."""
    out: list[dict[str, Any]] = []
    for i, grid in enumerate(grids(n)[: 2 if light else None]):
        out.append({"dims": grid, "inner": "shm"})
        out.append({"dims": grid, "rings": 1, "chunk_bytes": 16,
                    "inner": [("shm", "multiring")[(i + j) % 2] for j in range(len(grid))]})
    return out


FAMILIES: dict[str, Callable[[int, bool], list[dict[str, Any]]]] = {
    "multiring": _multiring,
    "hierarchical": lambda n, light: _hierarchical(n, light) + _shm_grids(n, light),
    "shm": _shm,
    "native": lambda n, light: [{"impl": "auto"}],
}


def configs(n: int, names: list[str] | None = None, light: bool = False,
            gpu: bool = False) -> list[Config]:
    """Every (algorithm, params) the contract runs on ``n`` ranks: each registered
    algorithm's defaults, then its families; for GPU buffers (``gpu``) none that runs
    on host memory only (``Algorithm.intra_host_only``, also as a grid's ``inner``)."""
    out: list[Config] = []
    for name in names if names is not None else contract_algorithms(gpu):
        out.append((name, {}))
        out += [(name, p) for p in FAMILIES.get(name, lambda n, light: [])(n, light)]
    if gpu:
        out = [(a, p) for a, p in out if not _host_only(a, p)]
    return out


def _host_only(name: str, params: dict[str, Any]) -> bool:
    inner = params.get("inner") or []
    names = [name] + ([inner] if isinstance(inner, str) else list(inner))
    return any(get_algorithm(k).intra_host_only for k in names)


def contract_algorithms(gpu: bool = False) -> list[str]:
    """The registered algorithms the contract covers (on GPU buffers: not those that run
    on host memory only)."""
    return [a for a in algorithm_names() if a not in TEST_ONLY
            and not (gpu and get_algorithm(a).intra_host_only)]


def config_id(cfg: Config) -> str:
    """A short readable name of a configuration (pytest ids, failure lines)."""
    name, params = cfg
    if not params:
        return name
    return name + "-" + "-".join(
        f"{k}{'perm' if k == 'order' and isinstance(v, list) else v}".replace(" ", "")
        for k, v in params.items())


def sizes(n: int, rings: int) -> list[int]:
    """Element counts: empty, one, a few, fewer than ranks, not divisible by ranks×rings,
    primes."""
    return sorted({0, 1, 2, max(n - 1, 0), n * rings * 3 + 1, 37, 97})


#: How many (count, dtype, op) cases a configuration runs (``cases``).
DENSITIES: tuple[str, ...] = ("full", "ops", "sparse")


def cases(n: int, params: dict[str, Any], density: str = "full",
          offset: int = 0) -> list[tuple[int, str, str]]:
    """(count, dtype, op) to run for one configuration.

    ``full``: every size × dtype × op (the MPI runs). ``ops``: every size × op, the dtype
    rotating, so each (dtype, op) pair runs at some size. ``sparse``: every size once, op
    and dtype rotating from ``offset`` — every op and dtype at least once per
    configuration, and the pairs differ between configurations (the in-process sweep of
    large worlds, where a call costs 2·(n−1) messages per rank and ring)."""
    counts = sizes(n, int(params.get("rings", 1)))
    if density == "full":
        return list(product(counts, DTYPES, OPS))
    if density == "ops":
        return [(count, DTYPES[(i + j + offset) % len(DTYPES)], op)
                for i, count in enumerate(counts) for j, op in enumerate(OPS)]
    if density == "sparse":
        k = max(len(counts), len(OPS), len(DTYPES))
        return [(counts[i % len(counts)], DTYPES[(i + offset) % len(DTYPES)],
                 OPS[(i + 2 * offset) % len(OPS)]) for i in range(k)]
    raise ValueError(f"density: use one of {', '.join(DENSITIES)}, got {density!r}")


# -- running -------------------------------------------------------------------------------


def _same(x: Any) -> Any:
    return x


@dataclass(frozen=True)
class Setup:
    """What a runner varies besides the algorithm: the transport (``None``: the backend's
    default), and how a host input becomes the backend's buffer and back."""

    transport: str | None = None
    upload: Callable[[np.ndarray], Any] = _same
    download: Callable[[Any], np.ndarray] = _same
    label: str = "numpy"


def check_one(comm: Any, algo: str, params: dict[str, Any], count: int, dtype: str, op: str,
              setup: Setup = Setup(), where: str = "") -> list[str]:
    """One allreduce through ``comm`` (a ``collectives.Communicator``): failure lines for a
    wrong result, a result that differs across ranks, or a buffer not returned.
    Collective over ``comm``."""
    buf = setup.upload(check_input(count, dtype, op, comm.rank))
    out = comm.allreduce(buf, op=op, algorithm=algo, transport=setup.transport, **params)
    where = f"{where}{setup.label} {config_id((algo, params))}"
    fails = [] if out is buf else [f"{where}: allreduce did not return its buffer"]
    got = setup.download(buf)
    fails += mismatches(got, count, dtype, op, comm.size, where)
    fails += disagreement(got, comm.comm.allgather, f"{where} count={count} {dtype} {op}")
    return fails


def run_configs(comm: Any, cfgs: list[Config], setup: Setup = Setup(), density: str = "full",
                where: str = "", family_density: str | None = None) -> list[str]:
    """The contract for each configuration on ``comm`` (collective over ``comm``):
    ``density`` cases (``cases``) for an algorithm's defaults, ``family_density`` (default:
    the same) for its parameter families."""
    fails: list[str] = []
    # Across hosts a grid with a host-only inner (shm) fits only some layouts: the flat
    # ``shm`` (its own two-tier grid there) stands for them.
    spans_hosts = len(set(getattr(comm, "hosts", ()) or (0,))) > 1
    for i, (algo, params) in enumerate(cfgs):
        if spans_hosts and params.get("inner") and _host_only("hierarchical", params):
            continue
        dens = density if not params or family_density is None else family_density
        for count, dtype, op in cases(comm.size, params, dens, offset=i):
            fails += check_one(comm, algo, params, count, dtype, op, setup, where)
    return fails


class DirectRunner:
    """``Communicator.allreduce``'s contract straight on a transport built by hand (no
    registry, no profile): for transports over a simulated GPU whose backend is this
    rank's own object. ``avg`` divides after the sum, as the communicator does."""

    def __init__(self, comm: Any, backend: Any, transport: Any) -> None:
        from collectives.algorithms import Context

        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.backend = backend
        self.ctx = Context(comm=comm, backend=backend, transport=transport,
                           hosts=(0,) * self.size, world_ranks=tuple(range(self.size)))

    def allreduce(self, buf: Any, op: str = "sum", algorithm: str | None = None,
                  transport: str | None = None, **params: Any) -> Any:
        from collectives.algorithms import get_algorithm

        cls = get_algorithm(algorithm or "multiring")
        checked = cls.check_params(params, self.size)
        cls(self.ctx, int(buf.size), str(buf.dtype), "sum" if op == "avg" else op,
            checked).run(buf)
        if op == "avg":
            self.backend.divide(buf, self.size)
        self.backend.synchronize()
        return buf

    def close(self) -> None:
        self.ctx.close()


def communicator(world: Any, kind: str) -> tuple[Any, str]:
    """The communicator of ``kind`` over ``world`` (mpi4py or in-process) and a label.
    ``split``: ranks of even and odd world rank form two groups, each ranked in reverse
    world order — so sub-rank r is never world rank r and neighbours are never adjacent.
    Collective over ``world``; ``release`` frees it."""
    if kind == "world":
        return world, "WORLD"
    if kind == "dup":
        return world.Dup(), "Dup(WORLD)"
    if kind == "split":
        rank = world.Get_rank()
        return world.Split(rank % 2, -rank), f"Split(WORLD, parity {rank % 2})"
    raise ValueError(f"unknown communicator kind {kind!r}: use one of {', '.join(COMM_KINDS)}")


def release(comm: Any, kind: str) -> None:
    """Free a communicator made by ``communicator`` (the world stays)."""
    if kind != "world":
        comm.Free()


def kind_comm_fixture(world: Callable[[], Any]) -> Any:
    """A pytest fixture, parametrised over ``COMM_KINDS``, giving ``(Communicator, kind,
    label)`` over the communicator of each kind of ``world()`` (for the MPI runners; bind
    it to a module-level name ``kind_comm``)."""
    import pytest

    @pytest.fixture(params=COMM_KINDS)
    def kind_comm(request: Any) -> Iterator[tuple[Any, str, str]]:
        with communicator_of(world(), request.param) as (c, label):
            yield c, request.param, label

    return kind_comm


@contextmanager
def communicator_of(world: Any, kind: str, topology: Callable[[int], Any] | None = None,
                    ) -> Iterator[tuple[Any, str]]:
    """A ``collectives.Communicator`` over the communicator of ``kind`` (``communicator``)
    and its label; closed and freed on exit. ``topology(size)`` gives the communicator its
    topology instead of probing. Collective over ``world``."""
    from collectives import Communicator

    mpi_comm, label = communicator(world, kind)
    c = Communicator(mpi_comm, topology=topology(mpi_comm.Get_size()) if topology else None)
    try:
        yield c, label
    finally:
        c.close()
        release(mpi_comm, kind)


# -- properties beyond single calls (every runner) -----------------------------------------


def check_shaped_in_place(comm: Any, setup: Setup = Setup()) -> list[str]:
    """A 3-D buffer is reduced in place and keeps its shape."""
    host = check_input(3 * 5 * 7, "float64", "sum", comm.rank).reshape(3, 5, 7)
    buf = setup.upload(host)
    comm.allreduce(buf, op="sum", algorithm="multiring", transport=setup.transport,
                   rings=2, chunk_bytes=16)
    got = setup.download(buf)
    if got.shape != (3, 5, 7):
        return [f"3-D buffer reshaped to {got.shape}"]
    return mismatches(got, 105, "float64", "sum", comm.size, "3-D buffer")


def check_default_choice(comm: Any, setup: Setup = Setup(),
                         counts: tuple[int, ...] = (0, 5, 1 << 17, (9 << 20) + 3)) -> list[str]:
    """Without ``algorithm=``, the (built-in) profile's choice runs and is right — below
    and above the built-in rule boundary (32 MiB) by default."""
    fails: list[str] = []
    for count in counts:
        buf = setup.upload(check_input(count, "float32", "max", comm.rank))
        comm.allreduce(buf, op="max", transport=setup.transport)
        fails += mismatches(setup.download(buf), count, "float32", "max", comm.size,
                            f"default choice ({comm.explain(count * 4)})")
    return fails


def check_plan_cache(comm: Any, setup: Setup = Setup()) -> list[str]:
    """A second identical call reuses the plan of the first."""
    buf = setup.upload(np.ones(1000, dtype=np.float32))
    comm.allreduce(buf, algorithm="rhd", transport=setup.transport)
    after_first = len(comm._plans)
    comm.allreduce(buf, algorithm="rhd", transport=setup.transport)
    return [] if len(comm._plans) == after_first else ["second identical call built a new plan"]
