"""Files of a run directory that go to its MLflow run as artifacts (sink, sync and pipeline)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

RUN_FILES = ("config.yaml", "lineage.json", "summary.md", "eval.json", "loss_curve.png", "sample.txt")
REPORT_GLOBS = ("report.md", "report.html", "*.png", "series.csv")


def artifact_files(run_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, artifact folder) pairs that exist: the run's own files, then its report."""
    found: list[tuple[Path, str | None]] = [(run_dir / n, None) for n in RUN_FILES if (run_dir / n).is_file()]
    report = run_dir / "report"
    for pattern in REPORT_GLOBS:
        found += [(p, "report") for p in sorted(report.glob(pattern)) if p.is_file()]
    return found


def log_run_artifacts(client: Any, run_id: str, run_dir: Path) -> int:
    """Upload ``artifact_files``; returns how many (an existing artifact is overwritten)."""
    files = artifact_files(run_dir)
    for path, folder in files:
        client.log_artifact(run_id, str(path), folder)
    return len(files)
