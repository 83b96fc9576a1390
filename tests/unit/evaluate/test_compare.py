"""Wilson intervals on the function-calling metrics, and `hpcpipe eval compare`: two evaluations of
the same cases, per category before/after with intervals and a verdict, the cases that flipped,
and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hpcpipe.cli.app import app
from hpcpipe.errors import UserError
from hpcpipe.evaluate.compare import compare_evals, read_eval
from hpcpipe.evaluate.function_calling import markdown_table, score, summarize, write_report
from hpcpipe.evaluate.intervals import overlap, wilson

# z = 1.96, z² = 3.8416. Wilson: center = (p + z²/2n) / (1 + z²/n),
# half = z / (1 + z²/n) * sqrt(p(1-p)/n + z²/4n²).
# Worked with z = 1.96; SciPy uses z = 1.959964, within 1e-5 of these (the test allows 1e-4).
WILSON_CASES = [
    # 0/10: z²/n = 0.38416; center = 0.19208 / 1.38416 = 0.138770; half = 1.96/1.38416 * sqrt(0.0096040)
    #   = 1.416021 * 0.098000 = 0.138770 -> (0, 0.277540) (high = 0.38416 / 1.38416)
    (0, 10, 0.0, 0.277540),
    # 10/10: the mirror image of 0/10 -> (1 - 0.277540, 1)
    (10, 10, 0.722460, 1.0),
    # 5/10: center = (0.5 + 0.19208) / 1.38416 = 0.5; half = 1.416021 * sqrt(0.025 + 0.009604)
    #   = 1.416021 * 0.186021 = 0.263410 -> (0.236590, 0.763410)
    (5, 10, 0.236590, 0.763410),
    # 31/100: z²/n = 0.038416; center = (0.31 + 0.019208) / 1.038416 = 0.317029;
    #   half = 1.96/1.038416 * sqrt(0.31*0.69/100 + 3.8416/40000) = 1.887490 * sqrt(0.00223504)
    #   = 1.887490 * 0.0472762 = 0.089233 -> (0.227796, 0.406262)
    (31, 100, 0.227796, 0.406262),
    # 1/1: z²/n = 3.8416; center = (1 + 1.9208) / 4.8416 = 0.603272; half = 1.96/4.8416 * sqrt(0.9604)
    #   = 0.404825 * 0.98 = 0.396728 -> (0.206543, 1.0)
    (1, 1, 0.206543, 1.0),
    # 15/30 (docs/function-calling-eval.md: a category of the dev or test split at 50%): z²/n =
    #   0.128053; center = 0.5; half = 1.96/1.128053 * sqrt(0.008333 + 0.001067) = 0.168459
    (15, 30, 0.331541, 0.668459),
]


@pytest.mark.parametrize(("k", "n", "low", "high"), WILSON_CASES)
def test_wilson_matches_the_hand_computed_interval(k: int, n: int, low: float, high: float) -> None:
    got = wilson(k, n)
    assert got == pytest.approx((low, high), abs=1e-4)
    assert 0.0 <= got[0] <= k / n <= got[1] <= 1.0


def test_wilson_edges() -> None:
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0  # exact, never -1e-17 or 1+1e-16
    assert wilson(0, 0) == (0.0, 1.0)  # no cases: no information
    assert wilson(31, 100, confidence=0.99)[0] < wilson(31, 100)[0]  # 99% is wider than 95%
    for bad in ((-1, 10), (11, 10), (0, -1)):
        with pytest.raises(ValueError):
            wilson(*bad)
    assert overlap((0.1, 0.3), (0.3, 0.5)) and not overlap((0.1, 0.29), (0.3, 0.5))


def _row(case_id: str, category: str, ast: bool) -> dict[str, Any]:
    """One case's result as `function_calling.score` writes it."""
    return {
        "id": case_id,
        "category": category,
        "parsed": True,
        "decision": ast,
        "name": ast if category != "irrelevance" else None,
        "ast": ast,
        "exact": ast,
        "error": None if ast else "value_error",
        "reply": "",
    }


