"""The algorithm contract suite across emulated hosts: every algorithm (hierarchical
dims=[2,2] included; native with each MPICH algorithm and composition), odd sizes, every
dtype and op, bitwise agreement between ranks — now with the ranks on different hosts
talking over shaped veth links, not shared memory."""

from __future__ import annotations

import pytest

from .conftest import emulate

SUITE = ["python", "-m", "mpi4py", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/mpi/test_contract.py", "tests/mpi/test_hierarchical.py",
         "tests/mpi/test_native_impl.py"]


@pytest.mark.parametrize("shape", ["2x2", "3x1"])
def test_contract_suite_across_hosts(shape: str) -> None:
    res = emulate(shape, SUITE, timeout=400)
    assert res.returncode == 0, (f"contract suite on {shape}:\n{res.stdout[-4000:]}\n"
                                 f"{res.stderr[-2000:]}")
    assert " passed" in res.stdout and " failed" not in res.stdout, res.stdout[-2000:]
