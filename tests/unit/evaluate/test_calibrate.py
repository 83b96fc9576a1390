"""The call threshold calibrated after training (evaluate/calibrate.py): near misses from the
generator, and the threshold at which the asked share of them declines."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.evaluate.calibrate import Calibration, near_misses, read_calibration, threshold_for
from hpcpipe.layout import RunLayout


def test_threshold_for_declines_the_target_share() -> None:
    p = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    assert threshold_for(p, 0.5) == 0.6  # 0.1..0.5 decline (P < 0.6): 5 of 10
    assert threshold_for(p, 0.9) == 0.95  # 9 of 10 below
    assert threshold_for(p, 0.85) == 0.95  # ceil(8.5) = 9 must decline
    assert sum(x < threshold_for(p, 0.3) for x in p) == 3
    top = threshold_for(p, 1.0)  # all decline: just above the largest
    assert top > 0.95 and all(x < top for x in p)
    assert threshold_for([0.2, 0.2, 0.9], 0.5) == 0.9  # ties: both 0.2 decline at 0.9
    with pytest.raises(ValueError):
        threshold_for([], 0.9)
    with pytest.raises(ValueError):
        threshold_for(p, 0.0)


def test_near_misses_are_requests_no_listed_function_serves() -> None:
    from hpcpipe.data.function_calling.generator import generate_conversations

    mix = SyntheticMix()
    convs = near_misses(40, seed=7, mix=mix)
    assert len(convs) == 40
    assert all([m.role for m in c.messages] == ["system", "user"] and c.tools for c in convs)
    # Each is the twin of a single request: the request's own function is no longer listed.
    singles_and_twins = {shape: 0.0 for shape in SHAPE_FIELDS} | {
        "single": 1.0,
        "twins": 1.0,
        "follow_ups": 0.0,
    }
    singles = generate_conversations(80, 7, mix.model_copy(update=singles_and_twins))
    for single, twin in zip(singles[0::2], convs, strict=False):
        called = {c.name for m in single.messages for c in m.tool_calls}
        assert twin.messages[1].content == single.messages[1].content
        assert called and not called & {t["name"] for t in twin.tools}
    assert near_misses(40, seed=7, mix=mix) == convs  # seeded
    assert near_misses(40, seed=8, mix=mix) != convs


def test_the_calibration_is_saved_beside_the_adapter(tmp_path: Path) -> None:
    assert read_calibration(tmp_path) is None
    found = Calibration(0.71, 0.95, 100, 104736, {"p50": 0.2})
    found.save(tmp_path)
    assert read_calibration(tmp_path) == found


def test_a_confident_models_threshold_is_saved_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """P(call) of a few millionths on every near miss: rounded to 6 places the threshold was 0.0,
    and with it every reply called (P >= 0 always holds)."""
    import hpcpipe.evaluate.calibrate as calibrate_module
    import hpcpipe.evaluate.generate as generate_module
    from hpcpipe.data.function_calling.conversation import Conversation, Message

    p_call = [1e-7 * (i + 1) for i in range(10)]

    def scored(model, tokenizer, prompts, max_new_tokens, batch_size, decision):  # type: ignore[no-untyped-def]
        decision.p_call.update(enumerate(p_call))
        return [""] * len(prompts)

    class Chat:
        def tokenizer(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
            return {"input_ids": [5]}

        def prompt(self, conv: Conversation, upto: int) -> str:
            return "prompt"

    convs = [Conversation((Message("user", "hi"),), ())] * len(p_call)
    monkeypatch.setattr(calibrate_module, "near_misses", lambda n, seed, mix: convs)
    monkeypatch.setattr(generate_module, "generate_replies", scored)
    found = calibrate_module.calibrate(None, Chat(), SyntheticMix(), seed=1, cases=10, target=0.5)  # type: ignore[arg-type]
    assert found.threshold == p_call[5]  # 5 of 10 below it
    found.save(tmp_path)
    saved = read_calibration(tmp_path)
    assert saved is not None and saved.threshold == p_call[5] > 0


def _run_with_adapter(root: Path) -> RunLayout:
    """A run directory (config.yaml) with an exported adapter: its config and weights."""
    run = RunLayout(root)
    run.adapter.mkdir(parents=True)
    run.config.write_text("run: {}\n")
    (run.adapter / "adapter_config.json").write_text("{}")
    (run.adapter / "adapter_model.safetensors").write_bytes(b"weights")
    return run


def _refused_before_the_model_loads(
    run: RunLayout, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    """`hpcpipe eval function-calling RUN`'s stderr: one line, exit 2, no model loaded."""
    import sys

    import hpcpipe.cli.evaluate as evaluate_cli
    from hpcpipe.cli.app import main

    monkeypatch.setattr(evaluate_cli, "load_target", lambda *a: pytest.fail("the model loaded"))
    monkeypatch.setattr(
        sys, "argv", ["hpcpipe", "eval", "function-calling", str(run.root), "--categories", ""]
    )
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[0.5]",
        '{"threshold": 0.5}',
        '{"threshold": "high", "target": 1, "cases": 1, "seed": 1, "p_call_quantiles": {}}',
        # Out of range, as --call-threshold refuses it: these loaded, and no reply could call.
        '{"threshold": NaN, "target": 1, "cases": 1, "seed": 1, "p_call_quantiles": {}}',
        '{"threshold": 7, "target": 1, "cases": 1, "seed": 1, "p_call_quantiles": {}}',
        '{"threshold": -0.5, "target": 1, "cases": 1, "seed": 1, "p_call_quantiles": {}}',
        '{"threshold": Infinity, "target": 1, "cases": 1, "seed": 1, "p_call_quantiles": {}}',
    ],
)
def test_a_damaged_calibration_is_one_line_naming_it_before_the_model_loads(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Calibration(**json.loads(...)) raised a traceback, after the model had loaded."""
    from hpcpipe.errors import UserError

    run = _run_with_adapter(tmp_path / "run")
    run.call_threshold.write_text(text)
    with pytest.raises(UserError, match=f"{run.call_threshold}: cannot read it"):
        read_calibration(run.adapter)
    err = _refused_before_the_model_loads(run, monkeypatch, capsys)
    assert f"{run.call_threshold}: cannot read it" in err and "--call-threshold greedy" in err


def test_a_threshold_set_on_an_earlier_adapter_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training again re-exports the adapter beside the old call_threshold.json, and --call-threshold
    auto decided the new adapter's calls by the old adapter's threshold."""
    from hpcpipe.evaluate.calibrate import adapter_sha256, set_on_this_adapter

    run = _run_with_adapter(tmp_path / "run")
    weights = run.adapter / "adapter_model.safetensors"
    weights.write_bytes(b"old weights")
    old = adapter_sha256(run.adapter)
    Calibration(0.5, 0.95, 10, 1, {}, adapter_sha256=old).save(run.adapter)
    assert set_on_this_adapter(old, run.adapter)
    weights.write_bytes(b"new weights")  # trained again
    assert adapter_sha256(run.adapter) != old
    assert not set_on_this_adapter(old, run.adapter)
    err = _refused_before_the_model_loads(run, monkeypatch, capsys)
    assert f"{run.call_threshold}: set on an earlier adapter" in err and "--call-threshold greedy" in err


def test_a_threshold_written_before_hashes_is_used_whatever_the_file_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was refused as set on an earlier adapter when older than the weights, which a copy of
    the run (cp -r, rsync without -t, kubectl cp) makes it by writing it first."""
    import os

    from hpcpipe.cli.evaluate import _call_threshold

    run = _run_with_adapter(tmp_path / "run")
    Calibration(0.3, 0.95, 10, 1, {}).save(run.adapter)  # no adapter_sha256: before 2026-12-05
    os.utime(run.call_threshold, (1, 1))  # copied before the weights
    assert _call_threshold("auto", run.adapter) == 0.3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{run.call_threshold}: written before adapters were hashed" in err


@pytest.mark.parametrize("missing", ["adapter_model.safetensors", "adapter_config.json"])
def test_a_run_without_its_adapter_says_so_before_its_threshold_is_judged(
    tmp_path: Path, missing: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Retraining cut off before its export: the threshold was blamed (set on an earlier adapter,
    delete it or pass greedy), and doing so led to the missing adapter only then."""
    from hpcpipe.evaluate.calibrate import adapter_sha256

    run = _run_with_adapter(tmp_path / "run")
    Calibration(0.5, 0.95, 10, 1, {}, adapter_sha256=adapter_sha256(run.adapter)).save(run.adapter)
    (run.adapter / missing).unlink()
    err = _refused_before_the_model_loads(run, monkeypatch, capsys)
    assert err.startswith(f"error: {run.adapter}: no adapter") and "train the run to the end" in err
