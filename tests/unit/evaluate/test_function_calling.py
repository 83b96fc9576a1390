"""Replies -> calls, and a case's score: the call syntaxes read, invalid calls, BFCL's irrelevance
rule, held-out cases from conversations, the metrics and their table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.tokens import format_call
from hpcpipe.evaluate.calls import parse_reply
from hpcpipe.evaluate.function_calling import Case, heldout_case, markdown_table, score, summarize

WEATHER = {
    "name": "get_weather",
    "description": "Current weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city"],
    },
}


def test_every_call_syntax_is_read() -> None:
    hermes = parse_reply('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    glaive_quoted = parse_reply("""<functioncall> {"name": "f", "arguments": '{"q": "it's"}'}""")
    glaive_object = parse_reply('<functioncall> {"name": "f", "arguments": {"a": 1}} <|endoftext|>')
    bare = parse_reply('[{"name": "f", "arguments": {}}, {"name": "g", "arguments": "{}"}]')
    assert hermes.calls == [{"name": "f", "arguments": {"a": 1}}]
    assert glaive_quoted.calls == [{"name": "f", "arguments": {"q": "it's"}}]  # the apostrophe survives
    assert glaive_object.calls == [{"name": "f", "arguments": {"a": 1}}]
    assert [c["name"] for c in bare.calls] == ["f", "g"]
    prose = parse_reply("I'm sorry, I cannot book flights.")
    assert prose.valid and not prose.makes_call


def test_a_started_call_that_does_not_parse_is_invalid() -> None:
    for text in ('<tool_call>\n{"name": "f", "argu', "<tool_call>\n<tool_call>\n</tool_call>"):
        parsed = parse_reply(text)
        assert parsed.makes_call and not parsed.valid


def _conversation(*calls: ToolCall, tools: tuple[dict, ...] = (WEATHER,)) -> Conversation:  # type: ignore[type-arg]
    return Conversation(
        (Message("user", "Weather in Paris?"), Message("assistant", "", calls), Message("user", "thanks")),
        tools,
    )


