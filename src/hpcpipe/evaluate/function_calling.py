"""Function-calling evaluation: cases -> generated replies -> scores per category -> eval.json + eval.md.

A case is a conversation up to the assistant turn to write, the functions on offer and the
expected calls in BFCL's answer form (``[{name: {param: [allowed values]}}]``, ``""`` meaning the
parameter may be left out; None: no call is expected). Cases come from BFCL's own test files
(``hpcpipe.evaluate.bfcl``) and from a run's held-out conversations (``heldout_*`` categories).

Metrics per category and overall:
- ``parse_rate``: replies whose attempted calls all parse (a reply without a call parses);
- ``decision_acc``: call / no-call decided as expected;
- ``name_acc``: among cases expecting calls, the called function names equal the expected ones
  (a reply without a call, or whose call does not parse, has the wrong names);
- ``ast_acc``: BFCL's AST check passes (``hpcpipe.evaluate.ast_checker``), with ``ast_ci95``, its
  Wilson 95% interval (``hpcpipe.evaluate.intervals``): at 20 cases a category's accuracy is known to
  within about 20 points either way;
- ``exact``: strict exact match (every argument equals the first allowed value);
- ``call_auc`` (overall): how well P(call) at the first token ranks the cases that want a call
  above those that want none (ROC AUC), whatever the threshold greedy decoding puts between them.
Errors are counted by type (wrong name, missing required, unexpected parameter, type error,
value error, wrong count, unexpected call, no call, invalid call).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.data.function_calling.conversation import Conversation, Message
from hpcpipe.evaluate.calls import parse_reply
from hpcpipe.evaluate.intervals import wilson
from hpcpipe.layout import RunLayout

_BFCL_TYPES = {"object": "dict", "number": "float"}  # JSON schema -> BFCL's python-ish names


@dataclass(frozen=True)
class Case:
    id: str
    category: str  # reported category (bfcl name or heldout_*)
    check_category: str  # the BFCL rule set it is scored with
    conversation: Conversation  # messages before the assistant turn, and the tools
    functions: list[dict[str, Any]]  # BFCL-style docs for the checker
    ground_truth: list[dict[str, Any]] | None


def bfcl_doc(tool: dict[str, Any]) -> dict[str, Any]:
    """A JSON-schema function -> BFCL's doc form (types ``dict``/``float``), for the checker."""

    def convert(schema: dict[str, Any]) -> dict[str, Any]:
        out = dict(schema)
        out["type"] = _BFCL_TYPES.get(str(schema.get("type", "string")), schema.get("type", "string"))
        if "properties" in schema:
            out["properties"] = {k: convert(v) for k, v in schema["properties"].items()}
        if isinstance(schema.get("items"), dict):
            out["items"] = convert(schema["items"])
        return out

    params = tool.get("parameters") or {"type": "object", "properties": {}}
    return {**tool, "parameters": convert(params)}


def heldout_case(conv: Conversation, index: int) -> Case | None:
    """The first assistant turn of a held-out conversation as a case (None without one)."""
    turn = next((i for i, m in enumerate(conv.messages) if m.role == "assistant"), None)
    if turn is None:
        return None
    calls = conv.messages[turn].tool_calls
    prompt = Conversation(conv.messages[:turn], conv.tools, source=conv.source)
    functions = [bfcl_doc(t) for t in conv.tools]
    if not calls:
        return Case(f"heldout_{index}", "heldout_no_call", "irrelevance", prompt, functions, None)
    truth = [{c.name: _allowed(c.arguments, conv.tools, c.name)} for c in calls]
    shape = (
        ("parallel" if len(calls) > 1 else "simple")
        if len(conv.tools) <= 1
        else ("parallel_multiple" if len(calls) > 1 else "multiple")
    )
    return Case(f"heldout_{index}", f"heldout_{shape}", shape, prompt, functions, truth)


def _allowed(arguments: dict[str, Any], tools: tuple[dict[str, Any], ...], name: str) -> dict[str, list[Any]]:
    """Expected values: each given argument exactly; every other declared parameter may be omitted."""
    tool = next((t for t in tools if t.get("name") == name), {})
    declared = (tool.get("parameters") or {}).get("properties", {})
    allowed: dict[str, list[Any]] = {key: [""] for key in declared}
    allowed.update({key: [_answer_form(value)] for key, value in arguments.items()})
    return allowed


def _answer_form(value: Any) -> Any:
    """A literal argument value in BFCL's answer form at every depth: each dict key maps to its
    allowed values (the one given). Left literal, a dict whose values are all lists, such as
    {"tags": ["a", "b"]}, reads as allowed values (["a", "b"]: "a" or "b") and the reference fails."""
    if isinstance(value, dict):
        return {key: [_answer_form(item)] for key, item in value.items()}
    if isinstance(value, list):
        return [_answer_form(item) for item in value]
    return value


def bfcl_case(case: Any) -> Case:
    """A ``BfclCase`` -> a Case (its messages become the conversation; tools as JSON schemas)."""
    from hpcpipe.evaluate.bfcl import to_tool_schema

    messages = tuple(Message(m["role"], m["content"]) for m in case.messages)
    tools = tuple(to_tool_schema(f) for f in case.functions)
    base = case.category.removeprefix("live_")
    return Case(
        case.id, case.category, base, Conversation(messages, tools), case.functions, case.ground_truth
    )


