"""The additive profile keys: ``library``, ``rules[i].native`` and ``shapes`` — good files
load (old ones unchanged), bad ones name the key, and the JSON Schema agrees."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from collectives.errors import ProfileError
from collectives.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "profiles/schema/profile-v1.schema.json").read_text())

BASE: dict[str, Any] = {
    "format": "ringtune-profile", "version": 1,
    "library": {"name": "MPICH", "version": "5.0.2"},
    "topology": {"world_size": 4, "hosts": 1, "ranks_per_host": 4},
    "backend": "numpy", "transport": "mpi",
    "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "rhd", "params": {},
               "native": [{"bytes": 1024, "impl": "ring", "busbw_gbps": 1.0,
                           "time_us": 3.0}]}],
    "shapes": [{"topology": {"world_size": 2}, "source": "tuned",
                "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "native"}]},
               {"topology": {"world_size": 3}, "source": "predicted", "from_world_size": 4,
                "rules": [{"min_bytes": 0, "max_bytes": None, "algorithm": "rhd"}]}],
}


def test_good_profile_loads_and_matches_the_schema() -> None:
    prof = profile_from_dict(copy.deepcopy(BASE), "p.yaml")
    assert prof.world_size == 4 and prof.section == ""
    assert profile_from_dict(copy.deepcopy(BASE), "p.yaml", world_size=3).rules[0].algorithm \
        == "rhd"
    jsonschema.Draft202012Validator(SCHEMA).validate(BASE)


@pytest.mark.parametrize("edit,key", [
    (lambda d: d["library"].update(version=5), "library.version"),
    (lambda d: d["library"].update(extra="x"), "library.extra"),
    (lambda d: d["rules"][0]["native"][0].update(busbw_gbps=-1), "rules[0].native[0].busbw"),
    (lambda d: d["rules"][0]["native"][0].pop("impl"), "rules[0].native[0].impl"),
    (lambda d: d["shapes"][1].pop("from_world_size"), "shapes[1].from_world_size"),
    (lambda d: d["shapes"][0].update(source="guessed"), "shapes[0].source"),
    (lambda d: d["shapes"][0]["topology"].update(world_size=4), "shapes[0].topology"),
    (lambda d: d["shapes"][0]["rules"][0].update(algorithm="nope"), "shapes[0].rules[0]"),
])
def test_bad_additions_name_their_key(edit: Any, key: str) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    with pytest.raises(ProfileError, match=key.replace("[", r"\[").replace("]", r"\]")):
        profile_from_dict(data, "p.yaml")
