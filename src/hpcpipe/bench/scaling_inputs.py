"""Observations for scaling-law fits, from a CSV (params,tokens,loss) or from run directories.

A run directory gives one observation: N and D as its recipe counts them
(``Recipe.scaling_law_size``: hpcpipe's GPT counts the non-embedding parameters on the model
itself, built on the meta device, and D = the step of the final evaluation x global batch x
sequence length), L = the final ``val_loss`` in metrics.jsonl. Only a run that trained to its
end (its ``run_finished`` event) and was evaluated after step 0 counts. A directory that is not a
run but holds runs (``runs/``) contributes each of them; runs not finished, without a validation
loss after step 0, of a recipe that gives no counts or whose module raises on import, are
listed as skipped.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import ConfigError, UserError, one_line
from hpcpipe.layout import RunLayout
from hpcpipe.recipes.registry import RecipeImportError, recipe_class

REQUIRED_COLUMNS = ("params", "tokens", "loss")


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV with at least params,tokens,loss (other columns are kept as labels)."""
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise UserError(f"{path}: missing column(s) {', '.join(missing)} (need params,tokens,loss)")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"{path}: cannot read CSV ({exc})") from None
    points = []
    for line, row in enumerate(rows, start=2):
        try:
            values = {c: float(row[c]) for c in REQUIRED_COLUMNS}
        except (TypeError, ValueError):
            raise UserError(f"{path}:{line}: params, tokens and loss must be numbers") from None
        points.append({**values, "source": f"{path}:{line}"})
    return points


def read_run_dir(run_dir: Path) -> dict[str, Any]:
    """One observation from a finished run directory; UserError naming what is missing."""
    from hpcpipe.observe.metrics import read_metrics, trained_to_the_end

    config_path = RunLayout(run_dir).config
    if not config_path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.yaml)")
    try:
        job: JobConfig = load_config(config_path)
    except ConfigError as exc:
        raise UserError(f"{run_dir}: {exc}") from None
    # A stopped run's loss is of a model trained on fewer tokens than its config says.
    if not trained_to_the_end(run_dir, job.train.steps, job.train.epochs):
        length = f"train.epochs={job.train.epochs}" if job.train.epochs else f"train.steps={job.train.steps}"
        raise UserError(f"{run_dir}: not finished (events.jsonl has no run_finished at {length})")
    evals = [r for r in read_metrics(run_dir) if r.get("val_loss") is not None]
    if not evals:
        raise UserError(f"{run_dir}: metrics.jsonl has no val_loss (did the run finish its evaluation?)")
    final = evals[-1]
    steps = int(final.get("step", job.train.steps))
    if steps <= 0:  # the untrained model's loss, at D = 0
        raise UserError(f"{run_dir}: its last val_loss is at step {steps}, before any training")
    size = recipe_class(job.run.recipe).scaling_law_size(job, steps)
    if size is None:  # N and D of hpcpipe's GPT read off another recipe's config were no sizes
        raise UserError(f"{run_dir}: recipe {job.run.recipe!r} gives no parameter and token counts for a fit")
    return {"params": size[0], "tokens": size[1], "loss": float(final["val_loss"]), "source": str(run_dir)}


def load_observations(inputs: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Observations from CSV files, run directories and directories of runs; plus skipped runs."""
    if not inputs:
        raise UserError("scaling-law fit: give a CSV (params,tokens,loss) or run directories")
    points: list[dict[str, Any]] = []
    skipped: list[str] = []
    for item in inputs:
        path = Path(item)
        if path.is_file():
            points.extend(read_csv(path))
        elif RunLayout(path).config.is_file():
            points.append(read_run_dir(path))
        elif path.is_dir():
            runs = sorted(p for p in path.iterdir() if RunLayout(p).config.is_file())
            if not runs:
                raise UserError(f"{path}: neither a run directory nor a directory of runs")
            for run in runs:
                try:
                    points.append(read_run_dir(run))
                except UserError as exc:
                    skipped.append(str(exc))
                except RecipeImportError as exc:  # a bug in that run's recipe module: fit the others
                    skipped.append(f"{run}: {one_line(str(exc))}")
        else:
            raise UserError(f"{path}: no such file or directory")
    return points, skipped
