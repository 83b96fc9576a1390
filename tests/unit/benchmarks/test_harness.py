"""benchmarks/harness.py: the rotated rounds, the ratios and the JSON line every benchmark prints."""

from __future__ import annotations

import json

import pytest
from benchmarks import harness  # the repository root is on sys.path (pytest's pythonpath)


def test_each_arm_leads_in_turn() -> None:
    assert [harness.rotation(["a", "b"], r) for r in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    three = [harness.rotation(["a", "b", "c"], r) for r in range(4)]
    assert three == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_side_by_side_runs_the_arms_in_rotated_rounds() -> None:
    calls: list[str] = []

    def arm(name: str) -> object:
        return lambda: calls.append(name) or len(calls)

    runs = harness.side_by_side({"hpcpipe": arm("hpcpipe"), "raw": arm("raw")}, 3)
    assert calls == ["hpcpipe", "raw", "raw", "hpcpipe", "hpcpipe", "raw"]
    assert runs == {"hpcpipe": [1, 4, 5], "raw": [2, 3, 6]}


def test_compare_loops_warms_up_then_times_blocks() -> None:
    steps: dict[str, list[int]] = {"a": [], "b": []}
    loops = {name: steps[name].append for name in steps}
    rates = harness.compare_loops(loops, repeats=2, steps=5, items_per_step=10, warmup=3)
    assert steps == {"a": [3, 5, 5], "b": [3, 5, 5]}
    assert {name: len(xs) for name, xs in rates.items()} == {"a": 2, "b": 2}
    assert all(x > 0 for xs in rates.values() for x in xs)


def test_comparison_is_the_ratio_of_medians_beside_the_paired_median() -> None:
    runs = {"hpcpipe": [90.0, 100.0, 40.0], "raw": [100.0, 100.0, 100.0]}
    c = harness.Comparison.of(runs, "hpcpipe", "raw")
    assert c.ratio == pytest.approx(0.9)  # 90 / 100
    assert c.paired == pytest.approx(0.9)  # median of 0.9, 1.0, 0.4
    assert c.fields("tokens_per_s") == {
        "hpcpipe_tokens_per_s": 90.0,
        "raw_tokens_per_s": 100.0,
        "ratio": 0.9,
        "paired_ratio": 0.9,
    }
    assert c.summary(0.98) == "ratio hpcpipe/raw = 0.900 (target >= 0.98); median of paired blocks 0.900"
    with pytest.raises(ValueError):  # rounds that do not pair up are a bug, not a figure
        harness.Comparison.of({"a": [1.0], "b": [1.0, 2.0]}, "a", "b")


def test_the_json_line_carries_the_context_and_the_record_wins(capsys: pytest.CaptureFixture[str]) -> None:
    harness.emit({"benchmark": "x", "ratio": 0.5, "device": "NVIDIA H200"})
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record["benchmark"] == "x" and record["ratio"] == 0.5
    assert record["device"] == "NVIDIA H200"
    for key in ("torch", "cores", "torch_threads", "python", "hpcpipe", "cpu_model", "date"):
        assert record[key], key
    assert len(record["date"]) == 10  # YYYY-MM-DD


def test_report_pair_prints_table_ratio_notes_then_json(capsys: pytest.CaptureFixture[str]) -> None:
    runs = {"hpcpipe": [95.0, 97.0], "raw": [100.0, 100.0], "threads": 2}
    harness.report_pair("b", runs, ("img/s", "images_per_s"), 0.95, {"steps": 4}, notes=["a note"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["loop", "median", "img/s", "min", "max"]
    assert [line.split()[0] for line in lines[1:3]] == ["hpcpipe", "raw"]
    assert lines[3].startswith("ratio hpcpipe/raw = 0.960 (target >= 0.95)")
    assert lines[4] == "a note"
    record = json.loads(lines[5])
    assert record["hpcpipe_images_per_s"] == 96.0 and record["target"] == 0.95 and record["steps"] == 4


def test_smoke_takes_the_toy_values_and_an_option_given_still_wins(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(harness, "_this_run", harness.argparse.Namespace(smoke=False))
    toy = {"repeats": 1, "steps": 2}
    args = harness.parse_with_smoke(harness.block_parser(None, 11, 40), toy, [])
    assert (args.smoke, args.repeats, args.steps) == (False, 11, 40)
    harness.emit({"benchmark": "x"})
    assert "smoke" not in json.loads(capsys.readouterr().out)

    args = harness.parse_with_smoke(harness.block_parser(None, 11, 40), toy, ["--smoke", "--steps", "5"])
    assert (args.smoke, args.repeats, args.steps) == (True, 1, 5)
    harness.emit({"benchmark": "x"})
    *note, line = capsys.readouterr().out.splitlines()
    assert json.loads(line)["smoke"] is True
    assert note == [harness.SMOKE_NOTE]


def test_toy_values_name_options_the_parser_has() -> None:
    with pytest.raises(ValueError, match=r"\['stesp'\]"):
        harness.parse_with_smoke(harness.block_parser(None, 11, 40), {"stesp": 2}, ["--smoke"])