def _write_eval(out: Path, passing: dict[str, int], sizes: dict[str, int], constrained: bool = False) -> Path:
    """An eval directory as `hpcpipe eval function-calling` writes it: the first passing[cat] cases of
    each category pass."""
    rows = [_row(f"{cat}_{i}", cat, i < passing.get(cat, 0)) for cat, n in sizes.items() for i in range(n)]
    write_report(summarize(rows), rows, {"model": "m", "adapter": None, "constrained": constrained}, out)
    return out


SIZES = {"simple": 20, "irrelevance": 20, "multiple": 10}


def test_the_evaluation_stores_and_prints_each_accuracys_interval(tmp_path: Path) -> None:
    out = _write_eval(tmp_path / "eval", {"simple": 10, "irrelevance": 20}, SIZES)
    written = json.loads((out / "eval.json").read_text())
    assert written["categories"]["irrelevance"]["ast_ci95"] == pytest.approx(wilson(20, 20), abs=1e-6)
    assert written["overall"]["ast_ci95"] == pytest.approx(wilson(30, 50), abs=1e-6)
    table = markdown_table({k: written[k] for k in ("categories", "overall")}, written["meta"])
    assert "| AST (95% CI) |" in table and "| 50.0% [30, 70] |" in table  # 10/20: [29.9, 70.1]


def test_compare_rows_verdicts_and_flipped_cases(tmp_path: Path) -> None:
    base = _write_eval(tmp_path / "base", {"simple": 2, "irrelevance": 20, "multiple": 5}, SIZES)
    after = _write_eval(tmp_path / "after", {"simple": 16, "irrelevance": 17, "multiple": 6}, SIZES)
    result = compare_evals(read_eval(base), read_eval(after / "eval.json"))  # a directory or the file
    simple, irrelevance = result["categories"]["simple"], result["categories"]["irrelevance"]
    # simple 2/20 [2.8, 30.1] -> 16/20 [58.4, 91.9]: apart; irrelevance 20/20 [83.9, 100] -> 17/20
    # [64.0, 94.8]: overlapping.
    assert simple["verdict"] == "real" and simple["diff"] == pytest.approx(0.7)
    assert simple["before"]["passed"] == 2 and simple["after"]["ci95"] == pytest.approx(
        wilson(16, 20), abs=1e-6
    )
    assert irrelevance["verdict"] == "within noise" and irrelevance["diff"] == pytest.approx(-0.15)
    assert result["overall"]["cases"] == 50 and result["overall"]["after"]["passed"] == 39
    assert result["changed"]["passed_to_failed"] == ["irrelevance_17", "irrelevance_18", "irrelevance_19"]
    assert result["changed"]["failed_to_passed"][:2] == ["simple_2", "simple_3"]  # file order
    assert len(result["changed"]["failed_to_passed"]) == 14 + 1


