"""Files of a run directory that go to its MLflow run as artifacts (sink, sync and pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcpipe.layout import ReportLayout, RunLayout

RUN_FILES = (
    RunLayout.CONFIG,
    RunLayout.LINEAGE,
    RunLayout.SUMMARY,
    RunLayout.EVAL,
    RunLayout.LOSS_CURVE,
    RunLayout.SAMPLE,
)
# The report folder's files: the report, its plots (by name), the rows they are drawn from.
REPORT_FILES = (
    ReportLayout.MARKDOWN,
    ReportLayout.HTML,
    *sorted((*ReportLayout.RUN_PLOTS, *ReportLayout.STUDY_PLOTS)),
    ReportLayout.SERIES,
)


def artifact_files(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) pairs that exist: the run's own files, then its report."""
    found: list[tuple[Path, str | None]] = [(run_dir / n, None) for n in RUN_FILES if (run_dir / n).is_file()]
    report = RunLayout(run_dir).report
    found += [(report / n, RunLayout.REPORT) for n in REPORT_FILES if (report / n).is_file()]
    return found


def log_run_artifacts(client: Any, run_id: str, run_dir: Path) -> int:
    """Upload ``artifact_files``; returns how many (an existing artifact is overwritten)."""
    from hpcpipe.track.mlflow_client import artifact_uploads

    files = artifact_files(run_dir)
    with artifact_uploads():
        for path, folder in files:
            client.log_artifact(run_id, str(path), folder)
    return len(files)
