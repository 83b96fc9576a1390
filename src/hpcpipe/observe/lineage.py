"""``lineage.json``: what produced a run (code, config, data, software, hosts)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import hpcpipe
from hpcpipe.fsutil import read_json_object, write_text_replacing
from hpcpipe.layout import RunLayout


def git_sha(cwd: Path | None = None) -> str | None:
    """Commit of the hpcpipe source tree (or of ``cwd``), with '-dirty' when it has changes."""
    where = cwd or Path(hpcpipe.__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=5, check=False
        )
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        return sha.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def scheduler_job_id() -> str | None:
    """The scheduler's id for this job: a Slurm array task, a Slurm job, or HPCPIPE_JOB_ID."""
    import os

    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID") or os.environ.get("HPCPIPE_JOB_ID") or None


def build_lineage(
    config_hash: str, dataset_manifest_sha256: str | None, hosts: list[str], world_size: int
) -> dict[str, Any]:
    return {
        "git_sha": git_sha(),
        "job_id": scheduler_job_id(),
        "config_hash": config_hash,
        "dataset_manifest_sha256": dataset_manifest_sha256,
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "hpcpipe": hpcpipe.__version__,
        },
        "platform": platform.platform(),
        # Relative paths of the config (checkpoint.dir, run.out_dir) are relative to it.
        "working_dir": os.getcwd(),
        "hosts": sorted(set(hosts)),
        "world_size": world_size,
    }


def read_lineage(run_dir: Path) -> dict[str, Any]:
    return read_json_object(RunLayout(run_dir).lineage)


# Kept from the lineage.json already there when a new one is written without them: the pipeline's
# step records, and the datasets, configs and code a resumed run trained with before its current ones.
KEPT = ("steps", "earlier_datasets", "earlier_starts")


def write_lineage(run_dir: Path, lineage: dict[str, Any]) -> Path:
    """Write ``lineage.json``; the ``KEPT`` records already there are kept."""
    previous = read_lineage(run_dir)
    merged = {**{key: previous[key] for key in KEPT if previous.get(key) and key not in lineage}, **lineage}
    path = RunLayout(run_dir).lineage
    write_text_replacing(path, json.dumps(merged, indent=2) + "\n")
    return path


def with_earlier_dataset(
    run_dir: Path, lineage: dict[str, Any], resumed_at: int
) -> tuple[dict[str, Any], str | None]:
    """``lineage`` with ``earlier_datasets``: the datasets the resumed model was trained on before
    this start's, each with the step it ended at; and the hash of the one it was trained on at
    ``resumed_at`` when this start reads another one (same item count: the checkpoint's data
    position fits it), else None. A resume that fell back past a switch drops the entries after
    its step. A fresh start (``resumed_at`` 0) begins the list again."""
    previous = read_lineage(run_dir)
    if resumed_at <= 0:
        return {**lineage, "earlier_datasets": []} if previous.get("earlier_datasets") else lineage, None
    entries = list(previous.get("earlier_datasets") or [])
    kept = [e for e in entries if e.get("until_step", 0) < resumed_at]
    later = [e for e in entries if e.get("until_step", 0) >= resumed_at]
    at_resume = later[0].get("dataset_manifest_sha256") if later else previous.get("dataset_manifest_sha256")
    new = lineage.get("dataset_manifest_sha256")
    changed = bool(at_resume and new and at_resume != new)
    if changed:
        kept.append({"dataset_manifest_sha256": at_resume, "until_step": resumed_at})
    if kept == entries and not changed:
        return lineage, None
    return {**lineage, "earlier_datasets": kept}, str(at_resume) if changed else None


def with_earlier_starts(run_dir: Path, lineage: dict[str, Any], resumed_at: int) -> dict[str, Any]:
    """``lineage`` with ``earlier_starts``: the config hash and git commit the resumed model was
    trained with before this start's, each with the step it ended at, where they differ. A resume
    rewrote both with the last start's: a model trained entirely at another learning rate named
    the new one. A fresh start (``resumed_at`` 0) begins the list again; a resume that fell back
    past an entry drops it."""
    previous = read_lineage(run_dir)
    if resumed_at <= 0:
        return {**lineage, "earlier_starts": []} if previous.get("earlier_starts") else lineage
    keys = ("config_hash", "git_sha")
    earlier = list(previous.get("earlier_starts") or [])
    entries = [e for e in earlier if e.get("until_step", 0) < resumed_at]
    later = [e for e in earlier if e.get("until_step", 0) >= resumed_at]
    at_resume = {key: (later[0] if later else previous).get(key) for key in keys}  # what made the step
    if previous and at_resume != {key: lineage.get(key) for key in keys}:
        entries.append({**at_resume, "until_step": resumed_at})
    return {**lineage, "earlier_starts": entries} if entries or earlier else lineage
