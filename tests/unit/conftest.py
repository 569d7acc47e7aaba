"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest

from probes import layout
from probes.topology import Host
from tests.fixtures import MACHINES, materialize


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Host]:
    """Every recorded machine of ``tests/fixtures`` read as a ``Host`` (sysfs and NVML as
    ``probes`` would read them on that machine)."""
    dest = tmp_path_factory.mktemp("machines")
    out = {}
    for name in MACHINES:
        root, nv = materialize(name, dest)
        out[name] = layout.read_host(root, responder=nv, name=name)
    return out
