"""hpcpipe.evaluate.decline: the threshold, the near misses it is set on, the score of a call, and
calls withdrawn below the threshold (scored again)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, Message
from hpcpipe.data.function_calling.generator import generate_conversations
from hpcpipe.evaluate import decline
from hpcpipe.evaluate.decline import DeclineRule, apply_decline, field_near_misses, read_decline, threshold_at
from hpcpipe.evaluate.function_calling import Case, score


def test_the_threshold_makes_the_target_share_of_all_near_misses_decline() -> None:
    calls = [-3.0, -2.0, -1.0, 0.0]  # 4 of 10 near misses called; 6 declined at the first token
    # 0.8: 8 of 10 must decline, 2 of the calls: those below -1.0.
    assert threshold_at(calls, 6, 0.8) == -1.0
    assert threshold_at(calls, 6, 0.6) is None  # the first token already declines 6 of 10
    above_all = threshold_at(calls, 6, 1.0)
    assert above_all is not None and 0.0 < above_all < 1e-300  # every call declines
    with pytest.raises(ValueError):
        threshold_at(calls, 6, 0.0)


def test_a_rule_declines_below_its_threshold_and_is_read_back(tmp_path: Path) -> None:
    rule = DeclineRule(-1.5, 4.0, 0.95, 100, 16, 104_729)
    assert rule.declines(-1.6) and not rule.declines(-1.5)
    assert not DeclineRule(None, 4.0, 0.5, 100, 3, 1).declines(-1e9)
    assert read_decline(tmp_path) is None
    rule.save(tmp_path)
    assert read_decline(tmp_path) == rule
    # A rule saved before `constrained` was recorded reads as constrained (they all were).
    (tmp_path / "decline.json").write_text(
        '{"threshold": -1.0, "weight": 4.0, "target": 0.95, "cases": 100, "calling": 16, "seed": 104729}'
    )
    old = read_decline(tmp_path)
    assert old is not None and old.constrained


def test_near_misses_are_generated_refusals_cut_before_the_reply() -> None:
    mix = SyntheticMix()
    near = field_near_misses(30, 5, mix)
    refusals = {s: 0.0 for s in SHAPE_FIELDS} | {"refusal": 1.0, "near_misses": 1.0}
    full = generate_conversations(30, 5, mix.model_copy(update=refusals))
    assert [c.messages for c in near] == [c.messages[:2] for c in full]
    assert [c.tools for c in near] == [c.tools for c in full]
    assert all(not any(m.tool_calls for m in c.messages) and c.tools for c in full)
    assert [m.role for m in near[0].messages] == ["system", "user"]
    assert field_near_misses(30, 6, mix) != near  # seeded


def test_the_score_is_log_p_call_plus_the_weighted_mean_token_log_prob() -> None:
    assert decline.decline_score(0.5, [-1.0, -3.0], 4.0) == pytest.approx(math.log(0.5) - 8.0)
    assert decline.decline_score(0.0, [0.0], 1.0) == pytest.approx(math.log(1e-9))


def test_call_log_probs_are_the_model_s_own_token_log_probs(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from hpcpipe.models.hf_lm import ModelSource, load_base_model
    from hpcpipe.models.tiny_lm import tiny_llama_dir

    path = tiny_llama_dir(tmp_path, ["def f(x): return x + 1"] * 40, seed=0)
    model = load_base_model(ModelSource(str(path), None), "fp32")
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompt, reply = "def f(x):", " return x + 1"
    got = decline.call_log_probs(model, tokenizer, prompt, reply)
    ids = tokenizer(prompt + reply, add_special_tokens=False, return_tensors="pt")["input_ids"]
    head_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    tail_ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    assert ids[0].tolist() == head_ids + tail_ids  # the reply's tokens are the same either way
    n_reply = len(tail_ids)
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss  # mean over every predicted token
    full = -loss.item() * (ids.shape[1] - 1)
    head = ids[:, : ids.shape[1] - n_reply]
    with torch.no_grad():
        head_loss = model(input_ids=head, labels=head).loss.item() * (head.shape[1] - 1)
    assert len(got) == n_reply and sum(got) == pytest.approx(full + head_loss, abs=1e-3)


class _Chat:
    tokenizer = None

    def prompt(self, conv: Conversation, upto: int) -> str:
        return conv.messages[-1].content


CALL = '<tool_call>\n{"name": "area", "arguments": {"r": 2}}\n</tool_call>'
PARAMETERS = {"type": "dict", "properties": {"r": {"type": "integer"}}, "required": ["r"]}
FUNCS = [{"name": "area", "description": "", "parameters": PARAMETERS}]


def _case(id_: str, category: str, truth: Any) -> Case:
    conv = Conversation((Message("user", id_),), ())
    return Case(id_, category, category.removeprefix("live_"), conv, FUNCS, truth)


def test_calls_below_the_threshold_become_declines_scored_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # the mean token log-prob of each case's call, keyed by its prompt (the case id)
    means = {"sure": -0.1, "unsure": -2.0, "irrelevant": -2.0}
    monkeypatch.setattr(decline, "call_log_probs", lambda _m, _t, prompt, _r: [means[prompt]])
    cases = [
        _case("sure", "simple", [{"area": {"r": [2]}}]),
        _case("unsure", "simple", [{"area": {"r": [2]}}]),
        _case("irrelevant", "irrelevance", None),
        _case("prose", "irrelevance", None),
    ]
    replies = [CALL, CALL, CALL, "I can't help with that."]
    results = [{**score(c, r), "p_call": 0.5} for c, r in zip(cases, replies, strict=True)]
    assert [r["ast"] for r in results] == [True, True, False, True]
    rule = DeclineRule(math.log(0.5) + 4 * -1.0, 4.0, 0.95, 100, 10, 1)  # declines a mean below -1
    judged = apply_decline(None, _Chat(), cases, results, rule)  # type: ignore[arg-type]
    assert [r["ast"] for r in judged] == [True, False, True, True]
    assert [("declined_call" in r) for r in judged] == [False, True, True, False]
    assert judged[1]["error"] == "no_call" and judged[1]["declined_call"] == CALL
    assert judged[0]["decline_score"] == pytest.approx(math.log(0.5) - 0.4)
    assert judged[3] == results[3]  # prose is not scored


def test_a_call_written_after_prose_is_scored_as_a_call_but_not_judged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As docs/function-calling-eval.md says: eval decline judges replies that open with a call;
    one that calls after some text (sweep p20's multiple_19, test seed 0's parallel_127) stays."""
    monkeypatch.setattr(decline, "call_log_probs", lambda *a: pytest.fail("a call after prose was judged"))
    case = _case("after_prose", "irrelevance", None)
    result = {**score(case, "Sure, just a moment.\n" + CALL), "p_call": 0.01}
    assert result["error"] == "unexpected_call"  # the evaluation scores it as a call
    rule = DeclineRule(0.0, 4.0, 0.95, 100, 10, 1)  # would decline any judged call
    assert apply_decline(None, _Chat(), [case], [result], rule) == [result]  # type: ignore[arg-type]


