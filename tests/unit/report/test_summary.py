"""summary.md of a hand-written run directory (config.yaml, metrics.jsonl, events.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from hpcpipe.report.summary import write_summary


def test_the_training_wall_time_counts_every_start_from_the_events(tmp_path: Path) -> None:
    """It was this invocation's train step alone, and was left out when train was skipped (a
    second `hpcpipe run` that re-ran only the report)."""
    config = {
        "run": {"name": "r", "recipe": "gpt"},
        "train": {"global_batch_size": 8, "lr": 0.003, "precision": "fp32"},
        "parallel": {"strategy": "ddp"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 20, "loss": 1.5}) + "\n")
    events = [
        {"time": 1000.0, "event": "group_start", "worker_start": 998.0},  # first start: 998 -> 1010
        {"time": 1005.0, "event": "checkpoint_committed", "step": 10},
        {"time": 1010.0, "event": "checkpoint_committed", "step": 15},  # then it crashed
        {"time": 1100.0, "event": "group_start", "worker_start": None},  # the restart: 1100 -> 1120
        {"time": 1120.0, "event": "run_finished", "step": 20},
        {"time": 1500.0, "event": "agent_restart", "node": "n1"},  # after the end: not training
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    text = write_summary(tmp_path).read_text()
    assert "- training wall time: 32 s over 2 starts (events.jsonl)" in text
    (tmp_path / "events.jsonl").unlink()  # no start recorded: nothing claimed
    assert "wall time" not in write_summary(tmp_path).read_text()


def test_the_downtime_before_a_restart_is_not_training_time(tmp_path: Path) -> None:
    """The worker writes restart and membership_change before the next group_start: a crashed
    start's span ran on to them, a day of downtime counted as training."""
    from hpcpipe.report.summary import training_wall_time

    t = 1000.0
    events = [
        {"time": t, "event": "group_start"},
        {"time": t + 10, "event": "checkpoint_committed", "step": 10},  # then it crashed
        {"time": t + 86400, "event": "restart", "restart_count": 1},
        {"time": t + 86400, "event": "membership_change", "old_world_size": 2, "new_world_size": 1},
        {"time": t + 86400.1, "event": "group_start"},
        {"time": t + 86420, "event": "run_finished", "step": 20},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    seconds, starts = training_wall_time(tmp_path) or (0.0, 0)
    assert (round(seconds, 1), starts) == (29.9, 2)
