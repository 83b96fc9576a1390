"""hpcpipe.chaos.runner: what run.json plans, which the report reads what never ran from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.chaos.report import write_report
from hpcpipe.chaos.runner import ChaosPlan, run_plan
from hpcpipe.chaos.scenario import Scenario

pytestmark = pytest.mark.timeout(60)


def _plan(out: Path, names: list[str], trials: int, **extra: object) -> ChaosPlan:
    scenarios = [Scenario.model_validate({"name": n, "kind": "always_pass"}) for n in names]
    return ChaosPlan(Path("sc.yaml"), scenarios, trials, 0, out, **extra)  # type: ignore[arg-type]


def _keep_rows(out: Path, count: int) -> None:
    """As a run killed after ``count`` trials leaves trials.jsonl."""
    lines = (out / "trials.jsonl").read_text().splitlines(keepends=True)
    (out / "trials.jsonl").write_text("".join(lines[:count]))


def test_a_resume_of_some_scenarios_keeps_what_the_others_planned(tmp_path: Path) -> None:
    """`--resume --only a` rewrote run.json from its own plan: b (1 of 2) read complete, c (0 of
    2) vanished from the report, and a run killed half way read PASS."""
    out = tmp_path / "out"
    run_plan(_plan(out, ["a", "b", "c"], 2), progress=False)
    _keep_rows(out, 3)  # a 0, a 1, b 0
    run_plan(_plan(out, ["a"], 2, resume=True), progress=False)
    report = write_report(out)
    assert [(r.name, r.ran, r.planned) for r in report.rows] == [("a", 2, 2), ("b", 1, 2), ("c", 0, 2)]
    assert (report.verdict, report.total["missing"]) == ("INCOMPLETE", 3)

    # Fewer --trials on a resume do not shrink the plan either; more extend it.
    run_plan(_plan(out, ["a", "b", "c"], 1, resume=True), progress=False)
    assert [(r.ran, r.planned) for r in write_report(out).rows] == [(2, 2), (1, 2), (1, 2)]
    run_plan(_plan(out, ["a", "b", "c"], 3, resume=True), progress=False)
    assert write_report(out).verdict == "PASS"
    assert [s["trials"] for s in json.loads((out / "run.json").read_text())["scenarios"]] == [3, 3, 3]


def test_a_replay_plans_its_own_trial_index(tmp_path: Path) -> None:
    """`--trial 7` plans index 7, not 0: its report passes, and a resume adds to it."""
    out = tmp_path / "replay"
    run_plan(_plan(out, ["a"], 3, only_trial=7), progress=False)
    assert json.loads((out / "run.json").read_text())["scenarios"] == [
        {"name": "a", "kind": "always_pass", "trials": 1, "indices": [7]}
    ]
    assert write_report(out).verdict == "PASS"
    run_plan(_plan(out, ["a"], 2, resume=True), progress=False)
    assert write_report(out).rows[0].planned == 3 and write_report(out).verdict == "PASS"


def test_a_resume_keeps_the_scenarios_skipped_before_unless_planned(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run_plan(_plan(out, ["a"], 1, skipped={"disk": "needs root", "b": "x"}), progress=False)
    run_plan(_plan(out, ["a", "b"], 1, resume=True), progress=False)
    assert json.loads((out / "run.json").read_text())["skipped"] == [{"name": "disk", "why": "needs root"}]
