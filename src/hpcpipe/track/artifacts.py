"""Files of a run directory that go to its MLflow run as artifacts (sink, sync and pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcpipe.layout import RunLayout

RUN_FILES = (
    RunLayout.CONFIG,
    RunLayout.LINEAGE,
    RunLayout.SUMMARY,
    RunLayout.EVAL,
    RunLayout.LOSS_CURVE,
    RunLayout.SAMPLE,
)
REPORT_GLOBS = (RunLayout.REPORT_MARKDOWN, RunLayout.REPORT_HTML, "*.png", "series.csv")


def artifact_files(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) pairs that exist: the run's own files, then its report."""
    found: list[tuple[Path, str | None]] = [(run_dir / n, None) for n in RUN_FILES if (run_dir / n).is_file()]
    report = RunLayout(run_dir).report
    for pattern in REPORT_GLOBS:
        found += [(p, RunLayout.REPORT) for p in sorted(report.glob(pattern)) if p.is_file()]
    return found


def log_run_artifacts(client: Any, run_id: str, run_dir: Path) -> int:
    """Upload ``artifact_files``; returns how many (an existing artifact is overwritten)."""
    files = artifact_files(run_dir)
    for path, folder in files:
        client.log_artifact(run_id, str(path), folder)
    return len(files)
