"""Run directories read into memory, and their metrics as tidy ``run,step,series,value`` rows.

The rows are the single source of every run-report plot: they are written to ``series.csv`` and
the plots are drawn from the same rows, so any figure can be redrawn from the CSV alone. Events
become rows too (series ``event:<kind>``, value 1 at their step), because the loss plot marks them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout
from hpcpipe.observe.metrics import read_events, read_metrics
from hpcpipe.report.summary import run_summary

CSV_COLUMNS = ("run", "step", "series", "value")
GIB = 2**30
EVENT_PREFIX = "event:"
# Keys of a metrics row that are coordinates or wall-clock stamps, not series to plot.
NOT_SERIES = frozenset({"step", "time", "timestamp"})


class SeriesRow(NamedTuple):
    run: str
    step: int
    series: str
    value: float


@dataclass
class RunData:
    """Everything a report shows about one run directory, read once."""

    path: Path
    label: str
    config: dict[str, Any]
    lineage: dict[str, Any]
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    eval_result: dict[str, Any] | None = None
    rows: list[SeriesRow] = field(default_factory=list)


def is_run_dir(path: Path) -> bool:
    return RunLayout(path).config.is_file()


def find_run_dirs(root: Path, depth: int = 2) -> list[Path]:
    """Run directories (config.yaml and metrics.jsonl) among ``root``'s subdirectories, ``depth`` deep."""
    found: list[Path] = []
    level = [root]
    for _ in range(depth):
        level = sorted(child for parent in level for child in parent.iterdir() if child.is_dir())
        found += [d for d in level if is_run_dir(d) and RunLayout(d).metrics.is_file()]
    return sorted(found)


def load_run(run_dir: Path, label: str | None = None) -> RunData:
    """Read ``run_dir``; ``label`` (default: run.name) names the run in tables and series.csv."""
    try:
        summary = run_summary(run_dir)
    except (OSError, yaml.YAMLError, ValueError, TypeError, KeyError) as exc:
        raise UserError(f"{run_dir}: cannot read the run directory ({exc})") from None
    config = summary["config"] if isinstance(summary["config"], dict) else {}
    name = label or str(config.get("run", {}).get("name") or run_dir.name)
    run = RunData(
        path=run_dir,
        label=name,
        config=config,
        lineage=summary["lineage"] if isinstance(summary["lineage"], dict) else {},
        summary=summary,
        metrics=read_metrics(run_dir),
        events=read_events(run_dir),
        eval_result=_read_json(RunLayout(run_dir).eval),
    )
    run.rows = series_rows(run.label, run.metrics, run.events)
    return run


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc})") from None
    return value if isinstance(value, dict) else None


def _number(value: Any) -> float | None:
    # bool is an int subclass; a flag is not a series value.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def series_rows(run: str, metrics: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[SeriesRow]:
    """Every numeric value of every metrics row, plus one row per event that has a step."""
    rows = []
    for record in metrics:
        if _number(record.get("step")) is None:
            continue
        for key, raw in record.items():
            value = _number(raw)
            if key not in NOT_SERIES and value is not None:
                rows.append(SeriesRow(run, int(record["step"]), key, value))
    for event in events:
        if _number(event.get("step")) is not None:
            rows.append(SeriesRow(run, int(event["step"]), EVENT_PREFIX + str(event.get("event")), 1.0))
    return rows


def write_series_csv(rows: list[SeriesRow], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        writer.writerows((r.run, r.step, r.series, repr(r.value)) for r in rows)
    return path


def read_series_csv(path: Path) -> list[SeriesRow]:
    """The rows of a ``series.csv``, as written by :func:`write_series_csv`."""
    try:
        with path.open(newline="") as f:
            return [
                SeriesRow(r["run"], int(r["step"]), r["series"], float(r["value"])) for r in csv.DictReader(f)
            ]
    except (OSError, KeyError, ValueError, csv.Error) as exc:
        raise UserError(f"{path}: not a series.csv with columns {','.join(CSV_COLUMNS)} ({exc})") from None


def select(rows: list[SeriesRow], run: str, series: str) -> tuple[list[int], list[float]]:
    """Steps and values of one series of one run, in file order."""
    picked = [(r.step, r.value) for r in rows if r.run == run and r.series == series]
    return [s for s, _ in picked], [v for _, v in picked]


def runs_in(rows: list[SeriesRow]) -> list[str]:
    return list(dict.fromkeys(r.run for r in rows))


def series_in(rows: list[SeriesRow], run: str | None = None) -> set[str]:
    return {r.series for r in rows if run is None or r.run == run}
