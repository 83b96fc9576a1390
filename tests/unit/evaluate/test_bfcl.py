"""BFCL's dev and test splits: disjoint, fixed (the same ids for everyone), file order kept, and
bad input (an unknown split, files without the test cases) ending in one line with exit code 2."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import run_cli

from hpcpipe.errors import DataError
from hpcpipe.evaluate.bfcl import DEV_CASES, NO_TEST_SPLIT, TEST_CASES, load_bfcl, split_entries

ROOT = Path(__file__).resolve().parents[3]
BFCL = ROOT / "data" / "external" / "bfcl"
DEFAULT_CATEGORIES = (
    "simple", "multiple", "parallel", "parallel_multiple",
    "irrelevance", "live_simple", "live_multiple", "live_irrelevance",
)  # fmt: skip

# The test split of the pinned bfcl-eval wheel (assets/fc-wheels.txt): sha256 of its ids, one per
# line, per category. A change here redraws the cases every reported figure was measured on.
TEST_SPLIT_SHA256 = {
    "simple": "b78fea6d9aa08df7",
    "multiple": "f10b971e5cd240c0",
    "parallel": "cd2cec965cea34fb",
    "parallel_multiple": "b9b3b0bff9126498",
    "irrelevance": "34e552d855ea65c9",
    "live_simple": "9a3624fa6b5b5e8f",
    "live_multiple": "d2dd2a30370abaff",
    "live_irrelevance": "96f3b02590df6dbe",
}

needs_bfcl = pytest.mark.skipif(
    not BFCL.is_dir(), reason="no BFCL files in data/external/bfcl: run `make fc-assets`"
)


def _ids(category: str, split: str) -> list[str]:
    return [case.id for case in load_bfcl(BFCL, [category], split=split)]


@needs_bfcl
@pytest.mark.parametrize("category", DEFAULT_CATEGORIES)
def test_dev_is_the_first_cases_and_test_is_disjoint_fixed_and_in_file_order(category: str) -> None:
    every = _ids(category, "all")
    dev, test = _ids(category, "dev"), _ids(category, "test")
    assert dev == every[:DEV_CASES], "dev: the cases every choice so far was made on"
    assert len(test) == TEST_CASES and not set(dev) & set(test)
    assert test == [i for i in every if i in set(test)], "file order"
    digest = hashlib.sha256("\n".join(test).encode()).hexdigest()[:16]
    assert digest == TEST_SPLIT_SHA256[category], f"{category}: the test split changed"


def test_the_draw_ignores_file_order_and_hash_seed(tmp_path: Path) -> None:
    """A case's place in the test split hangs on its id alone: the same ids whatever order the
    file lists them in and under any PYTHONHASHSEED (no set or dict order leaks in)."""
    entries = [{"id": f"simple_{i}"} for i in range(200)]
    drawn = [e["id"] for e in split_entries(entries, "test", tmp_path)]
    shuffled = entries[:DEV_CASES] + random.Random(3).sample(entries[DEV_CASES:], 200 - DEV_CASES)
    assert sorted(e["id"] for e in split_entries(shuffled, "test", tmp_path)) == sorted(drawn)
    code = (
        "from pathlib import Path; from hpcpipe.evaluate.bfcl import split_entries; "
        "entries = [{'id': f'simple_{i}'} for i in range(200)]; "
        "print([e['id'] for e in split_entries(entries, 'test', Path('.'))])"
    )
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == repr(drawn)


def test_limit_takes_the_first_cases_of_the_split(tmp_path: Path) -> None:
    entries = [{"id": f"simple_{i}"} for i in range(100)]
    test = split_entries(entries, "test", tmp_path)
    assert [e["id"] for e in split_entries(entries, "dev", tmp_path)][-1] == f"simple_{DEV_CASES - 1}"
    assert all(int(e["id"].split("_")[1]) >= DEV_CASES for e in test)
    assert split_entries(entries, "all", tmp_path) == entries


def _truncated_bfcl(tmp_path: Path, cases: int) -> Path:
    """An irrelevance file with ``cases`` single-turn cases (irrelevance needs no answer file)."""
    turn = [{"role": "user", "content": "hi"}]
    lines = [json.dumps({"id": f"irrelevance_{i}", "question": [turn], "function": []}) for i in range(cases)]
    (tmp_path / "BFCL_v4_irrelevance.json").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_files_without_the_test_cases_are_a_data_error_naming_the_file(tmp_path: Path) -> None:
    bfcl = _truncated_bfcl(tmp_path, DEV_CASES + 5)
    assert len(load_bfcl(bfcl, ["irrelevance"], split="dev")) == DEV_CASES
    with pytest.raises(
        DataError, match=r"BFCL_v4_irrelevance\.json: 35 single-turn case\(s\), but the test split"
    ):
        load_bfcl(bfcl, ["irrelevance"], split="test")
    with pytest.raises(DataError, match="unknown BFCL split 'train'"):
        load_bfcl(bfcl, ["irrelevance"], split="train")


def test_categories_too_small_for_a_test_split_are_refused_by_name(tmp_path: Path) -> None:
    """live_parallel's whole file has 16 cases: --split test sent users to fetch the whole file,
    which they already had. Refused before any file is read (tmp_path holds none)."""
    with pytest.raises(DataError, match=r"live_parallel has no test split: .*\(live_parallel 16\)"):
        load_bfcl(tmp_path, ["simple", "live_parallel"], split="test")


@needs_bfcl
@pytest.mark.parametrize("category", sorted(NO_TEST_SPLIT))
def test_the_categories_without_a_test_split_are_whole_and_that_small(category: str) -> None:
    assert len(_ids(category, "all")) == NO_TEST_SPLIT[category] < DEV_CASES + TEST_CASES
    assert _ids(category, "dev") == _ids(category, "all")[:DEV_CASES]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--split", "holdout"], "--split: unknown split 'holdout' (known: dev, test, all)"),
        (
            ["--split", "test"],
            "BFCL_v4_irrelevance.json: 35 single-turn case(s), but the test split needs 60",
        ),
    ],
)
def test_bad_split_input_is_one_line_and_exit_2_before_any_model_loads(
    tmp_path: Path, args: list[str], line: str
) -> None:
    """The target is no model (an empty directory): the split and the BFCL files are checked
    before any model loads, so the error a user sees names them."""
    bfcl = _truncated_bfcl(tmp_path, DEV_CASES + 5)
    where = ["--bfcl-dir", str(bfcl), "--categories", "irrelevance"]
    (tmp_path / "not-a-model").mkdir()
    out = run_cli("eval", "function-calling", str(tmp_path / "not-a-model"), *where, *args)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert line in out.stderr


def test_cases_and_answers_of_another_shape_are_named(tmp_path: Path) -> None:
    """A question that is an object ended in KeyError 0; an answer without ground_truth made its
    case 'no call expected', so a plain-text reply passed it."""
    from hpcpipe.evaluate.bfcl import FILE_STEMS

    name = f"BFCL_v4_{FILE_STEMS['simple']}.json"
    (tmp_path / "possible_answer").mkdir()
    case = {"id": "simple_0", "question": {"a": 1}, "function": []}
    (tmp_path / name).write_text(json.dumps(case) + "\n")
    (tmp_path / "possible_answer" / name).write_text(
        json.dumps({"id": "simple_0", "ground_truth": []}) + "\n"
    )
    with pytest.raises(DataError, match=r"case simple_0 has no 'question' list of turns"):
        load_bfcl(tmp_path, ["simple"], split="all")
    case["question"] = [[{"role": "user", "content": "hi"}]]
    (tmp_path / name).write_text(json.dumps(case) + "\n")
    (tmp_path / "possible_answer" / name).write_text(json.dumps({"id": "simple_0"}) + "\n")
    with pytest.raises(DataError, match=r"answer simple_0 has no 'ground_truth' list of calls"):
        load_bfcl(tmp_path, ["simple"], split="all")


def _write_case(root: Path, case: dict[str, object], truth: object) -> None:
    from hpcpipe.evaluate.bfcl import FILE_STEMS

    name = f"BFCL_v4_{FILE_STEMS['simple']}.json"
    (root / "possible_answer").mkdir(exist_ok=True)
    (root / name).write_text(json.dumps(case) + "\n")
    (root / "possible_answer" / name).write_text(json.dumps({"id": case["id"], "ground_truth": truth}) + "\n")


_FUNCTION = {"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}}}
_TURN = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("truth", "reason"),
    [
        ([], "answer simple_0 has an empty 'ground_truth' (no call to expect)"),
        ([{}], "answer simple_0, call 0: not an object of one function name"),
        (["f"], "answer simple_0, call 0: not an object of one function name"),
        ([{"f": {}, "g": {}}], "answer simple_0, call 0: not an object of one function name"),
        ([{"f": 5}], "answer simple_0, call 0: 'f' maps to int, not an object of parameters"),
        (
            [{"f": {"x": [1]}}, {"g": {"x": 1}}],
            "answer simple_0, call 1: 'g': parameter 'x' has no list of allowed values",
        ),
    ],
)
def test_answers_of_another_shape_are_named_before_any_generation(
    tmp_path: Path, truth: object, reason: str
) -> None:
    """[{}] ended in StopIteration when scored and [{"f": 5}] in the checker, both after all the
    generation; [] read as "no call expected", so a plain reply passed a case expecting a call."""
    _write_case(tmp_path, {"id": "simple_0", "question": [_TURN], "function": [_FUNCTION]}, truth)
    with pytest.raises(DataError, match=r"possible_answer/BFCL_v4_simple_python\.json: " + re.escape(reason)):
        load_bfcl(tmp_path, ["simple"], split="all")


@pytest.mark.parametrize(
    ("turn", "functions", "reason"),
    [
        ([{"content": "hi"}], [_FUNCTION], "message 0: not an object with a 'role' and 'content' string"),
        (["hi"], [_FUNCTION], "message 0: not an object with a 'role' and 'content' string"),
        ([{"role": "user", "content": None}], [_FUNCTION], "message 0: not an object with a 'role'"),
        (_TURN, ["f"], "function 0: not an object with a 'name' string"),
        (_TURN, [_FUNCTION, {"description": "no name"}], "function 1: not an object with a 'name' string"),
        (_TURN, [{"name": "f", "parameters": [1]}], "function 0: parameters is not an object"),
        (
            _TURN,
            [{"name": "f", "parameters": {"properties": {"x": "int"}}}],
            "function 0: parameters.properties.x is not an object",
        ),
    ],
)
def test_messages_and_functions_of_another_shape_are_named(
    tmp_path: Path, turn: list[object], functions: list[object], reason: str
) -> None:
    """Each was a KeyError ('role', 'name') or an AttributeError when the case was built."""
    case = {"id": "simple_0", "question": [turn], "function": functions}
    _write_case(tmp_path, case, [{"f": {"x": [1]}}])
    with pytest.raises(DataError, match=r"BFCL_v4_simple_python\.json: case simple_0, " + re.escape(reason)):
        load_bfcl(tmp_path, ["simple"], split="all")


def test_bad_bfcl_files_are_one_line_and_exit_2_before_any_model_loads(tmp_path: Path) -> None:
    _write_case(tmp_path, {"id": "simple_0", "question": [_TURN], "function": [_FUNCTION]}, [{}])
    (tmp_path / "not-a-model").mkdir()
    where = ["--bfcl-dir", str(tmp_path), "--categories", "simple"]
    out = run_cli("eval", "function-calling", str(tmp_path / "not-a-model"), *where)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "answer simple_0, call 0: not an object of one function name" in out.stderr


def test_a_category_given_twice_is_one_line_and_exit_2_before_any_model_loads(tmp_path: Path) -> None:
    """`--categories simple,simple` read and scored the cases twice: twice the cases, a too narrow
    interval."""
    (tmp_path / "not-a-model").mkdir()
    where = ["--bfcl-dir", str(tmp_path), "--categories", "simple, irrelevance,simple"]
    out = run_cli("eval", "function-calling", str(tmp_path / "not-a-model"), *where)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "--categories: simple given more than once" in out.stderr
