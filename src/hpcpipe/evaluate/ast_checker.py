"""Score predicted function calls by the rules of BFCL's AST check (Berkeley Function Calling Leaderboard).

Predicted calls are ``{"name": str, "arguments": dict}``. The ground truth is BFCL's answer form,
``[{func_name: {param: [allowed values]}}]``; ``""`` among the allowed values means the parameter
may be left out. A call passes when, in this order:

1. its name is the expected one, or that name with every ``.`` replaced by ``_`` (BFCL accepts
   the form that APIs which forbid dots in names force on a model);
2. every parameter the function doc requires is given;
3. each given parameter (in the call's order) is one of the doc's properties *and* of the answer's;
   it has the doc's type (``integer`` is an int and not a bool, ``float`` also takes an int,
   ``array``/``tuple`` items are checked against ``items``, a ``dict``'s keys against its
   ``properties`` when the answer is a dict, ``any`` takes anything), unless its type is that of
   the answer's first value (BFCL's "variable" rule: the answer beats the doc); and its value is
   among the allowed ones: strings compared case-insensitively without spaces and ``,./-_*^``,
   lists item by item, dicts key by key, each recursively;
4. every parameter of the answer that is left out has ``""`` among its allowed values.

Deliberate differences from BFCL: no Java/JavaScript type conversion; nested types and nested
values are checked at every depth, not one level, and ``float`` takes an int at every depth;
parallel calls are matched by trying every assignment rather than BFCL's greedy first match, so a
case passes whenever some one-to-one pairing of calls and answers exists.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

ERROR_TYPES = (
    "wrong_count",
    "wrong_name",
    "missing_required",
    "unexpected_parameter",
    "type_error",
    "value_error",
    "unexpected_call",
    "no_call",
)

# BFCL's python-ish type names; "number"/"object" as well, for docs converted back from JSON schema.
_PY_TYPES: dict[str, type] = {
    "integer": int,
    "float": float,
    "number": float,
    "string": str,
    "boolean": bool,
    "array": list,
    "tuple": list,  # JSON has no tuples: a tuple arrives as a list
    "dict": dict,
    "object": dict,
}
_TYPE_NAMES = {str: "string", int: "integer", float: "float", bool: "boolean", list: "array", dict: "dict"}
_IGNORED = re.compile(r"[ ,./\-_*^]")  # BFCL's standardize_string: "April 1, 2024" == "april 1 2024"


@dataclass(frozen=True)
class CheckResult:
    valid: bool
    error_type: str | None  # one of ERROR_TYPES, None when valid
    detail: str  # one sentence naming the function / parameter; "" when valid


_OK = CheckResult(True, None, "")


def _fail(error_type: str, detail: str) -> CheckResult:
    return CheckResult(False, error_type, detail)


def check_calls(
    predicted: list[dict[str, Any]],
    functions: list[dict[str, Any]],
    ground_truth: list[dict[str, Any]] | None,
    category: str,
) -> CheckResult:
    """BFCL's AST verdict on ``predicted`` for a case of ``category``; the first error found, if any.

    No ground truth, or an ``irrelevance`` category: valid iff no call is made. ``parallel``
    categories expect one call per answer, in any order; the others expect exactly one call.
    """
    if not ground_truth or "irrelevance" in category:
        if predicted:
            return _fail("unexpected_call", f"no call was expected, got one to {predicted[0].get('name')!r}.")
        return _OK
    if not predicted:
        return _fail("no_call", f"expected a call to {_answer_name(ground_truth[0])!r}, got no call.")
    want = len(ground_truth) if "parallel" in category else 1
    if len(predicted) != want:
        return _fail("wrong_count", f"expected {want} call(s), got {len(predicted)}.")
    if want == 1:
        return _check_call(predicted[0], functions, ground_truth[0])
    return _check_parallel(predicted, functions, ground_truth)


def _check_parallel(
    predicted: list[dict[str, Any]], functions: list[dict[str, Any]], ground_truth: list[dict[str, Any]]
) -> CheckResult:
    table = [[_check_call(call, functions, answer) for call in predicted] for answer in ground_truth]
    if _assignable([[r.valid for r in row] for row in table]):
        return _OK
    for row in table:
        if not any(r.valid for r in row):
            # The most telling error: from a call with the right name, if the model made one.
            return next((r for r in row if r.error_type != "wrong_name"), row[0])
    return _fail("value_error", "the calls cannot be paired one-to-one with the expected calls.")


def _assignable(ok: list[list[bool]]) -> bool:
    """Whether each row i can take a distinct column j with ok[i][j]: bipartite matching (Kuhn).

    Augmenting paths rather than plain backtracking, which is factorial when no matching exists.
    """
    owner: dict[int, int] = {}  # column -> the row holding it

    def augment(i: int, seen: set[int]) -> bool:
        for j, good in enumerate(ok[i]):
            if good and j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    return all(augment(i, set()) for i in range(len(ok)))


def _answer_name(answer: dict[str, Any]) -> str:
    return next(iter(answer))


def _same_name(got: str, want: str) -> bool:
    return got in (want, want.replace(".", "_"))


def _find_doc(functions: list[dict[str, Any]], name: str, allowed: dict[str, list[Any]]) -> dict[str, Any]:
    doc = next((f for f in functions if f.get("name") == name), None)
    if doc is not None:
        return doc
    # No doc for the expected function (a held-out conversation may call an undeclared one):
    # check against the answer alone rather than failing every call.
    return {"name": name, "parameters": {"properties": {k: {"type": "any"} for k in allowed}, "required": []}}


def _check_call(call: dict[str, Any], functions: list[dict[str, Any]], answer: dict[str, Any]) -> CheckResult:
    name = _answer_name(answer)
    allowed: dict[str, list[Any]] = answer[name]
    if not _same_name(str(call.get("name")), name):
        return _fail("wrong_name", f"expected a call to {name!r}, got {call.get('name')!r}.")
    params = _find_doc(functions, name, allowed).get("parameters") or {}
    props: dict[str, Any] = params.get("properties") or {}
    args: dict[str, Any] = call.get("arguments") or {}
    for key in params.get("required") or []:
        if key not in args:
            return _fail("missing_required", f"{name}: required parameter {key!r} is missing.")
    for key, value in args.items():
        result = _check_arg(name, key, value, props.get(key), allowed.get(key))
        if not result.valid:
            return result
    for key, values in allowed.items():
        if key not in args and "" not in values:
            return _fail("missing_required", f"{name}: parameter {key!r} is missing and this case needs it.")
    return _OK


def _check_arg(
    fn: str, key: str, value: Any, schema: dict[str, Any] | None, values: list[Any] | None
) -> CheckResult:
    if schema is None:
        return _fail("unexpected_parameter", f"{fn}: {key!r} is not one of its parameters.")
    if values is None:
        return _fail("unexpected_parameter", f"{fn}: parameter {key!r} is not expected in this case.")
    reason = _type_mismatch(value, schema, values)
    if reason is not None:
        return _fail("type_error", f"{fn}: parameter {key!r} {reason}.")
    if not _value_ok(value, schema, values):
        return _fail("value_error", f"{fn}: parameter {key!r} = {_short(value)} not in {_short(values)}.")
    return _OK


# ---- types -------------------------------------------------------------------------------------


def _answer_type(answers: list[Any]) -> type | None:
    """The type of the first allowed value that is not the "may be omitted" marker."""
    return next((type(a) for a in answers if not _is_blank(a)), None)


def _type_mismatch(value: Any, schema: dict[str, Any], answers: list[Any]) -> str | None:
    """None when ``value`` has the declared type (or the answer's); else what is wrong."""
    declared = str(schema.get("type", "any"))
    expected = _PY_TYPES.get(declared)
    if expected is None:  # "any", and types we do not know, take anything
        return None
    # type() rather than isinstance(): a bool is not an integer. An int may stand for a float.
    if type(value) is expected or (expected is float and type(value) is int):
        return _inner_mismatch(value, schema, answers)
    if type(value) is _answer_type(answers):
        return None  # BFCL's "variable" rule
    return f"should be {declared}, got {_TYPE_NAMES.get(type(value), type(value).__name__)}"


def _inner_mismatch(value: Any, schema: dict[str, Any], answers: list[Any]) -> str | None:
    """Items of an array against ``items``, keys of a dict against ``properties``.

    Each allowed value of the same shape supplies the answers for the variable rule one level
    down; the value passes if it fits any of them (BFCL's nested check, made recursive).
    """
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        lists = [a for a in answers if isinstance(a, list)] or [[]]
        reasons = [_first(_item_reasons(value, schema["items"], alt)) for alt in lists]
    elif isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        dicts = [a for a in answers if isinstance(a, dict)]
        reasons = [_first(_key_reasons(value, schema["properties"], alt)) for alt in dicts]
    else:
        return None
    return None if not reasons or None in reasons else reasons[0]


def _item_reasons(value: list[Any], items: dict[str, Any], alt: list[Any]) -> Iterable[str | None]:
    for i, item in enumerate(value):
        reason = _type_mismatch(item, items, alt)
        yield None if reason is None else f"item {i} {reason}"


def _key_reasons(value: dict[str, Any], props: dict[str, Any], alt: dict[str, Any]) -> Iterable[str | None]:
    for key, item in value.items():
        if key in props:  # unknown keys are a value error, reported by the value check
            reason = _type_mismatch(item, props[key], _allowed_in(alt, key))
            yield None if reason is None else f"key {key!r} {reason}"


def _first(reasons: Iterable[str | None]) -> str | None:
    return next((r for r in reasons if r is not None), None)


# ---- values ------------------------------------------------------------------------------------


def _is_answer_dict(answer: dict[str, Any]) -> bool:
    """A dict answer normally maps each key to its allowed values; a plain literal dict does not."""
    return all(isinstance(v, list) for v in answer.values())


def _allowed_in(answer: dict[str, Any], key: str) -> list[Any]:
    if _is_answer_dict(answer):
        return list(answer.get(key, []))
    return [answer[key]] if key in answer else []


def _value_ok(value: Any, schema: dict[str, Any], values: list[Any]) -> bool:
    expected = _PY_TYPES.get(str(schema.get("type", "any")))
    answer_type = _answer_type(values)
    if expected is not None and answer_type is not None and answer_type is not expected:
        return value in values  # a "variable" answer: BFCL compares it as is, without normalising
    return any(_equal(value, answer) for answer in values)


def _normalise(text: str) -> str:
    return _IGNORED.sub("", text).lower().replace("'", '"')


def _equal(value: Any, answer: Any) -> bool:
    """BFCL's lenient equality of one value with one allowed value."""
    if isinstance(answer, dict):
        if not isinstance(value, dict):
            return False
        if not _is_answer_dict(answer):
            return value.keys() == answer.keys() and all(_equal(value[k], answer[k]) for k in answer)
        if not set(value) <= set(answer):
            return False
        return all(
            any(_equal(value[k], a) for a in allowed) if k in value else "" in allowed
            for k, allowed in answer.items()
        )
    if isinstance(answer, list):
        return isinstance(value, list) and len(value) == len(answer) and all(map(_equal, value, answer))
    if isinstance(answer, str):
        return isinstance(value, str) and _normalise(value) == _normalise(answer)
    return bool(value == answer)  # numbers as in Python: 5 == 5.0


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- exact match -------------------------------------------------------------------------------


def expected_calls(ground_truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The canonical calls of an answer: each parameter at its first allowed value.

    Parameters whose first allowed value is ``""`` are left out; dict answers are collapsed the
    same way, key by key.
    """
    pairs = [next(iter(entry.items())) for entry in ground_truth]
    return [{"name": name, "arguments": _first_values(params)} for name, params in pairs]


def _first_values(allowed: dict[str, list[Any]]) -> dict[str, Any]:
    return {key: _canonical(vals[0]) for key, vals in allowed.items() if vals and not _is_blank(vals[0])}


def _is_blank(value: Any) -> bool:
    return isinstance(value, str) and value == ""


def _canonical(answer: Any) -> Any:
    if isinstance(answer, dict):
        if _is_answer_dict(answer):
            return _first_values(answer)
        return {key: _canonical(value) for key, value in answer.items()}
    if isinstance(answer, list):
        return [_canonical(a) for a in answer]
    return answer


def strict_match(predicted: list[dict[str, Any]], ground_truth: list[dict[str, Any]]) -> bool:
    """Exact match: the predicted calls are ``expected_calls(ground_truth)``, in any order.

    Every call has the expected name (or its ``.``→``_`` form, as in the AST check) and exactly
    the canonical arguments: the same keys, strings identical (no normalisation), numbers equal in
    value (JSON has one number type: 5 == 5.0), booleans only equal booleans, lists in order.
    """
    want = expected_calls(ground_truth)
    if len(predicted) != len(want):
        return False
    ok = [
        [
            _same_name(str(p.get("name")), w["name"]) and _same(p.get("arguments"), w["arguments"])
            for p in predicted
        ]
        for w in want
    ]
    return _assignable(ok)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)
