"""hpcpipe.chaos.report: aggregation read back from a run directory, markdown, the TTR plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.chaos.report import escape_cell, p90, read_trials, write_report
from hpcpipe.errors import UserError

pytestmark = pytest.mark.timeout(60)

FILE = "scenarios.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trial(scenario: str, trial: int, recovered: bool = True, ttr: float | None = 1.0, **extra: Any) -> dict:
    row = {
        "scenario": scenario,
        "kind": extra.pop("kind", "kill-rank"),
        "trial": trial,
        "seed": 7,
        "replay": f"hpcpipe chaos run {FILE} --seed 7 --only {scenario} --trial {trial}",
        "started": 1_700_000_000.0 + trial,
        "duration_s": 10.0,
        "recovered": recovered,
        "detail": "resumed at step 12" if recovered else "no step after the restart",
        "placement": {"rank": 1},
        "lost": 0,
        "ttr_s": ttr,
        "error": None,
    }
    row.update(extra)
    return row


def _run(scenarios: list[tuple[str, str, int]]) -> dict:
    return {
        "file": FILE,
        "seed": 7,
        "trials": 4,
        "torch": "2.9.0+cpu",
        "cores": 2,
        "hpcpipe": "0.1.0",
        "started": 1_700_000_000.0,  # 2023-11-14 22:13 UTC
        "scenarios": [{"name": n, "kind": k, "trials": t} for n, k, t in scenarios],
    }


def _write(out: Path, trials: list[dict], run: dict | None = None, tail: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    if run is not None:
        (out / "run.json").write_text(json.dumps(run))
    (out / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials) + tail)
    return out


def _mixed_run(tmp_path: Path) -> Path:
    """kill: 4 trials, one failed and one without a TTR; hang: 2 trials, data lost; extra: unplanned."""
    trials = [
        _trial("kill", 0, ttr=1.0, duration_s=10.0),
        _trial("kill", 1, ttr=4.0, duration_s=20.0),
        _trial("kill", 2, recovered=False, ttr=None, duration_s=30.0),
        _trial("kill", 3, ttr=2.0, duration_s=40.0),
        _trial("hang", 0, kind="hang", ttr=3.0, lost=2),
        _trial("hang", 1, kind="hang", ttr=5.0, lost=1),
        _trial("extra", 0, kind="oom", ttr=None),
    ]
    return _write(tmp_path / "out", trials, _run([("kill", "kill-rank", 4), ("hang", "hang", 3)]))


def test_aggregates_per_scenario_in_file_order(tmp_path: Path) -> None:
    report = write_report(_mixed_run(tmp_path))
    kill, hang, extra = report.rows
    assert [r.name for r in report.rows] == ["kill", "hang", "extra"]
    assert (kill.trials, kill.planned, kill.recovered, kill.failed, kill.lost) == (4, 4, 3, 1, 0)
    assert kill.ttr_median_s == 2.0  # over the three numbers 1, 2, 4
    assert kill.ttr_max_s == 4.0
    assert kill.duration_median_s == 25.0  # even count: mean of 20 and 30
    assert (hang.trials, hang.planned, hang.lost) == (2, 3, 3)
    assert hang.ttr_median_s == 4.0  # even count: mean of 3 and 5
    assert hang.ttr_max_s == 5.0
    assert (extra.kind, extra.planned, extra.ttr_median_s, extra.ttr_max_s) == ("oom", None, None, None)
    assert report.total == {
        "trials": 7,
        "planned": 8,  # kill 4, hang 3, extra (unplanned) the 1 it ran
        "missing": 1,  # hang's trial 2
        "complete": False,  # hang: 2 of 3
        "recovered": 6,
        "failed": 1,
        "lost": 3,
        "unreadable_lines": 0,
    }
    assert (report.verdict, report.ok) == ("FAIL", False)  # a failure outranks what never ran


def test_failures_carry_the_replay_line(tmp_path: Path) -> None:
    report = write_report(_mixed_run(tmp_path))
    (failure,) = report.rows[0].failures
    assert (failure.trial, failure.seed, failure.detail) == (2, 7, "no step after the restart")
    assert failure.replay == f"hpcpipe chaos run {FILE} --seed 7 --only kill --trial 2"
    markdown = report.markdown_path.read_text()
    assert f"`{failure.replay}`" in markdown
    assert "no step after the restart" in markdown


def test_chaos_json_holds_run_rows_and_total(tmp_path: Path) -> None:
    out = _mixed_run(tmp_path)
    report = write_report(out)
    data = json.loads((out / "chaos.json").read_text())
    assert report.json_path == out / "chaos.json"
    assert data["run"]["torch"] == "2.9.0+cpu"
    assert data["total"] == report.total
    kill = data["scenarios"][0]
    assert kill["failures"][0]["replay"].endswith("--only kill --trial 2")
    assert {"name", "kind", "trials", "planned", "ttr_median_s", "ttr_p90_s", "duration_median_s"} <= set(
        kill
    )
    assert "ttrs_s" not in kill


def test_markdown_table_and_header(tmp_path: Path) -> None:
    markdown = write_report(_mixed_run(tmp_path)).markdown_path.read_text()
    assert markdown.startswith("# Chaos report\n")
    assert "torch 2.9.0+cpu · 2 cores · seed 7 · 2023-11-14 22:13 UTC" in markdown
    assert "| scenario | kind | trials | recovered | lost data | median TTR (s) | max TTR (s) |" in markdown
    assert "| kill ✗ | kill-rank | 4 | 3/4 | 0 | 2.00 | 4.00 |" in markdown
    assert "| hang ✗ | hang | 2/3 | 2/2 | 3 | 4.00 | 5.00 |" in markdown  # lost data marks it too
    assert "| extra | oom | 1 | 1/1 | 0 | — | — |" in markdown
    assert "**FAIL**" in markdown


def test_all_recovered_passes_with_no_failures(tmp_path: Path) -> None:
    out = _write(tmp_path / "out", [_trial("kill", 0), _trial("kill", 1)], _run([("kill", "kill-rank", 2)]))
    report = write_report(out)
    assert report.ok
    assert report.markdown_path.read_text().endswith("## Failures\n\nnone\n")
    assert "**PASS**" in report.markdown_path.read_text()


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    torn = json.dumps(_trial("kill", 2))[:40]  # killed mid-write: no closing brace, no newline
    out = _write(tmp_path / "out", [_trial("kill", 0), _trial("kill", 1)], _run([("kill", "x", 3)]), torn)
    report = write_report(out)
    assert (report.rows[0].trials, report.rows[0].planned) == (2, 3)
    assert report.total["unreadable_lines"] == 1
    assert "| kill | x | 2/3 |" in report.markdown_path.read_text()
    assert "1 unreadable line(s)" in report.markdown_path.read_text()


def test_read_trials_skips_blank_and_non_object_lines(tmp_path: Path) -> None:
    path = tmp_path / "trials.jsonl"
    path.write_text(json.dumps(_trial("a", 0)) + "\n\n[1, 2]\n" + json.dumps({"no": "scenario"}) + "\n")
    rows, unreadable = read_trials(path)
    assert [r["scenario"] for r in rows] == ["a"]
    assert unreadable == 2


def test_pipe_in_detail_is_escaped(tmp_path: Path) -> None:
    bad = _trial("kill", 0, recovered=False, detail="rank 1 | rank 2 hung\nthen exited")
    report = write_report(_write(tmp_path / "out", [bad], _run([("kill", "kill-rank", 1)])))
    markdown = report.markdown_path.read_text()
    assert "rank 1 \\| rank 2 hung\\nthen exited" in markdown
    assert escape_cell("a|b") == "a\\|b"


def test_harness_error_is_a_failure(tmp_path: Path) -> None:
    err = _trial("kill", 0, recovered=False, ttr=None, detail="", error="TimeoutError: trial ran 600 s")
    report = write_report(_write(tmp_path / "out", [err], _run([("kill", "kill-rank", 1)])))
    (failure,) = report.rows[0].failures
    assert failure.detail == failure.error == "TimeoutError: trial ran 600 s"


def test_missing_run_json_is_derived_from_trials(tmp_path: Path) -> None:
    out = _write(tmp_path / "out", [_trial("b", 0, kind="oom"), _trial("a", 0)])
    report = write_report(out)
    assert [(r.name, r.kind, r.planned) for r in report.rows] == [
        ("b", "oom", None),
        ("a", "kill-rank", None),
    ]
    markdown = report.markdown_path.read_text()
    assert "torch unknown · unknown cores · seed 7 · 2023-11-14 22:13 UTC" in markdown
    assert json.loads(report.json_path.read_text())["run"] == {}


def test_planned_scenario_without_trials_shows_zero(tmp_path: Path) -> None:
    out = _write(tmp_path / "out", [], _run([("kill", "kill-rank", 5)]))
    report = write_report(out)
    assert (report.rows[0].trials, report.rows[0].planned) == (0, 5)
    assert "| kill | kill-rank | 0/5 | 0/0 | 0 | — | — |" in report.markdown_path.read_text()
    assert (report.verdict, report.ok) == ("INCOMPLETE", False)


def test_a_run_killed_half_way_is_incomplete_not_pass(tmp_path: Path) -> None:
    """Only finished rows counted: 0 of 2 trials of a scenario read PASS, and chaos report exit 0."""
    from typer.testing import CliRunner

    from hpcpipe.cli import chaos as chaos_cli

    run = _run([("ok", "always_pass", 2), ("bad", "must_fail", 2)])
    out = _write(tmp_path / "out", [_trial("ok", 0)], run)
    report = write_report(out)
    assert (report.verdict, report.ok) == ("INCOMPLETE", False)
    total = json.loads(report.json_path.read_text())["total"]
    assert (total["trials"], total["planned"], total["complete"]) == (1, 4, False)
    assert [s["complete"] for s in json.loads(report.json_path.read_text())["scenarios"]] == [False, False]
    assert "**INCOMPLETE**: 1/1 trials recovered, 0 lost" in report.markdown_path.read_text()
    assert "3 of 4 planned trials never ran (ok 1/2, bad 0/2)" in report.markdown_path.read_text()
    assert CliRunner().invoke(chaos_cli.app, ["report", str(out)]).exit_code == 1

    finished = _write(tmp_path / "done", [_trial("ok", t) for t in range(2)], _run([("ok", "x", 2)]))
    assert (write_report(finished).verdict, write_report(finished).total["complete"]) == ("PASS", True)
    assert CliRunner().invoke(chaos_cli.app, ["report", str(finished)]).exit_code == 0


def test_rows_of_other_trial_indices_do_not_complete_a_scenario(tmp_path: Path) -> None:
    """Rows were counted: trials 7, 0 and 1 of 3 planned read PASS though trial 2 never ran."""
    run = _run([("kill", "kill-rank", 3)])
    out = _write(tmp_path / "out", [_trial("kill", t) for t in (7, 0, 1)], run)
    report = write_report(out)
    (row,) = report.rows
    assert (row.trials, row.ran, row.planned, row.missing, row.complete) == (3, 2, 3, 1, False)
    assert (report.verdict, report.total["planned"], report.total["missing"]) == ("INCOMPLETE", 3, 1)
    markdown = report.markdown_path.read_text()
    assert "| kill | kill-rank | 2/3 | 3/3 |" in markdown
    assert "1 of 3 planned trials never ran (kill 2/3)" in markdown

    # A replay plans the index it reruns (run.json lists it): its one row completes it.
    run["scenarios"] = [{"name": "kill", "kind": "kill-rank", "trials": 1, "indices": [7]}]
    replay = _write(tmp_path / "replay", [_trial("kill", 7)], run)
    assert write_report(replay).verdict == "PASS"
    assert write_report(_write(tmp_path / "other", [_trial("kill", 0)], run)).verdict == "INCOMPLETE"


def test_png_is_written(tmp_path: Path) -> None:
    report = write_report(_mixed_run(tmp_path))
    assert report.plot_path == tmp_path / "out" / "chaos-ttr.png"
    assert report.plot_skipped is None
    assert report.plot_path.read_bytes()[:8] == PNG_MAGIC
    assert "![time to recover per scenario](chaos-ttr.png)" in report.markdown_path.read_text()


def test_png_with_a_wide_spread_uses_a_log_axis(tmp_path: Path) -> None:
    trials = [_trial("kill", 0, ttr=0.05), _trial("kill", 1, ttr=300.0), _trial("hang", 0, ttr=2.0)]
    report = write_report(_write(tmp_path / "out", trials))
    assert report.plot_path is not None
    assert report.plot_path.read_bytes()[:8] == PNG_MAGIC


def test_no_ttr_means_no_plot(tmp_path: Path) -> None:
    out = _write(tmp_path / "out", [_trial("kill", 0, ttr=None), _trial("kill", 1, ttr=None)])
    (out / "chaos-ttr.png").write_bytes(PNG_MAGIC)  # a stale plot from an earlier report
    report = write_report(out)
    assert report.plot_path is None
    assert report.plot_skipped == "no trial measured a time to recover"
    assert not (out / "chaos-ttr.png").exists()
    assert (report.rows[0].ttr_median_s, report.rows[0].ttr_max_s, report.rows[0].ttr_p90_s) == (None,) * 3
    assert "chaos-ttr.png" not in report.markdown_path.read_text()


def test_p90_interpolates_between_ranks() -> None:
    assert p90([5.0]) == 5.0
    assert p90([float(x) for x in range(1, 11)]) == pytest.approx(9.1)  # numpy.percentile(1..10, 90)


def test_missing_directory_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"does not exist; run `hpcpipe chaos run SCENARIOS.yaml --out"):
        write_report(tmp_path / "nowhere")


def test_file_instead_of_directory_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a directory"):
        write_report(tmp_path / "file")


def test_missing_trials_jsonl_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError) as caught:
        write_report(tmp_path / "out")
    message = str(caught.value)
    assert "trials.jsonl not found" in message
    assert "hpcpipe chaos run" in message
    assert "\n" not in message


def test_scenarios_this_host_could_not_run_are_named_beside_the_verdict(tmp_path: Path) -> None:
    """Without root, disk-full was left out with a line on stderr only: chaos.md's PASS read as
    covering the whole file."""
    run = {**_run([("kill", "kill-rank", 1)]), "skipped": [{"name": "disk-full", "why": "it needs root"}]}
    report = write_report(_write(tmp_path / "out", [_trial("kill", 0, ttr=1.0)], run))
    text = report.markdown_path.read_text()
    assert "Not run here, so not covered by this verdict: disk-full (it needs root)." in text
    assert (
        "Not run here"
        not in write_report(_write(tmp_path / "b", [_trial("kill", 0)], _run([]))).markdown_path.read_text()
    )
