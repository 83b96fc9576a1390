"""An `hpcpipe hpo` study directory in `hpcpipe report`: its trials table and Optuna's plots.

Reads files only (``study.json``, ``trials.csv``, ``plots/*.png``, written by ``hpo run``,
``status`` and ``plots``), never the study's storage: a report needs no database password.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hpcpipe.errors import UserError
from hpcpipe.fsutil import read_json_strict
from hpcpipe.layout import StudyLayout
from hpcpipe.report.run_tables import Table, fmt

FIXED_COLUMNS = ("number", "state", "value", "last_step", "seconds", "retry_of", "run_dir", "note")


def is_hpo_study(path: Path) -> bool:
    layout = StudyLayout(path)
    return layout.record.is_file() and layout.trials.is_dir()


def hpo_study_parts(path: Path) -> tuple[str, list[Table], list[Path]]:
    """The section's title, its trials table (when trials.csv exists) and the plot files."""
    layout = StudyLayout(path)
    try:
        record = read_json_strict(layout.record)
    except (OSError, ValueError) as exc:
        raise UserError(str(exc)) from None
    title = f"Hyper-parameter study {record.get('study')} ({record.get('metric')}, {record.get('storage')})"
    tables = []
    if layout.trials_csv.is_file():
        with layout.trials_csv.open(newline="") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
        missing = [
            c
            for c in ("number", "state", "value", "last_step", "seconds")
            if c not in (reader.fieldnames or [])
        ]
        if missing:
            raise UserError(f"{layout.trials_csv}: no {', '.join(missing)} column (written by hpcpipe hpo?)")
        params = [c for c in (rows[0].keys() if rows else []) if c not in FIXED_COLUMNS]
        header = ["trial", "state", str(record.get("metric")), "last step", "seconds", *params]
        body = [
            [
                r["number"],
                _state(r),
                _num(r["value"]),
                r["last_step"] or "-",
                _num(r["seconds"]),
                *(_num(r[p]) for p in params),
            ]
            for r in rows
        ]
        tables.append(Table("Trials", header, body))
    plots = sorted(layout.plots.glob(StudyLayout.PLOT.format(name="*"))) if layout.plots.is_dir() else []
    return title, tables, plots


def _state(row: dict[str, Any]) -> str:
    return row["state"] + (f" (retry of {row['retry_of']})" if row.get("retry_of") else "")


def _num(text: str) -> str:
    try:
        return fmt(float(text))
    except (TypeError, ValueError):
        return text or "-"
