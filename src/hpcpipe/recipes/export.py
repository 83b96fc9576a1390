"""``hpcpipe ckpt export`` and the pipeline's export step: a verified checkpoint handed to the
recipe of the run that wrote it, which writes it in one of its ``export_formats``."""

from __future__ import annotations

from pathlib import Path

from hpcpipe.checkpoint.export import find_job_config, verify_for_export
from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.config import JobConfig, load_config
from hpcpipe.recipes.base import ExportRequest
from hpcpipe.recipes.export_folder import MARKER as EXPORT_MARKER
from hpcpipe.recipes.export_folder import export_folder
from hpcpipe.recipes.registry import recipe_class

__all__ = ["EXPORT_MARKER", "default_export", "export_checkpoint"]


def default_export(job: JobConfig) -> str:
    """``pipeline.export_format``, or for ``auto`` the first of the recipe's ``export_formats``;
    CheckpointError when the recipe exports nothing."""
    if job.pipeline.export_format != "auto":
        return job.pipeline.export_format
    formats = recipe_class(job.run.recipe).export_formats
    if not formats:
        raise CheckpointError(f"run.recipe {job.run.recipe!r} exports nothing (no export_formats)")
    return formats[0]


def export_checkpoint(
    ckpt: Path, fmt: str, out: Path, config_path: Path | None = None, dtype: str = "fp32"
) -> Path:
    """Verify ``ckpt``, then let its run's recipe write it to ``out`` in ``fmt``; returns what it
    wrote there (``out``, or a file in it). ``out`` must be absent, empty or hold an earlier
    export only, whose entries are replaced (``export_folder.py``).
    ``config_path`` defaults to the run's ``config.yaml`` (the checkpoint's parent's parent)."""
    if out.resolve().is_relative_to(ckpt.resolve().parent):
        # Files added to a committed checkpoint fail its verification: the run could not resume.
        raise CheckpointError(f"--out {out}: inside the run's checkpoints ({ckpt.parent}); export elsewhere")
    verify_for_export(ckpt)
    config_path = config_path or find_job_config(ckpt)
    job = load_config(config_path)
    formats = recipe_class(job.run.recipe).export_formats
    if fmt not in formats:
        wanted = f"use {' or '.join(formats)}" if formats else "it exports nothing"
        raise CheckpointError(f"--format {fmt} does not fit run.recipe {job.run.recipe!r} ({wanted})")
    recipe = recipe_class(job.run.recipe).from_job(job)
    record = {"checkpoint": str(ckpt.resolve()), "format": fmt}
    with export_folder(out, record, keep_out_of=(ckpt, config_path.parent)) as staging:
        written = recipe.export(ExportRequest(ckpt, fmt, staging, config_path.parent, dtype))
        inside = written.relative_to(staging)
    return out.resolve() / inside