def test_heldout_cases_take_the_first_assistant_turn_and_its_category() -> None:
    simple = heldout_case(_conversation(ToolCall("get_weather", {"city": "Paris"})), 0)
    assert simple is not None and simple.category == "heldout_simple"
    assert [m.role for m in simple.conversation.messages] == ["user"]  # the prompt stops before it
    assert simple.ground_truth == [{"get_weather": {"city": ["Paris"], "unit": [""]}}]
    two = (ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Rome"}))
    assert heldout_case(_conversation(*two), 1).category == "heldout_parallel"  # type: ignore[union-attr]
    refusal = heldout_case(_conversation(), 2)
    assert refusal is not None and refusal.category == "heldout_no_call" and refusal.ground_truth is None


def test_a_heldout_dict_argument_is_expected_as_given_at_every_depth() -> None:
    """{"tags": ["a", "b"]} was taken for BFCL's answer form (tags: "a" or "b"), so a reply
    repeating the reference failed with a value error."""
    array = {"type": "array", "items": {"type": "string"}}
    filters = {"type": "object", "properties": {"tags": array, "scope": {"type": "string"}}}
    rows = {"type": "array", "items": {"type": "object", "properties": {"tags": array}}}
    params = {"type": "object", "properties": {"filters": filters, "rows": rows}, "required": ["filters"]}
    tool = {"name": "search", "description": "", "parameters": params}
    given = {"filters": {"tags": ["a", "b"]}, "rows": [{"tags": ["c"]}, {"tags": []}]}
    case = heldout_case(_conversation(ToolCall("search", given), tools=(tool,)), 0)
    assert case is not None

    def reply(arguments: dict) -> str:  # type: ignore[type-arg]
        return format_call(ToolCall("search", arguments))

    same = score(case, reply(given))
    assert same["ast"] and same["exact"] and same["error"] is None
    for other in (
        {**given, "filters": {"tags": ["a"]}},  # one of the two tags
        {**given, "filters": {"tags": ["a", "b"], "scope": "x"}},  # a key the reference has not
        {**given, "rows": [{"tags": ["c"]}]},  # a row short
    ):
        assert score(case, reply(other))["error"] == "value_error", other


def _case(category: str, truth: list | None) -> Case:  # type: ignore[type-arg]
    functions = [{**WEATHER, "parameters": {**WEATHER["parameters"], "type": "dict"}}]
    return Case("c", category, category.removeprefix("live_"), Conversation(()), functions, truth)


def test_score_per_outcome() -> None:
    truth = [{"get_weather": {"city": ["Paris"], "unit": ["", "c"]}}]
    good = score(_case("simple", truth), '<tool_call>{"name": "get_weather", "arguments": {"city": "paris"}}')
    assert good["ast"] and good["decision"] and good["name"] and good["error"] is None
    assert not good["exact"]  # "paris" passes BFCL's normalised comparison, not the strict one
    wrong = score(_case("simple", truth), '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')
    assert wrong["decision"] and wrong["name"] and not wrong["ast"] and wrong["error"] == "value_error"
    silent = score(_case("simple", truth), "It is sunny.")
    assert not silent["decision"] and silent["error"] == "no_call"
    broken = score(_case("simple", truth), '<tool_call>{"name": "get_weather", ')
    assert not broken["parsed"] and broken["error"] == "invalid_call"


def test_name_accuracy_counts_an_unparsable_call_as_the_wrong_names() -> None:
    """A call that did not parse was left out of name_acc while a reply with no call counted as
    wrong, so a model writing broken calls read better than one writing none."""
    truth = [{"get_weather": {"city": ["Paris"]}}]
    good = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    rows = [score(_case("simple", truth), reply) for reply in (good, broken, broken, "It is sunny.")]
    assert [r["name"] for r in rows] == [True, False, False, False]
    assert summarize(rows)["overall"]["name_acc"] == 0.25
    assert score(_case("heldout_no_call", None), broken)["name"] is None  # no call wanted: no names


def test_a_dotted_function_called_with_underscores_has_the_right_name_as_it_passes_the_ast() -> None:
    """math.factorial called as math_factorial passed the AST check (BFCL's rule) but counted as
    the wrong name: name accuracy could fall below AST accuracy."""
    doc = {"name": "math.factorial", "parameters": {"type": "dict", "properties": {"n": {"type": "integer"}}}}
    case = Case("c", "simple", "simple", Conversation(()), [doc], [{"math.factorial": {"n": [5]}}])
    got = score(case, '<tool_call>{"name": "math_factorial", "arguments": {"n": 5}}')
    assert got["ast"] and got["name"]


def test_irrelevance_follows_bfcl_where_an_undecodable_reply_is_no_call() -> None:
    broken = '<tool_call>{"name": '
    assert score(_case("irrelevance", None), broken)["ast"]  # BFCL's rule for its categories
    assert not score(_case("heldout_no_call", None), broken)["ast"]  # ours: an attempted call is wrong
    called = score(_case("live_irrelevance", None), '<tool_call>{"name": "get_weather", "arguments": {}}')
    assert not called["ast"] and called["error"] == "unexpected_call"


def test_summary_and_table_count_errors_per_category() -> None:
    truth = [{"get_weather": {"city": ["Paris"]}}]
    rows = [
        score(_case("simple", truth), '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'),
        score(_case("simple", truth), "no"),
        score(_case("irrelevance", None), "no"),
    ]
    summary = summarize(rows)
    assert summary["categories"]["simple"]["ast_acc"] == 0.5
    assert summary["categories"]["simple"]["errors"] == {"no_call": 1}
    assert summary["overall"]["cases"] == 3 and abs(summary["overall"]["ast_acc"] - 2 / 3) < 1e-9
    table = markdown_table(summary, {"model": "m"})
    assert "| simple | 2 |" in table and "no_call 1" in table and "**overall**" in table
    assert summary["overall"]["call_auc"] is None  # no p_call recorded: nothing to rank


def test_call_auc_ranks_the_cases_that_want_a_call_above_the_others() -> None:
    from hpcpipe.evaluate.function_calling import call_auc

    def row(expects: bool, p: float) -> dict[str, object]:
        return {"expects_call": expects, "p_call": p}

    # Pairs (want, avoid): 0.9>0.7, 0.9>0.1, 0.6<0.7, 0.6>0.1: three of four ranked right.
    rows = [row(True, 0.9), row(True, 0.6), row(False, 0.7), row(False, 0.1)]
    assert call_auc(rows) == 0.75
    assert call_auc([row(True, 0.5), row(False, 0.5)]) == 0.5  # a tie counts one half
    assert call_auc([row(True, 0.2), row(False, 0.1)]) == 1.0
    assert call_auc([row(True, 0.2)]) is None  # one kind only
    summary = summarize([{**r, "category": "c", "parsed": True, "decision": True, "name": None,
                          "ast": True, "exact": True, "error": None} for r in rows])  # fmt: skip
    table = markdown_table(summary, {"model": "m", "call_threshold": 0.7})
    assert "ROC AUC 0.750" in table and "P(call) >= 0.7" in table
    # The threshold sets the first token only: the table said every reply called exactly so.
    assert "opens with a call when P(call) >= 0.7" in table and "may still call after it" in table


def _fc_run(root: Path, meta: dict[str, object]) -> Any:
    """A run directory with its adapter and an evaluation in RUN/eval whose eval.json has ``meta``."""
    from hpcpipe.layout import RunLayout

    run = RunLayout(root)
    run.adapter.mkdir(parents=True)
    run.config.write_text("run: {}\n")
    (run.adapter / "adapter_config.json").write_text("{}")
    (run.adapter / "adapter_model.safetensors").write_bytes(b"weights")
    _write_eval(run.fc_eval_dir(False, False), meta)
    return run


def _write_eval(folder: Path, meta: dict[str, object]) -> None:
    from hpcpipe.evaluate.function_calling import write_report

    rows = [score(Case("heldout_0", "heldout_no_call", "irrelevance", Conversation(()), [], None), "No.")]
    write_report(summarize(rows), rows, meta, folder)


def _fc_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], target: Path, *args: str
) -> str:
    """`hpcpipe eval function-calling TARGET --categories '' ARGS`, stopped where the model would
    load: its one error line ("the model loaded" when nothing refused it)."""
    import hpcpipe.cli.evaluate as evaluate_cli
    from hpcpipe.cli.app import main
    from hpcpipe.errors import UserError

    def loaded(*_: object) -> None:
        raise UserError("the model loaded")

    monkeypatch.setattr(evaluate_cli, "load_target", loaded)
    monkeypatch.setattr(
        sys, "argv", ["hpcpipe", "eval", "function-calling", str(target), "--categories", "", *args]
    )
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    return err


