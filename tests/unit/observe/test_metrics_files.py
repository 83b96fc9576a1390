"""metrics.jsonl and events.jsonl as the trainer opens and every later tool reads them."""

from __future__ import annotations

import json
from pathlib import Path

from hpcpipe.observe.metrics import MetricsSink, read_events, read_metrics, trained_to_the_end


def _sink_run(run_dir: Path, start_step: int, rows: list[dict[str, float]]) -> None:
    sink = MetricsSink(run_dir, start_step=start_step)
    for row in rows:
        sink.write(row)
    sink.close()


def test_a_fresh_start_replaces_the_history_and_a_resume_continues_it(tmp_path: Path) -> None:
    """A second fresh run in the same directory kept the first one's step-0 evaluation: the report
    gave the earlier run's first val loss, and the table listed step 0 twice."""
    _sink_run(tmp_path, 0, [{"step": 0, "val_loss": 5.0}, {"step": 1, "loss": 4.0}, {"step": 2, "loss": 3.0}])
    _sink_run(tmp_path, 0, [{"step": 0, "val_loss": 6.0}, {"step": 1, "loss": 5.5}])
    assert read_metrics(tmp_path) == [{"step": 0, "val_loss": 6.0}, {"step": 1, "loss": 5.5}]
    _sink_run(tmp_path, 1, [{"step": 2, "loss": 5.0}])  # resumed from step 1's checkpoint
    assert [row["step"] for row in read_metrics(tmp_path)] == [0, 1, 2]
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 4  # the header and three rows


def test_lines_that_are_not_rows_are_skipped(tmp_path: Path) -> None:
    """A JSON line that is not an object ended `report` and `profile` in an AttributeError."""
    rows = ['{"step": 1, "loss": 2.0}', "[1, 2]", "null", '"text"', '{"step": 2, "lo']
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    (tmp_path / "events.jsonl").write_text('{"event": "started"}\n[]\n')
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}]
    assert read_events(tmp_path) == [{"event": "started"}]
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1


def test_a_run_counted_in_epochs_is_finished_at_its_epochs(tmp_path: Path) -> None:
    """train.steps is unused when train.epochs is set: a finished epoch run (step 469 of a default
    train.steps of 100) never read as finished, so track sync left it RUNNING."""
    events = [
        {"event": "run_finished", "step": 20, "world_size": 1, "epochs": None},
        {"event": "run_finished", "step": 469, "world_size": 1, "epochs": 2.0},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert trained_to_the_end(tmp_path, 20) and not trained_to_the_end(tmp_path, 40)
    assert trained_to_the_end(tmp_path, 100, epochs=2.0) and not trained_to_the_end(tmp_path, 100, epochs=3.0)
