"""``ringtune simulate`` says what its ``native`` is: an idealised allreduce of the cost
model (``native_model: best`` in every shipped cluster file), not NCCL's or an MPI
library's own selection: in its output, its JSON and its help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtune.cli import build_parser, main

H100_128 = str(Path(__file__).resolve().parents[2] / "profiles" / "clusters"
               / "dgx-h100-128.yaml")


def test_the_tables_say_native_is_idealised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", H100_128, "-b", "1M", "-e", "4M", "--algo",
                 "native,rhd"]) == 0
    out = capsys.readouterr().out
    assert "# native = an idealised allreduce" in out, out
    assert "not NCCL's or an MPI library's own" in out, out


def test_the_json_names_the_native_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--cluster", H100_128, "-b", "1M", "-e", "1M", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"]["native_model"] == "best"


def test_the_help_says_it() -> None:
    parser = build_parser()
    text = " ".join(parser.format_help().split())
    assert "its native is an idealised allreduce, not NCCL or MPI" in text, text