def test_compare_cli_prints_the_table_and_caps_the_case_lists(tmp_path: Path) -> None:
    base = _write_eval(tmp_path / "base", {"simple": 2, "irrelevance": 20}, SIZES)
    after = _write_eval(tmp_path / "after", {"simple": 16, "irrelevance": 17}, SIZES)
    shown = CliRunner().invoke(app, ["eval", "compare", str(base), str(after), "--max-cases", "3"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()  # piped: tab-separated rows, a header first
    assert "category\tcases\tbefore\tafter\tchange (pts)\tverdict" in lines
    assert "simple\t20\t10.0% [3, 30]\t80.0% [58, 92]\t+70.0\treal" in lines
    assert "irrelevance\t20\t100.0% [84, 100]\t85.0% [64, 95]\t-15.0\twithin noise" in lines
    assert "  passed -> failed (3): irrelevance_17, irrelevance_18, irrelevance_19" in lines
    assert "  failed -> passed (14): simple_2, simple_3, simple_4, and 11 more" in lines
    printed = CliRunner().invoke(app, ["eval", "compare", str(base), str(after), "--json", "-"])
    assert json.loads(printed.output)["overall"]["verdict"] == "within noise"  # 22/50 -> 33/50
    assert "decoding differs" not in shown.output


def test_evaluations_of_different_held_out_conversations_are_not_paired(tmp_path: Path) -> None:
    """heldout_3 of one run and heldout_3 of another are different conversations: compare paired
    them as one case."""
    from hpcpipe.data.function_calling.conversation import Conversation, Message
    from hpcpipe.evaluate.fc_run import build_cases, heldout_sha256

    def held(question: str) -> list[Conversation]:
        return [Conversation((Message("user", question), Message("assistant", "No.")), ())]

    mine, other = build_cases(held("Weather?"), 1, []), build_cases(held("Time?"), 1, [])
    assert heldout_sha256(mine) == heldout_sha256(build_cases(held("Weather?"), 1, []))
    assert heldout_sha256(mine) != heldout_sha256(other) and heldout_sha256([]) is None
    sides = []
    for name, cases in (("base", mine), ("after", other)):
        rows = [score(cases[0], "No.")]
        write_report(summarize(rows), rows, {"heldout_sha256": heldout_sha256(cases)}, tmp_path / name)
        sides.append(read_eval(tmp_path / name))
    assert [c["id"] for c in sides[0]["cases"]] == [c["id"] for c in sides[1]["cases"]] == ["heldout_0"]
    with pytest.raises(UserError, match="scored different held-out conversations"):
        compare_evals(*sides)
    compare_evals(sides[0], sides[0])  # the same data: compared


def test_compare_says_when_the_two_sides_decoded_differently(tmp_path: Path) -> None:
    base = _write_eval(tmp_path / "base", {"simple": 2}, SIZES)
    after = _write_eval(tmp_path / "after", {"simple": 9}, SIZES, constrained=True)
    assert compare_evals(read_eval(base), read_eval(after))["decoding"] == {
        "base": "free",
        "after": "constrained",
    }
    shown = CliRunner().invoke(app, ["eval", "compare", str(base), str(after)])
    assert shown.exit_code == 0 and "decoding differs: before free, after constrained" in shown.output


def _without_reply(directory: Path) -> Path:
    """An evaluation one of whose cases lost its reply (`eval decline` judges the replies)."""
    path = _write_eval(directory / "e", {}, SIZES) / "eval.json"
    evaluation = json.loads(path.read_text())
    del evaluation["cases"][3]["reply"]
    path.write_text(json.dumps(evaluation))
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "nope", "no such file"),
        (lambda d: (d / "x.json").write_text("{") and d / "x.json", "not readable as JSON"),
        (
            lambda d: (d / "eval.json").write_text('{"metrics": {"val_loss": 1}}') and d,
            "not a function-calling",
        ),
        (lambda d: (d / "config.yaml").write_text("run: {}\n") and d, "a run directory, not an evaluation"),
        (lambda d: _write_eval(d / "e", {}, {"simple": 20, "live_simple": 3}), "only in AFTER: live_simple"),
        (
            lambda d: _write_eval(d / "e", {}, {"simple": 5, "irrelevance": 20, "multiple": 10}),
            "cases of simple",
        ),
        (_without_reply, "case simple_3 has no 'reply' string"),
    ],
    ids=["missing", "not-json", "trainer-eval", "run-dir", "categories", "cases", "no-reply"],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path,
    make: Any,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hpcpipe.cli.app import main

    base = _write_eval(tmp_path / "base", {}, SIZES)
    after = make(tmp_path)
    with pytest.raises(UserError, match=message):
        compare_evals(read_eval(base), read_eval(after))
    monkeypatch.setattr(sys, "argv", ["hpcpipe", "eval", "compare", str(base), str(after)])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_compare_help_has_an_example() -> None:
    shown = CliRunner().invoke(app, ["eval", "compare", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "hpcpipe eval compare runs/" in shown.output
