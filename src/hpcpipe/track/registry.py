"""The MLflow model registry: a run's export as a new model version, with its lineage.

``register_run`` uploads the export directory into the run's MLflow run
(``model/<export name>``: each export its own folder, so a version registered earlier never
changes its files) and registers ``runs:/<id>/model/<export name>`` as a new version of NAME.
The version's tags say what made it: the hpcpipe run, git SHA, config hash, dataset manifest
hash, and the evaluation metrics; aliases (MLflow 3: ``champion``, ``candidate``...; stages
are deprecated) point at it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.config.pipeline import alias_problem
from hpcpipe.errors import UserError
from hpcpipe.fsutil import read_json_object
from hpcpipe.layout import RunLayout
from hpcpipe.track.mlflow_client import artifact_uploads, recorded_run
from hpcpipe.track.params import lineage_tags

REGISTRY_FILE = Path(RunLayout.TRACKING, RunLayout.REGISTRY)  # relative to the run directory


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    aliases: list[str]
    source: str


def newest_export(run_dir: Path) -> Path:
    """The most recently written directory under ``<run_dir>/export``."""
    export = RunLayout(run_dir).export
    exports = [p for p in export.glob("*") if p.is_dir()] if export.is_dir() else []
    if not exports:
        raise UserError(
            f"{run_dir}: no export (export/<step>-<format>); "
            "make one with `hpcpipe ckpt export` or `hpcpipe run`"
        )
    return max(exports, key=lambda p: p.stat().st_mtime)


def version_tags(run_dir: Path, export: Path) -> dict[str, str]:
    tags = lineage_tags(run_dir) | {"hpcpipe.run": run_dir.name, "hpcpipe.export": export.name}
    for key, value in (read_json_object(RunLayout(run_dir).eval).get("metrics") or {}).items():
        tags[f"eval.{key}"] = str(value)
    return tags


def register_run(
    client: Any, run_dir: Path, name: str, aliases: list[str], export: Path | None = None
) -> Registered:
    """A new version of ``name`` from the run's export; the run must be in MLflow (sync first)."""
    export = export or newest_export(run_dir)
    if not export.is_dir() or not any(export.iterdir()):
        raise UserError(f"{export}: not an export directory (export/<step>-<format> with its files)")
    problems = [p for p in map(alias_problem, aliases) if p]
    if problems:
        raise UserError(problems[0])
    run_id = recorded_run(run_dir).get("run_id")
    if not run_id:
        raise UserError(
            f"{run_dir}: not in MLflow yet (no tracking/mlflow.json); run `hpcpipe track sync {run_dir}`"
        )
    artifact_path = f"model/{export.name}"
    client.get_run(run_id)  # a hung server is named after one metadata timeout, not an upload's
    with artifact_uploads():
        client.log_artifacts(run_id, str(export), artifact_path)
    try:
        client.create_registered_model(name, description="Registered by hpcpipe.")
    except Exception as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
            raise
    source = f"runs:/{run_id}/{artifact_path}"
    version = client.create_model_version(
        name, source=source, run_id=run_id, tags=version_tags(run_dir, export),
        description=f"hpcpipe run {run_dir.name}, export {export.name}",
    )  # fmt: skip
    for alias in aliases:
        client.set_registered_model_alias(name, alias, version.version)
    made = Registered(name, str(version.version), list(aliases), source)
    path = run_dir / REGISTRY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(made.__dict__, indent=2) + "\n")
    return made


def list_models(client: Any) -> list[dict[str, Any]]:
    """Every registered model (MLflow answers a page of at most 100 at a time)."""
    rows, token = [], None
    while True:
        page = client.search_registered_models(max_results=100, page_token=token)
        for model in page:
            latest = max((int(v.version) for v in model.latest_versions or []), default=None)
            rows.append({"name": model.name, "latest_version": latest, "aliases": dict(model.aliases or {})})
        token = getattr(page, "token", None)
        if not token:
            return rows


def show_model(client: Any, name: str) -> dict[str, Any]:
    try:
        model = client.get_registered_model(name)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc) or "not found" in str(exc).lower():
            raise UserError(f"no registered model named {name!r} (see `hpcpipe models list`)") from None
        raise
    by_version: dict[str, list[str]] = {}
    for alias, version in (model.aliases or {}).items():
        by_version.setdefault(str(version), []).append(alias)
    quoted = name.replace("'", "\\'")
    versions = client.search_model_versions(f"name='{quoted}'")
    return {
        "name": model.name,
        "versions": [
            {
                "version": str(v.version),
                "aliases": sorted(by_version.get(str(v.version), [])),
                "run_id": v.run_id,
                "source": v.source,
                "tags": dict(v.tags or {}),
            }
            for v in sorted(versions, key=lambda v: int(v.version))
        ],
    }
