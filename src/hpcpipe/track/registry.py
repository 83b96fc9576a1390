"""The MLflow model registry: a run's export as a new model version, with its lineage.

``register_run`` uploads the files of a finished export into the run's MLflow run
(``model/<export name>-<content sha256[:12]>``: the same files reuse their folder, other files,
even from the folder exported again, go to another, so a version registered earlier never
changes its files) and registers ``runs:/<id>/model/<export name>-<hash>`` as a new version of
NAME. The version's tags say what made it: the hpcpipe run, git SHA, config hash, dataset
manifest hash, and the evaluation metrics of the checkpoint it was exported from; aliases
(MLflow 3: ``champion``, ``candidate``...; stages are deprecated) point at it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.checkpoint.export_record import (
    ADAPTER_COMPANIONS,
    LOCK,
    MARKER,
    PARTIAL,
    export_record,
    finished_files,
    reading,
    runs_own,
)
from hpcpipe.checkpoint.manifest import step_dir_name
from hpcpipe.config.pipeline import alias_problem
from hpcpipe.errors import UserError
from hpcpipe.fsutil import read_json_object
from hpcpipe.layout import RunLayout
from hpcpipe.track.mlflow_client import artifact_uploads, recorded_run, server_run
from hpcpipe.track.params import lineage_tags

REGISTRY_FILE = Path(RunLayout.TRACKING, RunLayout.REGISTRY)  # relative to the run directory
log = logging.getLogger("hpcpipe.track")


@dataclass(frozen=True)
class Registered:
    name: str
    version: str
    aliases: list[str]
    source: str


def newest_export(run_dir: Path) -> Path:
    """The export of the newest checkpoint under ``<run_dir>/export``, the adapter the training
    wrote at its end among them (their records give their steps; a folder's modification time
    does not: re-exporting an old checkpoint touches it). A default folder written before records
    existed is left out: it was written in place, so a kill may have cut it short unseen (only
    ``--export`` takes it). An adapter written then is taken only when nothing else is there
    (one line says so). A folder with nothing but a staging folder (and the lock) is an export
    being written, or one killed before it moved in: left out, and said so."""
    layout = RunLayout(run_dir)
    folders = [p for p in layout.export.glob("*") if p.is_dir() and any(p.iterdir())]  # empty: nothing
    found = [p for p in folders if (p / MARKER).is_file()]
    staged = sorted(p for p in folders if p not in found and _only_staged(p))
    folders = [p for p in folders if p not in staged]
    adapter = layout.adapter if layout.adapter in folders and layout.adapter not in found else None
    older = sorted(p for p in folders if p not in found and p != adapter and runs_own(p, run_dir))
    if found:
        if adapter is not None:
            log.warning(
                "%s: left out, written before adapters recorded their step; pass --export to register it",
                adapter,
            )
        if older:
            log.warning("%s: left out, %s; %s", ", ".join(map(str, older)), _UNCHECKED, _ASK)
        if staged:
            log.warning("%s: left out, %s", ", ".join(map(str, staged)), _STAGED)
        return max(found, key=_newest_first)
    if adapter is not None:
        log.warning("%s: registering it, the only export (its step is unrecorded)", adapter)
        return adapter
    if older:
        raise UserError(
            f"{', '.join(map(str, older))}: {_UNCHECKED}; {_ASK}, or export again with `hpcpipe ckpt export`"
        )
    if staged:
        raise UserError(f"{', '.join(map(str, staged))}: {_STAGED}; wait for it, or export again")
    raise UserError(
        f"{run_dir}: no export (export/<step>-<format>); make one with `hpcpipe ckpt export` or `hpcpipe run`"
    )


# An export folder of the run's own without a record: older hpcpipe wrote it in place, unstaged.
_UNCHECKED = "written before export records, so whether a kill cut it short cannot be checked"
_ASK = "pass --export to register it"
_STAGED = "an export still being written, or one killed before it finished (only its staging folder is there)"


def _only_staged(folder: Path) -> bool:
    """``folder`` holds nothing but staging folders (``.partial-*``) and the export lock."""
    return all(p.name == LOCK or p.name.startswith(PARTIAL) for p in folder.iterdir())


def _newest_first(export: Path) -> tuple[int, float]:
    """By step; of one step, the latest written (its record, else its folder)."""
    step, marker = _export_step(export), export / MARKER
    return (-1 if step is None else step, (marker if marker.is_file() else export).stat().st_mtime)


def _export_step(export: Path) -> int | None:
    """The step of the checkpoint an export was made from (the adapter's: the step trained to):
    its record's, else its folder name's."""
    record = export_record(export) or {}
    if isinstance(record.get("step"), int):
        return int(record["step"])
    checkpoint = record.get("checkpoint")
    return _step_of(Path(str(checkpoint)).name if checkpoint else export.name)


def _step_of(name: str | None) -> int | None:
    found = re.match(r"step-(\d+)", name or "")
    return int(found[1]) if found else None


def export_files(run_dir: Path, export: Path) -> list[str]:
    """What to upload: the finished export's files (never a killed export's staging folder); of
    the run's adapter also what was written beside it for it (its call threshold, its decline
    rule)."""
    files = set(finished_files(export, before_records=runs_own(export, run_dir)))
    if runs_own(export, run_dir) and export.name == RunLayout.ADAPTER:
        files |= {name for name in ADAPTER_COMPANIONS if _set_on_these_weights(export / name)}
    return sorted(files)


def _set_on_these_weights(companion: Path) -> bool:
    """``companion`` (beside the run's adapter) was set on the adapter's weights there now; else
    one line says why it is left out. Training again without ``lora.calibration_cases``
    re-exports the adapter and leaves the earlier weights' files beside it. One without a hash
    predates hashes; beside an adapter with a record (written since), it is certainly stale."""
    from hpcpipe.evaluate.calibrate import set_on_this_adapter

    if not companion.is_file():
        return False
    try:
        saved = json.loads(companion.read_text())
    except (OSError, ValueError):
        saved = None
    if not isinstance(saved, dict):
        log.warning("%s: left out, not a JSON object; calibrate again", companion)
        return False
    recorded = saved.get("adapter_sha256")
    if recorded is None and not (companion.parent / MARKER).is_file():
        return True  # both from before records and hashes: nothing to check against
    if recorded is None or not set_on_this_adapter(str(recorded), companion.parent):
        log.warning(
            "%s: left out, set on an earlier adapter, not the one there now; calibrate again", companion
        )
        return False
    return True


def version_tags(run_dir: Path, export: Path) -> dict[str, str]:
    """Lineage, and eval.json's metrics when they are of the checkpoint the export was made from."""
    tags = lineage_tags(run_dir) | {"hpcpipe.run": run_dir.name, "hpcpipe.export": export.name}
    evaluated = read_json_object(RunLayout(run_dir).eval)
    metrics = evaluated.get("metrics") or {}
    step = _export_step(export)
    if metrics and (step is None or _step_of(evaluated.get("checkpoint")) != step):
        of = "an unrecorded step" if step is None else step_dir_name(step)
        log.warning(
            "%s: no eval.* tags: eval.json evaluated checkpoint %s, the export is of %s",
            export, evaluated.get("checkpoint"), of,
        )  # fmt: skip
        return tags
    for key, value in metrics.items():
        tags[f"eval.{key}"] = str(value)
    return tags


def content_sha256(export: Path, files: list[str]) -> str:
    """One hash over the export's files (relative path and content): the artifact folder's name,
    so a folder exported again with other content is uploaded beside, not over, the earlier one."""
    digest = hashlib.sha256()
    for name in files:
        top = export / name
        for path in sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]:
            with path.open("rb") as f:
                file_digest = hashlib.file_digest(f, "sha256").hexdigest()
            digest.update(f"{path.relative_to(export)}\0{file_digest}\n".encode())
    return digest.hexdigest()