def test_a_smoke_run_does_not_replace_an_evaluation_written_with_other_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--limit 5 wrote over RUN/eval/eval.json, the full evaluation eval decline judges by default."""
    meta = {"split": "dev", "heldout_limit": 100, "call_threshold": None, "constrained": False,
            "call_decision": "greedy", "call_threshold_option": "auto"}  # fmt: skip
    run = _fc_run(tmp_path / "run", meta)

    def cli(*args: str) -> str:
        return _fc_cli(monkeypatch, capsys, run.root, *args)

    refused = cli("--heldout-limit", "5")
    assert (
        f"{run.fc_eval_dir(False, False) / 'eval.json'}: an evaluation written with other --heldout-limit"
        in refused
    )
    assert "pass --out" in refused
    assert "--call-threshold" in cli("--call-threshold", "0.5")
    assert "--call-threshold" in cli("--call-threshold", "greedy")
    assert "the model loaded" in cli("--heldout-limit", "5", "--overwrite")
    assert "the model loaded" in cli("--heldout-limit", "5", "--out", str(tmp_path / "smoke"))
    assert "the model loaded" in cli()  # the same settings: evaluated again in place


def test_an_evaluation_is_replaced_where_the_options_given_are_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused though no option changed: auto after training calibrated again (the threshold it
    resolves to compared), an eval.json from before --split (read as --split all), and a .gguf
    file's --heldout-limit (it has no held-out conversations)."""
    from hpcpipe.evaluate.calibrate import Calibration, adapter_sha256

    dev = {"split": "dev", "heldout_limit": 100, "constrained": False}
    run = _fc_run(tmp_path / "run", {**dev, "call_threshold": 0.3, "call_decision": "calibrated"})
    Calibration(0.6, 0.95, 10, 1, {}, adapter_sha256=adapter_sha256(run.adapter)).save(run.adapter)
    assert "the model loaded" in _fc_cli(monkeypatch, capsys, run.root)  # trained and calibrated again
    assert "--call-threshold" in _fc_cli(monkeypatch, capsys, run.root, "--call-threshold", "0.3")
    _write_eval(
        run.fc_eval_dir(False, False), {**dev, "call_threshold": 0.6, "call_threshold_option": "auto"}
    )
    assert "the model loaded" in _fc_cli(monkeypatch, capsys, run.root)
    # As the committed benchmarks/results/lora-fc-sweep/base/eval.json: before --split and the rest.
    old = {"model": "m.gguf", "adapter": None, "cases": 1, "generate_s": 1.0, "max_new_tokens": 256}
    _write_eval(run.fc_eval_dir(False, False), old)
    assert "the model loaded" in _fc_cli(monkeypatch, capsys, run.root)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)  # its default output: ./eval
    _write_eval(tmp_path / "eval", {**dev, "call_threshold": None, "call_threshold_option": "auto"})
    assert "the model loaded" in _fc_cli(monkeypatch, capsys, gguf, "--heldout-limit", "5")
    assert "--call-threshold" in _fc_cli(monkeypatch, capsys, gguf, "--call-threshold", "greedy")
