"""Two function-calling evaluations of the same cases, before and after: what changed, and whether
it is more than the noise of a small sample.

Each side is an ``eval.json`` written by ``hpcpipe eval function-calling`` (or the directory
holding it). The rates are recounted from the per-case results, so an ``eval.json`` written before
the intervals were stored compares as well. Per category and overall: the cases, the AST accuracy
before and after with Wilson 95% intervals (``hpcpipe.evaluate.intervals``), the difference, and a
verdict: ``real`` when the two intervals do not overlap, ``within noise`` when they do. Both runs
score the same cases, so non-overlap is a conservative test: a change it calls real is one; a
change within noise may still be real on more cases. Then every case whose AST check flipped.
Each side's decoding (free, or ``--constrain``) is reported: a comparison across the two measures
the decoding as well as the model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.evaluate.intervals import overlap, wilson
from hpcpipe.layout import RunLayout

METRIC = "ast_acc"  # the per-case flag behind it is ``ast``
REAL, NOISE = "real", "within noise"


def read_eval(path: Path) -> dict[str, Any]:
    """The ``eval.json`` at ``path`` (the file, or the output directory that holds it), checked to
    be a function-calling evaluation with per-case results (each with its reply; held-out ids
    ``heldout_<n>``) and its settings an object; UserError otherwise."""
    run = RunLayout(path)
    if run.config.is_file():
        hint = f"pass {run.fc_eval_dir(base=True)} or {run.fc_eval_dir(base=False)}"
        raise UserError(f"{path}: a run directory, not an evaluation ({hint})")
    file = path / RunLayout.FC_EVAL_JSON if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{file}: no such file (an evaluation's {RunLayout.FC_EVAL_JSON} or its directory)")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{file}: not readable as JSON ({exc})") from None
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not all(_is_case(c) for c in cases) or not cases:
        raise UserError(
            f"{file}: not a function-calling evaluation (no per-case results; "
            "write one with `hpcpipe eval function-calling`)"
        )
    # `eval decline` reads these after its model loaded (minutes): of another shape they were a
    # KeyError, a ValueError from int() or an AttributeError there.
    if data.get("meta") is not None and not isinstance(data["meta"], dict):
        raise UserError(f"{file}: 'meta' is not an object (the evaluation's settings)")
    for case in cases:
        if problem := _case_problem(case):
            raise UserError(f"{file}: case {case['id']} {problem}")
    return {**data, "path": str(file)}


def _is_case(case: Any) -> bool:
    return (
        isinstance(case, dict)
        and all(isinstance(case.get(k), str) for k in ("id", "category"))
        and isinstance(case.get("ast"), bool)
    )


def _case_problem(case: dict[str, Any]) -> str | None:
    if not isinstance(case.get("reply"), str):
        return "has no 'reply' string (the model's reply)"
    held_out = case["id"].removeprefix("heldout_")  # a run's held-out case: heldout_<its index>
    if held_out != case["id"] and not re.fullmatch("[0-9]+", held_out):
        return "is not a held-out case id (heldout_<number>)"
    return None


def compare_evals(base: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Base vs after (two ``read_eval`` results of the same cases): per-category and overall rows,
    and the cases that changed. UserError when the categories or their cases differ."""
    _check_heldout(base, after)
    before, now = _outcomes(base), _outcomes(after)
    if set(before) != set(now):
        raise UserError(_mismatch("categories", sorted(before), sorted(now)))
    for category in sorted(before):
        if set(before[category]) != set(now[category]):
            raise UserError(
                _mismatch(f"cases of {category}", sorted(before[category]), sorted(now[category]))
            )
    # (category, id) -> (passed before, passed after), in BASE's case order
    keys = dict.fromkeys((c["category"], c["id"]) for c in base["cases"])
    pairs = {(cat, case): (before[cat][case], now[cat][case]) for cat, case in keys}
    categories = {
        cat: _row(
            [b for (c, _), (b, _) in pairs.items() if c == cat],
            [a for (c, _), (_, a) in pairs.items() if c == cat],
        )
        for cat in sorted(before)
    }
    flipped: dict[str, list[str]] = {
        "passed_to_failed": [case for (_, case), (b, a) in pairs.items() if b and not a],
        "failed_to_passed": [case for (_, case), (b, a) in pairs.items() if a and not b],
    }
    return {
        "metric": METRIC,
        "base": base["path"],
        "after": after["path"],
        "categories": categories,
        "overall": _row([b for b, _ in pairs.values()], [a for _, a in pairs.values()]),
        "changed": flipped,
        "decoding": {"base": decoding(base), "after": decoding(after)},
    }


def _check_heldout(base: dict[str, Any], after: dict[str, Any]) -> None:
    """UserError when the two sides scored different held-out conversations: their cases are
    named ``heldout_<index>`` in each run, so the ids match while the conversations differ.
    Evaluations written before the hash was recorded (2026-12-05) are not checked."""
    hashes = [(side.get("meta") or {}).get("heldout_sha256") for side in (base, after)]
    if None not in hashes and hashes[0] != hashes[1]:
        raise UserError(
            f"{base['path']} and {after['path']} scored different held-out conversations under "
            "the same heldout_* ids (other runs' data); compare evaluations of one run's data, "
            "or pass --heldout-limit 0 to both"
        )


def decoding(data: dict[str, Any]) -> str:
    """How an evaluation decoded its replies: "constrained" (``--constrain``) or "free"."""
    meta = data.get("meta")
    return "constrained" if isinstance(meta, dict) and meta.get("constrained") else "free"


def _outcomes(data: dict[str, Any]) -> dict[str, dict[str, bool]]:
    """{category: {case id: AST check passed}} in file order."""
    table: dict[str, dict[str, bool]] = {}
    for case in data["cases"]:
        table.setdefault(case["category"], {})[case["id"]] = case["ast"]
    return table


def _mismatch(what: str, base: list[str], after: list[str]) -> str:
    only_base = [x for x in base if x not in after]
    only_after = [x for x in after if x not in base]
    parts = [
        f"only in BASE: {_few(only_base)}" if only_base else "",
        f"only in AFTER: {_few(only_after)}" if only_after else "",
    ]
    detail = "; ".join(p for p in parts if p)
    return (
        f"the two evaluations differ in {what} ({detail}); evaluate both with the same "
        "--split, --categories, --limit and --heldout-limit"
    )


def _few(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _row(before: list[bool], after: list[bool]) -> dict[str, Any]:
    n = len(before)  # the same cases on both sides
    old, new = wilson(sum(before), n), wilson(sum(after), n)

    def rate(flags: list[bool], ci: tuple[float, float]) -> dict[str, Any]:
        return {"passed": sum(flags), "acc": sum(flags) / n, "ci95": [round(ci[0], 6), round(ci[1], 6)]}

    return {
        "cases": n,
        "before": rate(before, old),
        "after": rate(after, new),
        "diff": (sum(after) - sum(before)) / n,
        "verdict": NOISE if overlap(old, new) else REAL,
    }
