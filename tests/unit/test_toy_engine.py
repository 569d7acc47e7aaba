"""An engine is one module: ``tests/toy_engine.py`` (threads as ranks) registered, and
nothing else edited, is a ``Communicator``'s engine that passes the allreduce contract, an
``--engine`` choice of tune, bench and probe (listed in their help, taken by ``auto`` when
its launcher started the process, refused in one line for what it cannot do), and what
online tuning's profile records. The CLI through ``RINGTUNE_PLUGINS``:
``tests/cli/test_toy_engine.py``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.engines import registry as engines
from collectives.profile import profile_from_dict
from collectives.testing import contract
from collectives.testing.results import check_input, expected
from tests import inproc

TOY = "tests.toy_engine"


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``tests/toy_engine.py`` imported (so registered) into a copy of the engine
    registry: it is gone after the test (the plug-ins load first, into the originals)."""
    engines.engine_names()
    monkeypatch.setattr(engines, "_ENGINES", dict(engines._ENGINES))
    sys.modules.pop(TOY, None)
    yield importlib.import_module(TOY)
    sys.modules.pop(TOY, None)


@pytest.mark.parametrize("n,kind", [(1, "world"), (3, "world"), (4, "split"), (3, "dup")])
def test_the_contract_passes_over_the_toy_engine(toy: Any, n: int, kind: str) -> None:
    inproc.register()

    def rank(world: Any) -> list[str]:
        with contract.communicator_of(toy.ToyComm.of(world), kind,
                                      topology=inproc.topology) as (c, label):
            assert c.engine.name == "toy"
            cfgs = contract.configs(c.size, light=True)
            return [f"{label}: {line}" for line in
                    contract.run_configs(c, cfgs, density="sparse")]

    fails = [line for lines in inproc.run_ranks(n, rank) for line in lines]
    assert not fails, "\n".join(fails[:20])


def test_the_cli_lists_and_accepts_it(toy: Any) -> None:
    from ringtune.cli import build_parser

    parser = build_parser()
    for verb in ("tune", "bench", "probe"):
        sub = parser._subparsers._group_actions[0].choices[verb]
        text = " ".join(sub.format_help().split())
        assert "{auto,mpi,torch,toy}" in text, text
        assert "toy (threads as ranks, tests/toy_engine.py)" in text
        assert "toy under toyrun" in text
        assert parser.parse_args([verb, "--engine", "toy"]).engine == "toy"


def test_auto_takes_the_engine_whose_launcher_started_the_process(
        toy: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ringtune.engine import resolve_engine

    for var in ("TORCHELASTIC_RUN_ID", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                "PMI_FD", toy.RUN_ENV):
        monkeypatch.delenv(var, raising=False)
    args = argparse.Namespace(engine="auto", verb="bench", np=None)
    assert resolve_engine(args).name == "mpi"  # no launcher: the one that launches itself
    monkeypatch.setenv(toy.RUN_ENV, "1")
    assert resolve_engine(args).name == "toy"


def test_what_it_cannot_do_is_one_line_naming_it(toy: Any) -> None:
    from ringtune.cli import main

    assert main(["bench", "--engine", "toy", "-np", "2"]) == 2
    assert main(["probe", "--engine", "toy", "--measure"]) == 2


def test_bench_runs_over_it(toy: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ringtune.cli import main

    assert main(["bench", "--engine", "toy", "-b", "1K", "-e", "4K", "-c", "1"]) == 0
    out = capsys.readouterr().out
    assert "engine toy (threads)" in out and "transport inproc" in out, out
    assert "Out of bounds values : 0 OK" in out, out


def test_online_tuning_records_the_engine(toy: Any) -> None:
    inproc.register()
    n, counts = 2, (5, 1000)

    def body(world: Any) -> Any:
        # The built-in defaults (their transport mpi becomes the engine's own, inproc).
        c = Communicator(toy.ToyComm.of(world), topology=inproc.topology(n),
                         tune="online", tune_options={"calls": 4, "samples": 1, "share": 1,
                                                      "candidates": 2})
        try:
            assert c.engine.name == "toy"
            for _ in range(6):
                for count in counts:
                    buf = check_input(count, "float32", "sum", c.rank)
                    c.allreduce(buf)
                    assert np.array_equal(buf, expected(count, "float32", "sum", n))
            return c.online.profile_dict()
        finally:
            c.online.out = None
            c.close()

    doc = inproc.run_ranks(n, body)[0]
    assert doc["engine"] == {"name": "toy", "backend": "threads", "version": "0.1"}
    assert "library" not in doc  # no MPI library's allreduce was measured against
    assert profile_from_dict(doc, "<online>").engine_name == "toy"
