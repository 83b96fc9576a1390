"""BFCL's test files -> cases for hpcpipe's checker, and BFCL function docs -> JSON-schema tools.

Layout (as in the ``bfcl-eval`` package's ``data`` folder): ``BFCL_v4_<stem>.json`` holds one
case per line (``id``, ``question``: a list of turns, each a list of ``{role, content}``,
``function``: the docs on offer); ``possible_answer/BFCL_v4_<stem>.json`` holds ``id`` and
``ground_truth`` per line. Irrelevance categories have no answer file: the right answer is no call.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.errors import DataError

log = logging.getLogger(__name__)

# Our category name -> the stem of BFCL's file name.
FILE_STEMS: dict[str, str] = {
    "simple": "simple_python",
    "multiple": "multiple",
    "parallel": "parallel",
    "parallel_multiple": "parallel_multiple",
    "irrelevance": "irrelevance",
    "live_simple": "live_simple",
    "live_multiple": "live_multiple",
    "live_parallel": "live_parallel",
    "live_parallel_multiple": "live_parallel_multiple",
    "live_irrelevance": "live_irrelevance",
}
CATEGORIES: tuple[str, ...] = tuple(FILE_STEMS)

# Which cases of each category an evaluation reads. Every sweep point, calibration set and rule
# parameter of the function-calling work so far was chosen on the first 30 single-turn cases of
# each category, so those are "dev" and choosing goes on there; "test" is TEST_CASES further cases
# per category that nothing was chosen on, drawn once from the rest by a fixed hash of each case
# id (the same cases for everyone and for any file order or Python hash seed), and read to report.
SPLITS: tuple[str, ...] = ("dev", "test", "all")
DEV_CASES = 30
TEST_CASES = 30
_TEST_DRAW = "hpcpipe-bfcl-test-v1"  # changing it redraws the test split: never tune against one draw
_MESSAGE_KEYS = ("role", "content")  # each a string in every message of a question's turn
# Categories whose whole file (the pinned bfcl-eval wheel's) is too small for DEV_CASES and
# TEST_CASES disjoint cases: their single-turn case counts. They have dev and all, no test.
NO_TEST_SPLIT: dict[str, int] = {"live_parallel": 16, "live_parallel_multiple": 24}

# BFCL's types -> JSON schema. "any" becomes "string" as in BFCL's own OpenAI conversion.
_JSON_TYPES = {
    "integer": "integer",
    "float": "number",
    "number": "number",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "object": "object",
    "any": "string",
}


@dataclass(frozen=True)
class BfclCase:
    id: str
    category: str
    messages: list[dict[str, Any]]  # the first (only) turn: [{role, content}, ...]
    functions: list[dict[str, Any]]  # BFCL function docs
    ground_truth: list[dict[str, Any]] | None  # None: no call is expected


def load_bfcl(
    data_dir: Path,
    categories: Sequence[str],
    limit_per_category: int | None = None,
    split: str = "all",
) -> list[BfclCase]:
    """The single-turn cases of ``categories`` in ``split`` (``SPLITS``), in file order; the first
    ``limit_per_category`` of each."""
    if split not in SPLITS:
        raise DataError(f"unknown BFCL split {split!r} (known: {', '.join(SPLITS)})")
    if split == "test" and (small := [c for c in categories if c in NO_TEST_SPLIT]):
        # Before any file is read: these files are whole, so the remedy for a short file cannot help.
        counts = ", ".join(f"{c} {NO_TEST_SPLIT[c]}" for c in small)
        raise DataError(
            f"BFCL category {small[0]} has no test split: its whole file holds too few single-turn "
            f"cases ({counts}) for {DEV_CASES} dev and {TEST_CASES} disjoint test ones; leave it "
            "out of --categories or use --split dev or all"
        )
    cases: list[BfclCase] = []
    for category in categories:
        cases += _load_category(Path(data_dir), category, limit_per_category, split)
    return cases


def split_entries(entries: list[dict[str, Any]], split: str, path: Path) -> list[dict[str, Any]]:
    """``split``'s share of one category's single-turn ``entries`` (file order kept)."""
    if split == "all":
        return entries
    if split == "dev":
        return entries[:DEV_CASES]
    rest = entries[DEV_CASES:]
    if len(rest) < TEST_CASES:
        raise DataError(
            f"{path}: {len(entries)} single-turn case(s), but the test split needs "
            f"{DEV_CASES + TEST_CASES} (the first {DEV_CASES} are dev); take the whole file from "
            "the bfcl-eval package (`make fc-assets`)"
        )
    drawn = {str(e["id"]) for e in sorted(rest, key=_test_draw_key)[:TEST_CASES]}
    return [e for e in rest if str(e["id"]) in drawn]


def _test_draw_key(entry: dict[str, Any]) -> str:
    return hashlib.sha256(f"{_TEST_DRAW}:{entry['id']}".encode()).hexdigest()


def _load_category(data_dir: Path, category: str, limit: int | None, split: str) -> list[BfclCase]:
    stem = FILE_STEMS.get(category)
    if stem is None:
        raise DataError(f"unknown BFCL category {category!r} (known: {', '.join(CATEGORIES)})")
    path = data_dir / f"BFCL_v4_{stem}.json"
    entries = _read_jsonl(path)
    for entry in entries:  # a question of another shape crashed the split or the case (KeyError 0)
        question = entry.get("question")
        if not isinstance(question, list) or not all(isinstance(turn, list) for turn in question):
            raise DataError(f"{path}: case {entry.get('id')} has no 'question' list of turns")
    single = [e for e in entries if len(e.get("question") or []) == 1]
    if len(single) < len(entries):
        log.warning("%s: skipped %d multi-turn case(s)", path, len(entries) - len(single))
    in_split = split_entries(single, split, path)
    chosen = in_split if limit is None else in_split[:limit]
    answers: dict[str, Any] | None = None
    if "irrelevance" not in category:
        answer_path = data_dir / "possible_answer" / path.name
        answers = _read_answers(answer_path)
        if missing := [str(e["id"]) for e in chosen if str(e["id"]) not in answers]:
            raise DataError(f"{answer_path}: no answer for {missing[0]} ({len(missing)} case(s) without one)")
    return [_case(entry, category, answers, path) for entry in chosen]


def _read_answers(path: Path) -> dict[str, Any]:
    """Case id -> its ground truth, each checked to be BFCL's ``[{name: {param: [allowed]}}]``:
    an answer of another shape passed the loader and then, after all the generation, crashed the
    scoring or read as "no call expected" (``[]``), so a plain reply passed its case."""
    answers = {str(a["id"]): a.get("ground_truth") for a in _read_jsonl(path)}
    for case_id, truth in answers.items():
        if not isinstance(truth, list):
            raise DataError(f"{path}: answer {case_id} has no 'ground_truth' list of calls")
        if not truth:
            raise DataError(f"{path}: answer {case_id} has an empty 'ground_truth' (no call to expect)")
        for i, call in enumerate(truth):
            if problem := _call_problem(call):
                raise DataError(f"{path}: answer {case_id}, call {i}: {problem}")
    return answers


def _call_problem(call: Any) -> str | None:
    """What keeps ``call`` from being one expected call ``{name: {param: [allowed values]}}``."""
    if not isinstance(call, dict) or len(call) != 1:
        return "not an object of one function name ({name: {parameter: [allowed values]}})"
    name, allowed = next(iter(call.items()))
    if not isinstance(allowed, dict):
        return f"{name!r} maps to {type(allowed).__name__}, not an object of parameters"
    bad = next((key for key, values in allowed.items() if not isinstance(values, list)), None)
    return None if bad is None else f"{name!r}: parameter {bad!r} has no list of allowed values"


def _case(entry: dict[str, Any], category: str, answers: dict[str, Any] | None, path: Path) -> BfclCase:
    case_id = str(entry["id"])
    functions = entry.get("function")
    if not isinstance(functions, list):
        raise DataError(f"{path}: case {case_id} has no 'function' list")
    messages = list(entry["question"][0])
    # Either of another shape was a KeyError or AttributeError when the case was built or prompted.
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not all(isinstance(message.get(k), str) for k in _MESSAGE_KEYS):
            raise DataError(
                f"{path}: case {case_id}, message {i}: not an object with a 'role' and 'content' string"
            )
    for i, function in enumerate(functions):
        if problem := _function_problem(function):
            raise DataError(f"{path}: case {case_id}, function {i}: {problem}")
    truth = None if answers is None else answers[case_id]
    return BfclCase(case_id, category, messages, functions, truth)


def _function_problem(doc: Any) -> str | None:
    """What keeps ``doc`` from being a function doc that ``to_tool_schema`` and the checker read."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        return "not an object with a 'name' string"
    return _schema_problem(doc.get("parameters") or {}, "parameters")


