"""schemas.json and science.json, the synthetic generator's function libraries: they load, bad
files are refused with one line naming the spec and the key, and the generator's output is pinned."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.config import DataConfig
from hpcpipe.config.synthetic import SyntheticMix
from hpcpipe.data.function_calling import schemas
from hpcpipe.data.function_calling.generator import LIBRARY
from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows
from hpcpipe.data.function_calling.library import build_library
from hpcpipe.data.function_calling.prepare import fingerprint
from hpcpipe.data.function_calling.schemas import SCIENCE, load_catalogue, phrase_key
from hpcpipe.errors import DataError

# SHA-256 of json.dumps(generate_glaive_rows(200, 0, SyntheticMix.classic()), ensure_ascii=False). The
# classic mix draws exactly what the generator drew before the data.synthetic_mix knobs existed (and
# before its library moved from Python code to schemas.json); the hash was re-taken once, when 16
# functions that shared a name with a BFCL function were renamed (test_generator_no_bfcl_leak.py,
# beside this file).
# A change here changes the data set.
ROWS_200_SEED_0 = "c7928cf31fa9f487d5888e0a15b78e255efdb5497145f542c5879cfa823b37bd"

SMALL: dict[str, Any] = {
    "pools": {
        "cities": {"Zürich": {"lat": 47.3769, "lon": 8.5417}, "Kraków": {"lat": 50.0647, "lon": 19.945}},
        "conditions": ["sunny", "foggy"],
    },
    "specs": [
        {
            "name": "get_current_weather",
            "description": "Get the current weather in a city",
            "domain": "weather",
            "capability": "check the weather",
            "params": [
                {
                    "name": "city",
                    "schema": {"type": "string", "description": "The city"},
                    "draw": {"pick": "cities"},
                },
                {
                    "name": "units",
                    "schema": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "The units",
                    },
                    "draw": {"pick": ["celsius", "fahrenheit"]},
                    "required": False,
                    "phrase": {"celsius": "In Celsius, please.", "fahrenheit": "In Fahrenheit, please."},
                },
            ],
            "requests": ["What's the weather in {city}?", "How is it outside in {city}?"],
            "result": "weather",
            "answers": ["It's {temperature} degrees and {condition} in {city}."],
        }
    ],
}


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "schemas.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


def test_the_shipped_library_loads_with_40_uniquely_named_functions() -> None:
    catalogue = load_catalogue()
    names = [spec.name for spec in catalogue.specs]
    assert len(names) >= 40 and len(set(names)) == len(names)
    assert load_catalogue() is catalogue  # read once
    assert [spec.name for spec in LIBRARY] == names


def test_a_small_library_loads_and_draws_from_its_own_pools(tmp_path: Path) -> None:
    (spec,) = build_library(load_catalogue(_write(tmp_path, SMALL)))
    r = random.Random(0)
    for _ in range(20):
        args: dict[str, Any] = {}
        for param in spec.params:
            args[param.name] = param.gen(r, args)
        assert args["city"] in {"Zürich", "Kraków"}
        assert spec.result(args, r)["condition"] in {"sunny", "foggy"}
    assert spec.params[1].phrase_for("fahrenheit") == "In Fahrenheit, please."


def test_phrase_keys_are_strings_as_they_are_and_other_values_as_json() -> None:
    values = ("celsius", True, False, 15, 12.5)
    assert [phrase_key(v) for v in values] == ["celsius", "true", "false", "15", "12.5"]


def _spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["specs"][0]
    return spec


BAD: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "unknown key": (
        lambda d: _spec(d)["params"][1].update(colour="red"),
        "spec 'get_current_weather': params.units.colour: unknown key",
    ),
    "request without a required parameter": (
        lambda d: _spec(d)["requests"].append("Is it raining?"),
        "spec 'get_current_weather': requests: 'Is it raining?' does not name city",
    ),
    "unknown pool": (
        lambda d: _spec(d)["params"][0].update(draw={"pick": "citys"}),
        "spec 'get_current_weather': params.city.draw: no pool 'citys' in pools (did you mean 'cities'?)",
    ),
    "unknown result function": (
        lambda d: _spec(d).update(result="wether"),
        "spec 'get_current_weather': result: unknown result function 'wether'",
    ),
    "pool a result function reads is missing": (
        lambda d: d["pools"].pop("conditions"),
        "spec 'get_current_weather': result 'weather': no pool 'conditions' in pools",
    ),
    "unknown derive function": (
        lambda d: _spec(d)["params"][0].update(draw={"derive": "city_of_light"}),
        "spec 'get_current_weather': params.city.draw: unknown derive function 'city_of_light'",
    ),
    "phrase without a sentence for a value": (
        lambda d: _spec(d)["params"][1]["phrase"].pop("fahrenheit"),
        "spec 'get_current_weather': params.units: phrase: no sentence for fahrenheit",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_library_is_refused_naming_the_file_the_spec_and_the_key(tmp_path: Path, case: str) -> None:
    mutate, expected = BAD[case]
    doc = copy.deepcopy(SMALL)
    mutate(doc)
    with pytest.raises(DataError) as info:
        load_catalogue(_write(tmp_path, doc))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'schemas.json'}: ") and "\n" not in message
    assert expected in message


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "schemas.json"
    path.write_text('{"pools": {}, "specs": [', encoding="utf-8")
    with pytest.raises(DataError, match=r"schemas\.json: not valid JSON"):
        load_catalogue(path)


def test_the_generated_rows_are_the_ones_pinned() -> None:
    rows = generate_glaive_rows(200, 0, SyntheticMix.classic())
    digest = hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()
    assert digest == ROWS_200_SEED_0


def test_the_science_library_loads_and_prepared_rows_are_keyed_by_both_libraries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    science = [spec.name for spec in load_catalogue(shipped=SCIENCE).specs]
    assert len(science) >= 20 and len(set(science)) == len(science)
    assert not set(science) & {spec.name for spec in load_catalogue().specs}
    cfg = DataConfig(format="glaive", sources=["@synthetic"])
    before = fingerprint(cfg, 512, "tok", 0)
    shipped_text = schemas._shipped_text
    monkeypatch.setattr(
        schemas, "_shipped_text", lambda name: shipped_text(name) + (" " if name == SCIENCE else "")
    )
    # An edited library is other rows: the data is prepared again, not read from a stale directory.
    assert fingerprint(cfg, 512, "tok", 0) != before
