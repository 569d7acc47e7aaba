"""The JSON Schema of profile version 1 and the loader agree on every good and bad example.

A schema cannot express some checks (rules contiguous and sorted, only the last rule
open-ended, ring orders that are permutations of this world's ranks); each bad example says
whether the schema must catch it, and the test holds both sides to exactly that.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import jsonschema
import pytest
import yaml

from collectives.algorithms import algorithm_names
from collectives.errors import ProfileError
from collectives.profile import load_profile, profile_from_dict

from .test_profile import BAD, GOOD, case_data, case_text

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA_PATH = os.path.join(ROOT, "profiles", "schema", "profile-v1.schema.json")


@pytest.fixture(scope="module")
def validator() -> Any:
    with open(SCHEMA_PATH) as fh:
        schema = json.load(fh)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_examples_pass_both(validator: Any, name: str) -> None:
    data = GOOD[name]
    errors = [e.message for e in validator.iter_errors(data)]
    assert not errors, errors
    profile_from_dict(data, name)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_examples_agree(validator: Any, name: str, tmp_path: Any) -> None:
    schema_sees_it = BAD[name][2]
    if schema_sees_it is None:
        # Not YAML, or empty: there is no document for the schema to judge; the loader
        # must still reject the file.
        path = tmp_path / "p.yaml"
        path.write_text(case_text(name))
        with pytest.raises(ProfileError):
            load_profile(str(path))
        return
    data = case_data(name)
    with pytest.raises(ProfileError):
        profile_from_dict(data, name, world_size=4)
    rejected = not validator.is_valid(data)
    assert rejected == schema_sees_it, (
        f"{name}: schema {'rejects' if rejected else 'accepts'} it, expected "
        f"{'rejection' if schema_sees_it else 'acceptance (a loader-only check)'}")


def test_schema_knows_every_registered_algorithm() -> None:
    with open(SCHEMA_PATH) as fh:
        schema = json.load(fh)
    names = set(schema["$defs"]["rule"]["properties"]["algorithm"]["enum"])
    registered = {a for a in algorithm_names() if a != "sleep"}
    assert registered <= names, f"add {sorted(registered - names)} to the schema"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(ROOT, "profiles", "examples",
                                                               "*.yaml"))))
def test_shipped_examples_pass_both(validator: Any, path: str) -> None:
    with open(path) as fh:
        data = yaml.safe_load(fh)
    assert validator.is_valid(data), [e.message for e in validator.iter_errors(data)]
    load_profile(path)


@pytest.mark.parametrize("key, good, bad", [("impl", "auto", "Not A Name"),
                                            ("composition", "beta", "omega")])
def test_native_params_are_in_the_schema(validator: Any, key: str, good: str,
                                         bad: str) -> None:
    """``native`` accepts ``impl`` (the library's own algorithm) and ``composition``
    (MPICH's): the schema agrees with the loader, and refuses a value the loader refuses
    too."""
    data = json.loads(json.dumps(GOOD[sorted(GOOD)[0]]))
    rule = next(r for r in data["rules"] if r["algorithm"] == "native")
    rule["params"] = {key: good}
    assert validator.is_valid(data), [e.message for e in validator.iter_errors(data)]
    profile_from_dict(data, f"{key}-good")
    rule["params"] = {key: bad}
    assert not validator.is_valid(data)
    with pytest.raises(ProfileError, match=key):
        profile_from_dict(data, f"{key}-bad")