def register_run(
    client: Any,
    run_dir: Path,
    name: str,
    aliases: list[str],
    export: Path | None = None,
    uri: str | None = None,
) -> Registered:
    """A new version of ``name`` from the run's export; the run must be in MLflow (sync first) on
    the server at ``uri`` (the client's), whose run id the record keeps apart from other servers'."""
    if export is None:
        export = newest_export(run_dir)
    elif export.is_dir() and runs_own(export, run_dir) and not (export / MARKER).is_file():
        log.warning("%s: %s; taken as it is", export, _UNCHECKED)  # asked for by name
    if not export.is_dir():
        raise UserError(f"{export}: not an export directory (export/<step>-<format> with its files)")
    problems = [p for p in (*map(alias_problem, aliases), _name_problem(name)) if p]
    if problems:
        raise UserError(problems[0])
    run_id = (server_run(client, run_dir, uri) if uri else recorded_run(run_dir)).get("run_id")
    if not run_id:
        raise UserError(
            f"{run_dir}: not in MLflow yet (no tracking/mlflow.json); run `hpcpipe track sync {run_dir}`"
        )
    client.get_run(run_id)  # a hung server is named after one metadata timeout, not an upload's
    with reading(export):  # no export moves files in while they are hashed and uploaded
        files = export_files(run_dir, export)
        artifact_path = f"model/{export.name}-{content_sha256(export, files)[:12]}"
        _upload(client, run_id, export, files, artifact_path)
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


def _upload(client: Any, run_id: str, export: Path, files: list[str], artifact_path: str) -> None:
    with artifact_uploads():
        for name in files:
            path = export / name
            if path.is_dir():
                client.log_artifacts(run_id, str(path), f"{artifact_path}/{name}")
            else:
                client.log_artifact(run_id, str(path), artifact_path)


def _name_problem(name: str) -> str | None:
    """MLflow's search quotes a name in ' or in "; one holding both could not be read back."""
    if "'" in name and '"' in name:
        return f"--name {name}: holds both ' and \" (MLflow's search cannot quote it); drop one"
    return None


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
    versions = model_versions(client, name)
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


def model_versions(client: Any, name: str) -> list[Any]:
    """Every version of ``name``, page by page. MLflow's filter takes no backslash escape: a
    name holding ' is quoted in " (register refuses a name holding both)."""
    if "'" in name and '"' in name:
        raise UserError(f"model {name}: holds both ' and \" (MLflow's search cannot quote it)")
    quoted = f'"{name}"' if "'" in name else f"'{name}'"
    rows, token = [], None
    while True:
        page = client.search_model_versions(f"name={quoted}", page_token=token)
        rows.extend(page)
        token = getattr(page, "token", None)
        if not token:
            return rows
