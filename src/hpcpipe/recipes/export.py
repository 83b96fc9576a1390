"""``hpcpipe ckpt export`` and the pipeline's export step: a verified checkpoint handed to the
recipe of the run that wrote it, which writes it in one of its ``export_formats``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hpcpipe.checkpoint.export import find_job_config, verify_for_export
from hpcpipe.checkpoint.manifest import CheckpointError
from hpcpipe.config import JobConfig, load_config
from hpcpipe.layout import RunLayout
from hpcpipe.recipes.base import ExportRequest
from hpcpipe.recipes.registry import recipe_class

__all__ = ["EXPORT_MARKER", "default_export", "export_checkpoint"]

EXPORT_MARKER = ".hpcpipe-export"  # in every export directory: what a later export may replace


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
    wrote there (``out``, or a file in it). ``out`` must be absent, empty or an earlier export,
    which is replaced whole.
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
    out = out.resolve()  # `--out .`: its parent and name are the working directory's
    _check_replaceable(out)
    recipe = recipe_class(job.run.recipe).from_job(job)
    # Written into a folder of its own inside ``out``, then moved up in place of what was there:
    # another format's files left in ``out`` (an hf config.json beside hpcpipe's safetensors)
    # loaded as a model of random weights. ``out`` itself is never renamed (the working
    # directory or a mount point cannot be) and nothing is written beside it.
    staging = out / f"{_PARTIAL}{os.getpid()}"
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        written = recipe.export(ExportRequest(ckpt, fmt, staging, config_path.parent, dtype))
        (staging / EXPORT_MARKER).write_text(json.dumps({"checkpoint": str(ckpt.resolve()), "format": fmt}))
        _move_up(staging, out)
    except OSError as exc:
        raise CheckpointError(f"--out {out}: cannot write the export ({exc.strerror or exc})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out / written.relative_to(staging)


_PARTIAL = ".partial-"  # an export being written (or one a killed process left)


def _check_replaceable(out: Path) -> None:
    """``out`` is absent, empty, or an earlier export (its marker, or the run's own export
    folder, where exports written before the marker existed lie): nothing else is replaced."""
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out}: a file, not a directory")
    held = [p for p in out.iterdir() if not p.name.startswith(_PARTIAL)] if out.is_dir() else []
    # export/<step>-<format>, the default folder (not export/adapter, the run's own adapter)
    default = out.name.startswith("step-") and out.parent.name == RunLayout.EXPORT
    runs_own = default and RunLayout(out.parent.parent).config.is_file()
    if held and not (out / EXPORT_MARKER).is_file() and not runs_own:
        raise CheckpointError(
            f"--out {out}: not empty, and not an hpcpipe export (none written before 2026-12-05 has "
            f"the {EXPORT_MARKER} file: delete it); choose an empty or new directory"
        )


def _move_up(staging: Path, out: Path) -> None:
    """Replace what ``out`` holds with what ``staging`` (inside it) holds; the marker last, so
    an interrupted move leaves a folder a later export may replace."""
    for child in out.iterdir():
        if child != staging and child.name != EXPORT_MARKER:
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    for child in staging.iterdir():
        if child.name != EXPORT_MARKER:
            child.rename(out / child.name)
    (staging / EXPORT_MARKER).replace(out / EXPORT_MARKER)