def score(case: Case, reply: str) -> dict[str, Any]:
    """One case's outcome: which metrics it passes and its error type (None when correct)."""
    from hpcpipe.evaluate.ast_checker import check_calls, strict_match

    parsed = parse_reply(reply)
    expects = case.ground_truth is not None
    result: dict[str, Any] = {
        "id": case.id,
        "category": case.category,
        "expects_call": expects,
        "parsed": parsed.valid,
        "decision": parsed.makes_call == expects,
        "name": None,
        "ast": False,
        "exact": False,
        "error": None,
        "reply": reply,
    }
    if not parsed.valid:
        if not expects and case.category.endswith("irrelevance"):
            # BFCL's irrelevance rule: a reply that does not decode into a call is no call. Its
            # own categories only, by design: heldout_no_call (checked as irrelevance too) counts
            # an opened call as the wrong decision (docs/function-calling-eval.md, Evaluation).
            result.update(decision=True, ast=True, exact=True)
            return result
        # Counted against the names: left out, a broken call read better than no call at all.
        result.update(error="invalid_call", name=False if expects else None)
        return result
    if expects:  # a dotted name (math.factorial) may be called as math_factorial, as the AST check allows
        want = sorted(next(iter(g)).replace(".", "_") for g in case.ground_truth or [])
        result["name"] = sorted(c["name"].replace(".", "_") for c in parsed.calls) == want
    check = check_calls(parsed.calls, case.functions, case.ground_truth, case.check_category)
    result["ast"] = check.valid
    result["error"] = check.error_type
    result["exact"] = check.valid and (not expects or strict_match(parsed.calls, case.ground_truth or []))
    return result


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics per category and overall, with error types counted."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        groups[r["category"]].append(r)
    table = {cat: _metrics(rows) for cat, rows in sorted(groups.items())}
    return {"categories": table, "overall": {**_metrics(results), "call_auc": call_auc(results)}}


def call_auc(results: list[dict[str, Any]]) -> float | None:
    """ROC AUC of P(call) at the reply's first token (``p_call``), cases that want a call against
    cases that want none: the chance that a random one of the first is surer to call than a random
    one of the second (1.0: some threshold separates them all). None without both kinds."""
    scored = [r for r in results if r.get("p_call") is not None]
    want = [r["p_call"] for r in scored if r["expects_call"]]
    avoid = [r["p_call"] for r in scored if not r["expects_call"]]
    if not want or not avoid:
        return None
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu(want, avoid, alternative="two-sided").statistic  # ties count one half
    return round(float(u) / (len(want) * len(avoid)), 6)


def _metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = max(len(rows), 1)
    named = [r for r in rows if r["name"] is not None]
    passed = sum(bool(r["ast"]) for r in rows)
    return {
        "cases": len(rows),
        "parse_rate": sum(r["parsed"] for r in rows) / n,
        "decision_acc": sum(r["decision"] for r in rows) / n,
        "name_acc": (sum(bool(r["name"]) for r in named) / len(named)) if named else None,
        "ast_acc": passed / n,
        "ast_ci95": [round(bound, 6) for bound in wilson(passed, len(rows))],
        "exact": sum(r["exact"] for r in rows) / n,
        "errors": dict(sorted(Counter(r["error"] for r in rows if r["error"]).items())),
    }


def write_report(
    summary: dict[str, Any], results: list[dict[str, Any]], meta: dict[str, Any], out: Path
) -> None:
    """``eval.json`` (metrics, settings, every case's reply) and ``eval.md`` (the tables)."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, **summary, "cases": results}
    (out / RunLayout.FC_EVAL_JSON).write_text(json.dumps(payload, indent=2, ensure_ascii=False) + "\n")
    (out / RunLayout.FC_EVAL_MARKDOWN).write_text(markdown_table(summary, meta))


def markdown_table(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    def interval(m: dict[str, Any]) -> str:
        low, high = m["ast_ci95"]
        return f"{pct(m['ast_acc'])} [{100 * low:.0f}, {100 * high:.0f}]"

    lines = [
        f"# Function-calling evaluation: {meta.get('model', '')}",
        "",
        "| category | cases | parse | call/no-call | name | AST (95% CI) | exact | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = [*summary["categories"].items(), ("**overall**", summary["overall"])]
    for cat, m in rows:
        errors = ", ".join(f"{k} {v}" for k, v in m["errors"].items()) or "-"
        lines.append(
            f"| {cat} | {m['cases']} | {pct(m['parse_rate'])} | {pct(m['decision_acc'])} | "
            f"{pct(m['name_acc'])} | {interval(m)} | {pct(m['exact'])} | {errors} |"
        )
    auc = summary["overall"].get("call_auc")
    if auc is not None:
        lines += ["", f"Call/no-call separation: ROC AUC {auc:.3f} (P(call) at each reply's first token)."]
    if meta.get("constrained"):
        lines += [
            "",
            "Calls decoded under each case's function schemas (--constrain, XGrammar): names on "
            "offer, required keys, types and enums; whether to call and the values are the model's.",
        ]
    if rule := meta.get("decline"):
        threshold = rule["threshold"]
        below = "none (the first token declined enough)" if threshold is None else f"{threshold:.6f}"
        lines += [
            "",
            f"Calls declined after they were written ({rule['declined']}): log P(call) + "
            f"{rule['weight']:g} x the call's mean token log-prob below {below}, the threshold "
            f"at which {rule['target']:g} of {rule['cases']} generated near misses decline.",
        ]
    if meta.get("call_threshold") is not None:
        how = "calibrated after training" if meta.get("call_decision") == "calibrated" else "given"
        lines += [
            "",
            f"Call or no call decided by a threshold ({how}): "
            f"a reply opens with a call when P(call) >= {meta['call_threshold']} (one that "
            "opens with text may still call after it).",
        ]
    return "\n".join(lines) + "\n"