def _schema_problem(schema: Any, where: str) -> str | None:
    if not isinstance(schema, dict):
        return f"{where} is not an object"
    properties = schema.get("properties")
    if properties is not None and not isinstance(properties, dict):
        return f"{where}.properties is not an object"
    subs = [(sub, f"{where}.properties.{key}") for key, sub in (properties or {}).items()]
    if isinstance(schema.get("items"), dict):  # other 'items' are left as they are by _schema
        subs.append((schema["items"], f"{where}.items"))
    return next((p for sub, at in subs if (p := _schema_problem(sub, at))), None)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: BFCL file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read BFCL file ({exc})") from None
    rows = []
    # "\n" only: str.splitlines() would also split on U+2028 and friends inside JSON strings.
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or "id" not in row:
            raise DataError(f"{path}:{lineno}: not a BFCL entry (a JSON object with an 'id')")
        rows.append(row)
    return rows


def to_tool_schema(function_doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc -> ``{name, description, parameters}`` with JSON-schema types.

    ``float`` -> ``number``, ``tuple`` -> ``array``, ``dict`` -> ``object`` (nested properties and
    items too); ``enum``, ``description``, ``default``, ``required`` and other keywords are kept,
    BFCL's own ``optional`` flag is dropped (``required`` already says it).
    """
    doc = copy.deepcopy(function_doc)
    params = doc.get("parameters") or {"type": "dict", "properties": {}}
    return {"name": doc["name"], "description": doc.get("description", ""), "parameters": _schema(params)}


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    out = {key: value for key, value in schema.items() if key != "optional"}
    out["type"] = _JSON_TYPES.get(str(schema.get("type")), "string")  # unknown types: string, as BFCL
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {key: _schema(sub) for key, sub in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = _schema(schema["items"])
    return out
