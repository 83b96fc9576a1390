"""Metrics files of a run: ``metrics.jsonl`` (the contract) and ``metrics.csv``; ``events.jsonl``.

Only rank 0 writes. Rows are appended and flushed as they come, so a crashed run keeps every row
it logged. Opening a sink at ``start_step`` drops rows after that step: a resumed run continues
the history it resumed from instead of duplicating it. A run that starts from step 0 (no
checkpoint to resume) starts an empty history: it evaluates step 0 again itself.
"""

from __future__ import annotations

import csv
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpcpipe.layout import RunLayout
from hpcpipe.observe.event_kinds import check_event, checking_events

TRAIN_KEYS = (
    "step",
    "loss",
    "lr",
    "grad_norm",
    "skipped_steps",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "samples_per_s",
    "samples_per_s_per_device",
    "mfu",
    "step_time_s",
    "data_time_s",
    "mem_bytes",
    "world_size",
    "forward_time_s",
    "backward_time_s",
    "optimizer_time_s",
    "comm_time_s",
    "gpu_util_ratio",
    "imbalance",
    "slowest_rank",
    "epoch",
    "time_per_epoch_s",
)
EVAL_KEYS = ("val_loss", "val_ppl", "val_acc")
CSV_KEYS = (*TRAIN_KEYS, *EVAL_KEYS)


class MetricsSink:
    def __init__(self, run_dir: Path, start_step: int = 0) -> None:
        layout = RunLayout(run_dir)
        self.jsonl_path = layout.metrics
        self.csv_path = layout.metrics_csv
        rows = read_metrics(run_dir) if start_step > 0 else []
        kept = [row for row in rows if int(row.get("step", 0)) <= start_step]
        self._jsonl = self.jsonl_path.open("w")
        self._csv_file = self.csv_path.open("w", newline="")
        self._csv = csv.DictWriter(self._csv_file, fieldnames=CSV_KEYS, extrasaction="ignore")
        self._csv.writeheader()
        for row in kept:
            self.write(row)

    def write(self, row: dict[str, Any]) -> None:
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        self._csv.writerow(row)
        self._csv_file.flush()

    def close(self) -> None:
        self._jsonl.close()
        self._csv_file.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``metrics.jsonl`` (empty when absent); a torn last line is skipped."""
    return _json_rows(RunLayout(run_dir).metrics)


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``events.jsonl`` (empty when absent); a torn line is skipped."""
    return _json_rows(RunLayout(run_dir).events)


def _json_rows(path: Path) -> list[dict[str, Any]]:
    """The JSON objects, one per line, of ``path``: a line torn by a crash, or one that holds
    another JSON value (``null``, a list: not a row hpcpipe writes), is skipped."""
    rows = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def trained_to_the_end(run_dir: Path, steps: int, epochs: float | None = None) -> bool:
    """A ``run_finished`` event of this length: at ``steps``, or, for a job counted in epochs
    (``train.steps`` then unused), at ``epochs`` (an event written before it recorded them counts).
    One of an earlier, shorter run is not."""
    for event in read_events(run_dir):
        if event.get("event") != "run_finished":
            continue
        if epochs is None and event.get("step") == steps and event.get("epochs") is None:
            return True
        if epochs is not None and event.get("epochs", epochs) == epochs:
            return True
    return False


def append_event(run_dir: Path, kind: str, **fields: Any) -> None:
    """One line in ``events.jsonl`` (restarts, OOM recoveries, checkpoint commits, ...)."""
    if checking_events():  # the suite's contract check (event_kinds.py); never in production
        check_event(kind, fields)
    row = {"time": time.time(), "event": kind, **fields}
    with RunLayout(run_dir).events.open("a") as f:
        f.write(json.dumps(row) + "\n")


class EventLog:
    """``events.jsonl`` of a run, written by one rank; safe to call from background threads.

    ``listeners`` (the Prometheus exporter) hear every event on every rank, written or not.
    ``context`` (OpenTelemetry tracing, ``otel_steps.py``), when set, is asked once per event for
    the fields that join its line to a trace (``trace_id``, ``span_id``); unset, lines are as
    they always were.
    """

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.run_dir = run_dir
        self.enabled = enabled
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        self.context: Callable[[str, dict[str, Any]], dict[str, str]] | None = None
        self._lock = threading.Lock()

    def emit(self, kind: str, fields: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener(kind, fields)
        context = self.context
        ids = context(kind, fields) if context is not None else {}
        if not self.enabled:
            return
        with self._lock:
            append_event(self.run_dir, kind, **fields, **ids)
