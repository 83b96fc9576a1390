"""hpcpipe.evaluate.ast_checker follows BFCL's AST rules, one test per rule; hpcpipe.evaluate.bfcl
loads BFCL's real files (a few lines of each category, tests/data/bfcl) and their answers pass."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.errors import DataError
from hpcpipe.evaluate.ast_checker import ERROR_TYPES, CheckResult, check_calls, expected_calls, strict_match
from hpcpipe.evaluate.bfcl import CATEGORIES, FILE_STEMS, BfclCase, load_bfcl, to_tool_schema

BFCL_DIR = Path(__file__).parents[2] / "data" / "bfcl"


def doc(name: str, required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    """A BFCL function doc; ``props`` are parameter schemas, or bare type names."""
    schemas = {k: {"type": v} if isinstance(v, str) else v for k, v in props.items()}
    return {
        "name": name,
        "description": "",
        "parameters": {"type": "dict", "properties": schemas, "required": required or []},
    }


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


AREA = doc("geometry.area", ["base", "height"], base="integer", height="float", unit="string")
AREA_TRUTH = [{"geometry.area": {"base": [10], "height": [5.0], "unit": ["units", ""]}}]


def check(
    *calls: dict[str, Any],
    functions: list[dict[str, Any]] | None = None,
    truth: list[dict[str, Any]] | None = AREA_TRUTH,
    category: str = "simple",
) -> CheckResult:
    return check_calls(list(calls), functions or [AREA], truth, category)


def test_a_correct_call_passes_and_results_are_typed() -> None:
    assert check(call("geometry.area", base=10, height=5.0, unit="units")) == CheckResult(True, None, "")
    assert len(ERROR_TYPES) == 8


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("geometry_area", True),  # BFCL: "." may arrive as "_" (APIs that forbid dots in names)
        ("geometry-area", False),
        ("area", False),
        ("GEOMETRY.AREA", False),
    ],
)
def test_function_name(name: str, valid: bool) -> None:
    result = check(call(name, base=10, height=5.0))
    assert result.valid is valid
    if not valid:
        assert result.error_type == "wrong_name" and "geometry.area" in result.detail


def test_underscore_rule_only_goes_from_the_expected_name() -> None:
    fn = doc("get_area", ["x"], x="integer")
    assert not check(call("get.area", x=1), functions=[fn], truth=[{"get_area": {"x": [1]}}]).valid


def test_missing_required_parameter() -> None:
    result = check(call("geometry.area", base=10))
    assert (result.error_type, "'height'" in result.detail) == ("missing_required", True)


@pytest.mark.parametrize("extra", [{"colour": "red"}, {"depth": 3}])
def test_unexpected_parameter(extra: dict[str, Any]) -> None:
    # Neither in the doc ("colour") nor in the doc and absent from the answer ("depth").
    fn = doc(
        "geometry.area", ["base", "height"], base="integer", height="float", unit="string", depth="integer"
    )
    result = check(call("geometry.area", base=10, height=5.0, **extra), functions=[fn])
    assert result.error_type == "unexpected_parameter" and next(iter(extra)) in result.detail


@pytest.mark.parametrize(
    ("base", "height", "error"),
    [
        (10, 5, None),  # float accepts an int, as BFCL does
        (10.0, 5.0, "type_error"),  # integer does not accept a float
        (True, 5.0, "type_error"),  # a bool is not an integer
        ("10", 5.0, "type_error"),
        (10, False, "type_error"),
    ],
)
def test_number_types(base: Any, height: Any, error: str | None) -> None:
    assert check(call("geometry.area", base=base, height=height)).error_type == error


def test_boolean_and_any_types() -> None:
    fn = doc("f", ["flag"], flag="boolean", anything="any")
    truth = [{"f": {"flag": [True], "anything": [3, ""]}}]
    assert check(call("f", flag=1), functions=[fn], truth=truth).error_type == "type_error"
    assert check(call("f", flag=True, anything=3), functions=[fn], truth=truth).valid
    assert check(call("f", flag=True, anything="3"), functions=[fn], truth=truth).error_type == "value_error"


def test_variable_rule_answer_type_beats_the_doc() -> None:
    # BFCL: a value of the answer's own type passes the type check (here "dontcare" for an integer).
    fn = doc("find_home", ["rooms"], rooms="integer")
    truth = [{"find_home": {"rooms": ["dontcare"]}}]
    assert check(call("find_home", rooms="dontcare"), functions=[fn], truth=truth).valid
    assert check(call("find_home", rooms="DontCare"), functions=[fn], truth=truth).error_type == "value_error"


@pytest.mark.parametrize(
    ("given", "valid"),
    [
        ("San Francisco, CA", True),
        ("san francisco ca", True),
        ("SAN-FRANCISCO/CA.", True),  # spaces and ,./-_*^ are ignored, case too
        ("San_Francisco*CA^", True),
        ("San Fransisco, CA", False),
        ("San Francisco, CA!", False),  # other punctuation counts
    ],
)
def test_string_normalisation(given: str, valid: bool) -> None:
    fn = doc("weather", ["city"], city="string")
    truth = [{"weather": {"city": ["San Francisco, CA"]}}]
    result = check(call("weather", city=given), functions=[fn], truth=truth)
    assert result.valid is valid
    if not valid:
        assert result.error_type == "value_error" and "'city'" in result.detail


def test_single_quotes_match_double_quotes() -> None:
    fn = doc("q", ["sql"], sql="string")
    assert check(call("q", sql="name = 'x'"), functions=[fn], truth=[{"q": {"sql": ['name = "x"']}}]).valid


def test_optional_parameter_may_be_omitted_only_when_blank_is_allowed() -> None:
    assert check(call("geometry.area", base=10, height=5.0)).valid  # unit: ["units", ""]
    truth = [{"geometry.area": {"base": [10], "height": [5.0], "unit": ["cm"]}}]
    result = check(call("geometry.area", base=10, height=5.0), truth=truth)
    assert result.error_type == "missing_required" and "'unit'" in result.detail


def test_list_values() -> None:
    fn = doc("stocks", ["names"], names={"type": "array", "items": {"type": "string"}})
    truth = [{"stocks": {"names": [["Apple", "Microsoft"], ["AAPL", "MSFT"]]}}]
    assert check(call("stocks", names=["apple", "MICROSOFT"]), functions=[fn], truth=truth).valid
    assert check(call("stocks", names=["AAPL", "MSFT"]), functions=[fn], truth=truth).valid
    for names in (["Microsoft", "Apple"], ["Apple"]):  # order and length count
        assert check(call("stocks", names=names), functions=[fn], truth=truth).error_type == "value_error"
    result = check(call("stocks", names=["Apple", 7]), functions=[fn], truth=truth)
    assert result.error_type == "type_error" and "item 1" in result.detail


def test_tuple_and_float_items() -> None:
    fn = doc("dist", ["p"], p={"type": "tuple", "items": {"type": "float"}})
    truth = [{"dist": {"p": [[3.0, 4.5]]}}]
    assert check(call("dist", p=[3, 4.5]), functions=[fn], truth=truth).valid
    assert check(call("dist", p=["3", 4.5]), functions=[fn], truth=truth).error_type == "type_error"


DRINK = doc(
    "change_drink",
    ["prefs"],
    prefs={
        "type": "dict",
        "properties": {"size": {"type": "string"}, "shots": {"type": "integer"}, "milk": {"type": "string"}},
    },
)
DRINK_TRUTH = [{"change_drink": {"prefs": [{"size": ["large"], "shots": [2], "milk": ["", "whole"]}]}}]


@pytest.mark.parametrize(
    ("prefs", "error"),
    [
        ({"size": "Large", "shots": 2}, None),
        ({"size": "large", "shots": 2, "milk": "WHOLE"}, None),
        ({"size": "small", "shots": 2}, "value_error"),
        ({"size": "large"}, "value_error"),  # "shots" may not be left out
        ({"size": "large", "shots": 2, "sugar": "none"}, "value_error"),
        ({"size": "large", "shots": "2"}, "type_error"),  # nested properties are type-checked
    ],
)
def test_nested_dict_values(prefs: dict[str, Any], error: str | None) -> None:
    assert check(call("change_drink", prefs=prefs), functions=[DRINK], truth=DRINK_TRUTH).error_type == error


def test_list_of_dicts_values() -> None:
    fn = doc("query", ["conds"], conds={"type": "array", "items": {"type": "dict"}})
    truth = [{"query": {"conds": [[{"field": ["age"], "op": [">"]}, {"field": ["job"], "op": ["="]}]]}}]
    good = [{"field": "Age", "op": ">"}, {"field": "job", "op": "="}]
    assert check(call("query", conds=good), functions=[fn], truth=truth).valid
    assert not check(call("query", conds=good[::-1]), functions=[fn], truth=truth).valid


PLAY = doc("spotify.play", ["artist", "minutes"], artist="string", minutes="integer")
PLAY_TRUTH = [
    {"spotify.play": {"artist": ["Taylor Swift"], "minutes": [20]}},
    {"spotify.play": {"artist": ["Maroon 5"], "minutes": [15]}},
]


def test_parallel_calls_match_in_any_order() -> None:
    swift = call("spotify.play", artist="Taylor Swift", minutes=20)
    maroon = call("spotify.play", artist="Maroon 5", minutes=15)
    for calls in ([swift, maroon], [maroon, swift]):
        assert check(*calls, functions=[PLAY], truth=PLAY_TRUTH, category="parallel").valid
    twice = check(swift, swift, functions=[PLAY], truth=PLAY_TRUTH, category="live_parallel")
    assert twice.error_type == "value_error" and "'artist'" in twice.detail


def test_parallel_finds_an_assignment_that_greedy_matching_misses() -> None:
    # The first answer accepts either call; a greedy first match would take the one the second needs.
    fn = doc("price", ["day"], day="string")
    truth = [{"price": {"day": ["mon", "tue"]}}, {"price": {"day": ["mon"]}}]
    assert check(
        call("price", day="mon"), call("price", day="tue"), functions=[fn], truth=truth, category="parallel"
    ).valid


def test_parallel_without_a_pairing_fails_fast() -> None:
    fn = doc("price", ["day"], day="string")
    truth = [{"price": {"day": ["mon", "tue"]}}] * 11 + [{"price": {"day": ["wed"]}}]
    calls = [call("price", day="mon")] * 12
    result = check(*calls, functions=[fn], truth=truth, category="parallel")  # no 12! search
    assert result.error_type == "value_error" and "'day'" in result.detail


@pytest.mark.parametrize(
    ("calls", "category"),
    [
        (2, "simple"),
        (2, "live_multiple"),
        (1, "parallel"),
        (3, "parallel_multiple"),
    ],
)
def test_wrong_count(calls: int, category: str) -> None:
    one = call("spotify.play", artist="Taylor Swift", minutes=20)
    truth = PLAY_TRUTH if "parallel" in category else PLAY_TRUTH[:1]
    result = check(*[one] * calls, functions=[PLAY], truth=truth, category=category)
    assert result.error_type == "wrong_count"


def test_multiple_checks_the_chosen_function_against_its_own_doc() -> None:
    functions = [PLAY, AREA]
    assert check(call("geometry.area", base=10, height=5.0), functions=functions, category="multiple").valid
    wrong = check(call("spotify.play", artist="x", minutes=1), functions=functions, category="multiple")
    assert wrong.error_type == "wrong_name"


def test_irrelevance_and_no_call() -> None:
    some = call("geometry.area", base=10, height=5.0)
    assert check(truth=None, category="irrelevance").valid
    assert check(truth=None, category="live_irrelevance").valid
    assert check(some, truth=None, category="live_irrelevance").error_type == "unexpected_call"
    assert check(some, truth=AREA_TRUTH, category="irrelevance").error_type == "unexpected_call"
    assert check(truth=AREA_TRUTH).error_type == "no_call"


def test_first_error_in_a_fixed_order() -> None:
    # Required parameters first, then the call's parameters in the call's order, then omissions.
    assert check(call("geometry.area", base="ten")).error_type == "missing_required"
    both_bad = check(call("geometry.area", height="five", base="ten"))
    assert both_bad.error_type == "type_error" and "'height'" in both_bad.detail
    assert check(call("geometry.area", height=1.0, base=1, unit="x")).error_type == "value_error"


def test_undeclared_function_is_checked_against_its_answer() -> None:
    truth = [{"ghost": {"x": [1]}}]
    assert check(call("ghost", x=1), functions=[], truth=truth).valid
    assert check(call("ghost", x=2), functions=[], truth=truth).error_type == "value_error"


def test_expected_calls_and_strict_match() -> None:
    assert expected_calls(AREA_TRUTH) == [call("geometry.area", base=10, height=5.0, unit="units")]
    assert expected_calls(DRINK_TRUTH) == [call("change_drink", prefs={"size": "large", "shots": 2})]
    assert strict_match([call("geometry.area", base=10, height=5, unit="units")], AREA_TRUTH)  # 5 == 5.0
    assert strict_match([call("geometry_area", base=10, height=5.0, unit="units")], AREA_TRUTH)
    lenient = call("geometry.area", base=10, height=5.0, unit="Units")
    assert check(lenient).valid and not strict_match([lenient], AREA_TRUTH)  # no normalisation
    assert not strict_match([call("geometry.area", base=10, height=5.0)], AREA_TRUTH)  # first value wanted
    assert not strict_match([call("geometry.area", base=True, height=5.0, unit="units")], AREA_TRUTH)
    swift, maroon = expected_calls(PLAY_TRUTH)
    assert strict_match([maroon, swift], PLAY_TRUTH) and not strict_match([swift], PLAY_TRUTH)
    assert strict_match([], [])


# ---- BFCL's own files ---------------------------------------------------------------------------


def test_real_files_load_and_their_answers_pass() -> None:
    cases = load_bfcl(BFCL_DIR, CATEGORIES)
    assert sorted({c.category for c in cases}) == sorted(CATEGORIES) and len(cases) == 3 * len(CATEGORIES)
    for case in cases:
        assert case.messages and case.messages[0]["role"] in ("system", "user")
        if "irrelevance" in case.category:
            assert case.ground_truth is None
            assert check_calls([], case.functions, None, case.category).valid
            continue
        assert case.ground_truth
        predicted = expected_calls(case.ground_truth)
        result = check_calls(predicted, case.functions, case.ground_truth, case.category)
        assert result.valid, (case.id, result)
        assert strict_match(predicted, case.ground_truth), case.id
        assert check_calls([], case.functions, case.ground_truth, case.category).error_type == "no_call"


def test_real_files_limit_and_order() -> None:
    cases = load_bfcl(BFCL_DIR, ["live_simple", "simple"], limit_per_category=2)
    ids = ["live_simple_0-0-0", "live_simple_1-1-0", "simple_python_0", "simple_python_1"]
    assert [c.id for c in cases] == ids
    assert isinstance(cases[0], BfclCase) and cases[0].category == "live_simple"
    assert set(FILE_STEMS) == set(CATEGORIES) and FILE_STEMS["simple"] == "simple_python"


def _types(schema: dict[str, Any]) -> set[str]:
    found = {schema["type"]}
    for sub in [*schema.get("properties", {}).values(), *([schema["items"]] if "items" in schema else [])]:
        found |= _types(sub)
    return found


def test_real_docs_convert_to_json_schema() -> None:
    json_types = {"integer", "number", "string", "boolean", "array", "object"}
    for case in load_bfcl(BFCL_DIR, CATEGORIES):
        for fn in case.functions:
            schema = to_tool_schema(fn)
            assert schema["name"] == fn["name"] and schema["parameters"]["type"] == "object"
            assert _types(schema["parameters"]) <= json_types, fn["name"]


def test_to_tool_schema_types() -> None:
    fn = doc(
        "f",
        ["a"],
        a="float",
        b={"type": "tuple", "items": {"type": "integer"}},
        c={"type": "dict", "properties": {"d": {"type": "any", "optional": True}}, "default": {}},
        e={"type": "string", "enum": ["x", "y"], "description": "pick", "default": "x"},
    )
    params = to_tool_schema(fn)["parameters"]
    assert params["type"] == "object" and params["required"] == ["a"]
    props = params["properties"]
    assert props["a"] == {"type": "number"}
    assert props["b"] == {"type": "array", "items": {"type": "integer"}}
    assert props["c"] == {"type": "object", "properties": {"d": {"type": "string"}}, "default": {}}
    assert props["e"] == {"type": "string", "enum": ["x", "y"], "description": "pick", "default": "x"}
    assert fn["parameters"]["properties"]["a"] == {"type": "float"}  # the doc itself is untouched


# ---- loader errors ------------------------------------------------------------------------------


def test_missing_file_is_a_data_error_naming_it(tmp_path: Path) -> None:
    name = "BFCL_v4_simple_python.json"
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / name}: BFCL file not found")):
        load_bfcl(tmp_path, ["simple"])
    (tmp_path / name).write_text((BFCL_DIR / name).read_text())
    with pytest.raises(DataError, match=r"possible_answer/BFCL_v4_simple_python\.json"):
        load_bfcl(tmp_path, ["simple"])


def test_bad_json_line_unknown_category_and_missing_answer(tmp_path: Path) -> None:
    entry = '{"id": "irrelevance_0", "question": [[]], "function": []}\n'
    (tmp_path / "BFCL_v4_irrelevance.json").write_text(entry + "{oops\n")
    with pytest.raises(DataError, match=r"BFCL_v4_irrelevance\.json:2: not JSON"):
        load_bfcl(tmp_path, ["irrelevance"])
    with pytest.raises(DataError, match="unknown BFCL category 'simple_java'"):
        load_bfcl(tmp_path, ["simple_java"])
    (tmp_path / "possible_answer").mkdir()
    (tmp_path / "BFCL_v4_multiple.json").write_text(entry.replace("irrelevance", "multiple"))
    (tmp_path / "possible_answer" / "BFCL_v4_multiple.json").write_text("")
    with pytest.raises(DataError, match="no answer for multiple_0"):
        load_bfcl(tmp_path, ["multiple"])


def test_multi_turn_cases_are_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    turn = [{"role": "user", "content": "hi"}]
    lines = [
        {"id": "irrelevance_0", "question": [turn, turn], "function": []},
        {"id": "irrelevance_1", "question": [turn], "function": []},
    ]
    (tmp_path / "BFCL_v4_irrelevance.json").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    cases = load_bfcl(tmp_path, ["irrelevance"])
    assert [c.id for c in cases] == ["irrelevance_1"] and cases[0].messages == turn
    assert "skipped 1 multi-turn" in caplog.text
