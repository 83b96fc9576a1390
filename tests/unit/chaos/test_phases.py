"""A recovery split into phases: milestones from a synthetic run record (chaos/phases.py), and the
report's per-phase table (chaos/report.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.chaos.phases import OTHER, milestones, split
from hpcpipe.chaos.report import write_report

pytestmark = pytest.mark.timeout(60)

T = 1_800_000_000.0  # the fault


def _restart_record() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Events and metrics rows of a run killed at T and restarted by its agent."""
    events = [
        {"time": T - 5.0, "event": "group_start", "restart_count": 0, "pg_up": T - 6.0},
        {
            "time": T + 0.50,
            "event": "agent_restart",
            "failure_seen": T + 0.10,
            "workers_stopped": T + 0.30,
            "rendezvous_done": T + 0.40,
            "workers_started": T + 0.45,
        },
        {
            "time": T + 0.90,
            "event": "group_start",
            "restart_count": 1,
            "worker_start": T + 0.50,
            "worker_running": T + 0.60,
            "pg_up": T + 0.70,
        },
        {"time": T + 1.50, "event": "resumed", "step": 8, "restore_s": 0.25},
    ]
    rows = [{"step": 10, "loss": 2.0, "time": T - 0.2}, {"step": 9, "loss": 2.1, "time": T + 1.75}]
    return events, rows


def test_a_restart_splits_into_phases_that_add_up_to_the_ttr() -> None:
    events, rows = _restart_record()
    found = milestones(events, rows, T)
    assert found["failure_seen"] == T + 0.10 and found["pg_up"] == T + 0.70  # not the first start's
    assert found["restore_start"] == pytest.approx(T + 1.25) and found["first_step"] == T + 1.75
    phases = split(found, T)
    assert phases == pytest.approx(
        {
            "detection": 0.10,
            "teardown": 0.20,
            "rendezvous": 0.10 + 0.10,  # the agent's round, then init_process_group
            "spawn_import": 0.05 + 0.05 + 0.10,
            "setup": 0.55,
            "restore": 0.25,
            "first_step": 0.25,
            OTHER: 0.0,
        }
    )
    assert sum(phases.values()) == pytest.approx(1.75)  # the TTR


def test_missing_milestones_go_to_their_phase_or_to_other() -> None:
    events, rows = _restart_record()
    events = [e for e in events if e["event"] != "resumed"]  # restarted with no checkpoint to restore
    phases = split(milestones(events, rows, T), T)
    assert phases is not None and "restore" not in phases and "setup" not in phases
    assert phases[OTHER] == pytest.approx(1.05)  # pg_up -> first step spans setup, restore, first step
    # A new `hpcpipe train` recovered (no agent): its start-up, and setup to the first step, are other.
    no_agent = split({"worker_running": T + 3.0, "pg_up": T + 3.5, "first_step": T + 4.0}, T)
    assert no_agent == pytest.approx({OTHER: 3.0 + 0.5, "rendezvous": 0.5})
    assert split({"failure_seen": T + 1.0}, T) is None  # no step after the fault: no phases


def test_out_of_order_milestones_are_skipped() -> None:
    phases = split({"failure_seen": T + 0.2, "workers_stopped": T + 0.1, "first_step": T + 1.0}, T)
    assert phases == pytest.approx({"detection": 0.2, OTHER: 0.8})


def test_report_tables_phases_per_scenario(tmp_path: Path) -> None:
    def row(trial: int, **phases: float) -> dict[str, Any]:
        return {
            "scenario": "kill",
            "kind": "kill_rank",
            "trial": trial,
            "recovered": True,
            "ttr_s": sum(phases.values()),
            "phases": {**phases, OTHER: 0.0},
        }

    trials = [
        row(0, detection=0.1, teardown=0.0, restore=0.2, first_step=0.1),
        row(1, detection=0.3, teardown=0.1, restore=0.4, first_step=0.1),
        row(2, detection=0.2, teardown=0.0, first_step=0.5),  # no checkpoint yet: no restore
        {"scenario": "fuzz", "kind": "fuzz_config", "trial": 0, "recovered": True, "ttr_s": None},
    ]
    out = tmp_path / "out"
    out.mkdir()
    (out / "trials.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trials))
    report = write_report(out)
    kill, fuzz = report.rows
    assert kill.phase_trials == 3 and fuzz.phase_trials == 0
    assert kill.phase_median_s["detection"] == 0.2 and kill.phase_max_s["detection"] == 0.3
    assert kill.phase_median_s["restore"] == pytest.approx(0.3)  # over the two trials that restored
    assert "setup" not in kill.phase_median_s
    markdown = report.markdown_path.read_text()
    assert "## Time to recover by phase" in markdown
    header = "| scenario | trials | detection | teardown | spawn + import | rendezvous | setup | restore |"
    assert header in markdown
    assert (
        "| kill | 3 | 0.20 / 0.30 | 0.00 / 0.10 | — | — | — | 0.30 / 0.40 | 0.10 / 0.50 | 0.00 / 0.00 |"
        in markdown
    )
    assert "| fuzz |" not in markdown.split("## Time to recover by phase")[1]
    assert json.loads(report.json_path.read_text())["scenarios"][0]["phase_median_s"]["teardown"] == 0.0
    assert report.plot_path is not None and report.plot_path.read_bytes()[:4] == b"\x89PNG"
