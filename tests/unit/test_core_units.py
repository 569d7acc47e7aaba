"""Single-process tests of the runtime core: sizes, check data, backend ops, registry."""

from __future__ import annotations

import numpy as np
import pytest

from collectives.algorithms import algorithm_names, get_algorithm
from collectives.backend import NumpyBackend
from collectives.bench import (
    busbw_factor,
    expected_result,
    fill_input,
    parse_size,
    size_list,
)
from collectives.ops import DTYPES, OPS
from collectives.registry import backend_for


@pytest.mark.parametrize("text,value", [("8", 8), ("4K", 4096), ("64M", 64 << 20),
                                        ("1G", 1 << 30), ("1.5K", 1536), ("2KiB", 2048),
                                        (1024, 1024)])
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "-4K", "1Q"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad if bad else "x")


def test_size_list_nccl_tests_style() -> None:
    assert size_list(4096, 64 << 20, 4) == [4096 << (2 * k) for k in range(8)]
    assert size_list(0, 2, 2) == [0, 1, 2]
    with pytest.raises(ValueError, match="factor"):
        size_list(1, 8, 1)
    with pytest.raises(ValueError, match="-e"):
        size_list(8, 1, 2)


def test_busbw_factor() -> None:
    assert busbw_factor(1) == 0.0
    assert busbw_factor(2) == 1.0
    assert busbw_factor(4) == 1.5


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
def test_closed_form_matches_brute_force(op: str, dtype: str, n: int) -> None:
    count = 61
    inputs = []
    for r in range(n):
        b = np.empty(count, dtype=dtype)
        fill_input(b, r, op)
        inputs.append(b.astype(np.float64))
    stack = np.stack(inputs)
    brute = {"sum": stack.sum(0), "avg": stack.sum(0), "prod": stack.prod(0),
             "min": stack.min(0), "max": stack.max(0)}[op]
    exp = expected_result(count, dtype, op, n).astype(np.float64)
    if op == "avg":
        brute = np.trunc(brute / n) if dtype.startswith("int") else brute / n
        assert np.allclose(exp, brute, rtol=1e-2 if dtype == "float16" else 1e-6)
    else:
        assert np.array_equal(exp, brute)
    # Inputs differ between ranks and along the index: a wrong reduction cannot pass.
    if n > 1:
        assert not np.array_equal(inputs[0], inputs[1])
    assert len(np.unique(inputs[0])) > 1


def test_numpy_backend_ops() -> None:
    be = NumpyBackend()
    a = np.array([1, -7, 5], dtype=np.int32)
    be.reduce_into(a, np.array([2, 3, -9], dtype=np.int32), "max")
    assert a.tolist() == [2, 3, 5]
    be.reduce_into(a, np.array([2, 3, 2], dtype=np.int32), "prod")
    assert a.tolist() == [4, 9, 10]
    b = np.array([-7, 7, 6], dtype=np.int64)
    be.divide(b, 2)
    assert b.tolist() == [-3, 3, 3]  # toward zero, as C and NCCL
    f = np.array([1.0, 3.0], dtype=np.float32)
    be.divide(f, 4)
    assert f.tolist() == [0.25, 0.75]


def test_backend_for_rejects_and_flattens() -> None:
    be = backend_for(np.zeros((2, 3)))
    assert be.name == "numpy"
    assert be.as_flat(np.zeros((2, 3))).shape == (6,)
    with pytest.raises(TypeError, match="list"):
        backend_for([1, 2])
    with pytest.raises(ValueError, match="C-contiguous"):
        be.as_flat(np.zeros((4, 4))[:, 0])
    ro = np.zeros(4)
    ro.setflags(write=False)
    with pytest.raises(ValueError, match="read-only"):
        be.as_flat(ro)


def test_registry_has_core_algorithms() -> None:
    names = algorithm_names()
    for name in ("native", "multiring", "rhd"):
        assert name in names
        assert get_algorithm(name).name == name
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        get_algorithm("nope")


def test_multiring_params_defaults_and_errors() -> None:
    mr = get_algorithm("multiring")
    assert mr.check_params({}, 4) == {"rings": 1, "chunk_bytes": 0, "order": "topology"}
    assert mr.check_params({"rings": 16, "chunk_bytes": 1 << 20}, 4)["rings"] == 16
    for bad, word in [({"rings": 17}, "rings"), ({"rings": "two"}, "rings"),
                      ({"chunk_bytes": 3}, "chunk_bytes"), ({"chunk_bytes": -2}, "chunk_bytes"),
                      ({"order": [0, 0, 1, 2]}, "permutation"),
                      ({"order": "ring"}, "order"), ({"rings": 2, "order": [[0, 1, 2, 3]]},
                                                     "per ring"), ({"bogus": 1}, "bogus")]:
        with pytest.raises(ValueError, match=word):
            mr.check_params(bad, 4)


def test_host_allreduce_widens_what_mpi_cannot_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    import collectives.transport as transport

    seen: list[str] = []

    class Comm:
        def Allreduce(self, sendbuf: object, recvbuf: np.ndarray, op: object) -> None:  # noqa: N802
            seen.append(str(recvbuf.dtype))
            recvbuf *= 3  # what three ranks' identical sums would give

    buf = np.array([1.5, -2.25, 1025.0], dtype=np.float16)
    monkeypatch.setattr(transport, "mpi_reduces", lambda dtype: False)
    transport.host_allreduce(Comm(), buf, "sum")
    assert seen == ["float32"]
    # One rounding, of the float32 result: 3 × 1025 = 3075 rounds (to even) to 3076.
    assert buf.tolist() == [4.5, -6.75, 3076.0]
    monkeypatch.setattr(transport, "mpi_reduces", lambda dtype: True)
    transport.host_allreduce(Comm(), buf, "sum")
    assert seen == ["float32", "float16"]
