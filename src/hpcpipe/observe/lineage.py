"""``lineage.json``: what produced a run (code, config, data, software, hosts)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import hpcpipe
from hpcpipe.fsutil import read_json_object
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
        "hosts": sorted(set(hosts)),
        "world_size": world_size,
    }


def read_lineage(run_dir: Path) -> dict[str, Any]:
    return read_json_object(RunLayout(run_dir).lineage)


def write_lineage(run_dir: Path, lineage: dict[str, Any]) -> Path:
    """Write ``lineage.json``; the pipeline's step records (``steps``) already there are kept."""
    steps = read_lineage(run_dir).get("steps")
    merged = {**lineage, "steps": steps} if steps and "steps" not in lineage else lineage
    path = RunLayout(run_dir).lineage
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(merged, indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path