def _run_with_eval(root: Path, **meta: Any) -> Any:
    """A run directory (config.yaml, export/adapter/) and its evaluation RUN/eval-constrained, as
    `hpcpipe eval function-calling RUN --constrain` writes them; ``meta`` overrides eval.json's."""
    from hpcpipe.evaluate.function_calling import summarize, write_report
    from hpcpipe.layout import RunLayout

    run = RunLayout(root)
    run.adapter.mkdir(parents=True)
    run.config.write_text("run: {}\n")
    rows = [{**score(_case("heldout_0", "heldout_no_call", None), "No."), "p_call": 0.1}]
    written = {"model": "m", "run": str(root), "adapter": str(run.adapter), "constrained": True}
    write_report(
        summarize(rows), rows, {**written, "call_threshold": None, **meta}, run.fc_eval_dir(False, True)
    )
    return run


def _decline_cli(run: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    """`hpcpipe eval decline RUN` that must stop before the model loads: its one error line."""
    import sys

    from hpcpipe.cli import fc_target
    from hpcpipe.cli.app import main

    monkeypatch.setattr(fc_target, "load_run", lambda *a: pytest.fail("the model loaded"))
    monkeypatch.setattr(sys, "argv", ["hpcpipe", "eval", "decline", str(run.root)])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_damaged_rule_is_one_line_naming_it_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeclineRule(**json.loads(...)) raised a traceback, after the model had loaded."""
    from hpcpipe.errors import UserError

    run = _run_with_eval(tmp_path / "run")
    for text in (
        "{not json",
        '{"threshold": -1.0}',
        '{"threshold": "low", "weight": 4, "target": 1, "cases": 1, "calling": 1, "seed": 1}',
    ):
        run.decline.write_text(text)
        with pytest.raises(UserError, match=f"{run.decline}: cannot read it"):
            read_decline(run.adapter)
    err = _decline_cli(run, monkeypatch, capsys)
    assert f"{run.decline}: cannot read it" in err and "--recalibrate" in err


@pytest.mark.parametrize(
    ("meta", "said"),
    [
        ({"adapter": None}, "an evaluation of the base model (--base)"),
        ({"run": None, "adapter": None, "model": "smol"}, "an evaluation of model smol, not of"),
        ({"run": "runs/other"}, "an evaluation of run runs/other, not of"),
    ],
    ids=["base", "model", "other-run"],
)
def test_only_an_evaluation_of_the_runs_adapter_is_judged(
    tmp_path: Path,
    meta: dict[str, Any],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The run's adapter scored the calls of a base-model evaluation (or another run's)."""
    run = _run_with_eval(tmp_path / "run", **meta)
    assert said in _decline_cli(run, monkeypatch, capsys)


def test_a_relative_path_recorded_elsewhere_names_the_same_run(tmp_path: Path) -> None:
    from hpcpipe.cli.evaluate_decline import _same_path

    here = tmp_path / "runs" / "fc"
    assert _same_path("runs/fc", here) and _same_path("./runs/fc/", here) and _same_path(str(here), here)
    assert not _same_path("runs/other", here) and not _same_path("../fc", here)


def test_the_near_misses_are_decoded_by_the_evaluations_call_threshold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evaluation decided by a call threshold had its decline threshold set under greedy
    decoding, and a rule set under one threshold was reused for another."""
    import sys
    from types import SimpleNamespace

    import hpcpipe.config
    from hpcpipe.cli import fc_target
    from hpcpipe.cli.app import main
    from hpcpipe.evaluate import generate

    thresholds: list[float | None] = []

    def replies(model, tokenizer, prompts, max_new_tokens, batch_size, decision=None, **_: Any):  # type: ignore[no-untyped-def]
        thresholds.append(decision.threshold)
        decision.p_call.update(dict.fromkeys(range(len(prompts)), 0.5))
        return (
            ["<tool_call>"] * len(prompts)
            if max_new_tokens == 1
            else ['<tool_call>{"name": "f"}'] * len(prompts)
        )

    class Tokenizer:
        def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            return {"input_ids": [7]}

        def decode(self, ids: list[int]) -> str:
            return "<tool_call>"

    chat = SimpleNamespace(tokenizer=Tokenizer(), prompt=lambda conv, upto: "p", render=lambda *a, **k: "")
    heldout = [Conversation((Message("user", "hi"), Message("assistant", "No.")), ())]
    job = SimpleNamespace(data=SimpleNamespace(synthetic_mix=SyntheticMix()), run=SimpleNamespace(seed=0))
    monkeypatch.setattr(generate, "generate_replies", replies)
    monkeypatch.setattr(decline, "field_near_misses", lambda n, seed, mix: [Conversation(())] * n)
    monkeypatch.setattr(decline, "call_log_probs", lambda *a: [-1.0])
    monkeypatch.setattr(hpcpipe.config, "load_config", lambda path: job)
    run = _run_with_eval(tmp_path / "run", call_threshold=0.25, constrained=False)
    monkeypatch.setattr(
        fc_target, "load_run", lambda *a: (None, chat, heldout, {"adapter": str(run.adapter)}, None)
    )
    DeclineRule(-9.0, 4.0, 0.95, 10, 10, 1, False, None).save(run.adapter)  # set under greedy decoding
    monkeypatch.setattr(sys, "argv", ["hpcpipe", "eval", "decline", str(run.root), "--cases", "10"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code in (0, None), capsys.readouterr().err
    assert thresholds == [0.25, 0.25]  # the first token, then the replies: both by the threshold
    rule = read_decline(run.adapter)
    assert rule is not None and rule.call_threshold == 0.25 and rule.calling == 10


def test_a_rule_set_on_an_earlier_adapter_is_set_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training again re-exports the adapter beside the old decline.json, which was reused for
    the new adapter whenever the settings matched."""
    from types import SimpleNamespace

    import hpcpipe.config
    from hpcpipe.cli.evaluate_decline import _rule
    from hpcpipe.evaluate.calibrate import adapter_sha256

    run = _run_with_eval(tmp_path / "run")
    (run.adapter / "adapter_model.safetensors").write_bytes(b"weights")
    settings = (10, 0.95, 4.0, True, None)
    fresh = DeclineRule(-2.0, 4.0, 0.95, 10, 3, 1)
    job = SimpleNamespace(data=SimpleNamespace(synthetic_mix=None), run=SimpleNamespace(seed=0))
    monkeypatch.setattr(hpcpipe.config, "load_config", lambda path: job)
    monkeypatch.setattr(decline, "calibrate_decline", lambda *a, **k: fresh)
    mine = DeclineRule(-1.0, 4.0, 0.95, 10, 3, 1, True, None, adapter_sha256(run.adapter))
    assert _rule(mine, settings, run, None, None) == mine  # set on these weights: reused
    assert capsys.readouterr().err == ""
    earlier = DeclineRule(-1.0, 4.0, 0.95, 10, 3, 1, True, None, "0" * 64)
    again = _rule(earlier, settings, run, None, None)
    assert again.threshold == -2.0 and again.adapter_sha256 == adapter_sha256(run.adapter)
    assert read_decline(run.adapter) == again
    assert "decline.json: set on an earlier adapter" in capsys.readouterr().err


def test_a_rule_written_before_hashes_is_reused_whatever_the_file_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was set again (minutes of calibration) when older than the weights, which a copy of the
    run (cp -r, rsync without -t, kubectl cp) makes it by writing it first."""
    import os

    from hpcpipe.cli.evaluate_decline import _rule

    run = _run_with_eval(tmp_path / "run")
    (run.adapter / "adapter_model.safetensors").write_bytes(b"weights")
    legacy = DeclineRule(-1.0, 4.0, 0.95, 10, 3, 1, True, None)  # no adapter_sha256: before 2026-12-05
    legacy.save(run.adapter)
    os.utime(run.adapter / "decline.json", (1, 1))  # copied before the weights
    assert _rule(legacy, (10, 0.95, 4.0, True, None), run, None, None) == legacy
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "decline.json: written before adapters were hashed" in err


def test_the_default_evaluation_is_the_dev_splits_then_the_test_splits(tmp_path: Path) -> None:
    """--split test wrote RUN/eval too, and decline judged whichever split was written last."""
    import shutil

    from hpcpipe.cli.evaluate_decline import _default_eval

    run = _run_with_eval(tmp_path / "run")
    dev = run.fc_eval_dir(False, True)
    shutil.copytree(dev, run.fc_eval_dir(False, True, "test"))
    assert _default_eval(run) == dev
    shutil.rmtree(dev)
    assert _default_eval(run) == run.root / "eval-test-constrained"


def test_a_run_moved_with_its_evaluation_is_still_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Copied from the cluster, eval.json names the cluster's paths: every eval decline was
    refused, and its hint (--eval-dir) ran into the same check."""
    import sys

    from hpcpipe.cli import fc_target
    from hpcpipe.cli.app import main

    old = "/scratch/alice/runs/fc"
    run = _run_with_eval(tmp_path / "home" / "fc", run=old, adapter=f"{old}/export/adapter")

    class Loaded(Exception):
        pass

    def load_run(*args: Any) -> None:
        raise Loaded

    monkeypatch.setattr(fc_target, "load_run", load_run)
    monkeypatch.setattr(sys, "argv", ["hpcpipe", "eval", "decline", str(run.root)])
    with pytest.raises(Loaded):  # past the check, to the model
        main()
    other = _run_with_eval(tmp_path / "home" / "other", run=old, adapter=f"{old}/export/adapter")
    err = _decline_cli(other, monkeypatch, capsys)
    assert f"an evaluation of run {old}, not of" in err


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda e: e["cases"][0].pop("reply"), "case heldout_0 has no 'reply' string"),
        (lambda e: e["cases"][0].update(reply=None), "case heldout_0 has no 'reply' string"),
        (lambda e: e["cases"][0].update(id="heldout_x"), "case heldout_x is not a held-out case id"),
        (lambda e: e["cases"][0].update(id="heldout_"), "case heldout_ is not a held-out case id"),
        (lambda e: e.update(meta=["constrained"]), "'meta' is not an object"),
    ],
    ids=["no-reply", "null-reply", "held-out-id", "bare-prefix", "meta"],
)
def test_an_evaluation_of_another_shape_is_one_line_naming_it_before_the_model_loads(
    tmp_path: Path,
    edit: Any,
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each was a traceback (KeyError 'reply', ValueError from int(), AttributeError on meta.get),
    the first after the model had loaded and the threshold been calibrated."""
    import json

    run = _run_with_eval(tmp_path / "run")
    path = run.fc_eval_dir(False, True) / "eval.json"
    evaluation = json.loads(path.read_text())
    edit(evaluation)
    path.write_text(json.dumps(evaluation))
    assert f"{path}: {said}" in _decline_cli(run, monkeypatch, capsys)
