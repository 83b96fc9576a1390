"""What a study holds, for people: one row per trial, the best trial, and its config to retrain."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcpipe.config import JobConfig, apply_values, load_config, with_overrides
from hpcpipe.config.hpo import HpoConfig
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.hpo.liveness import retried_from
from hpcpipe.hpo.study import StudyPlan
from hpcpipe.hpo.worker import RUN_DIR_ATTR, SURPLUS_ATTR
from hpcpipe.layout import RunLayout, StudyLayout

if TYPE_CHECKING:
    import optuna


def trial_rows(study: optuna.Study) -> list[dict[str, Any]]:
    """Every trial but the surplus ones: number, state, value, last reported step, params, run dir."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(SURPLUS_ATTR):
            continue
        seconds = (
            (t.datetime_complete - t.datetime_start).total_seconds()
            if t.datetime_complete and t.datetime_start
            else None
        )
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "last_step": max(t.intermediate_values, default=None),
                "seconds": seconds,
                "params": dict(t.params),
                "retry_of": retried_from(t),
                # A retry inherits its original's attributes, failure note included: the note
                # is its own only when it failed too.
                "note": t.user_attrs.get("hpcpipe:failure", "") if t.state.name == "FAIL" else "",
                "run_dir": t.user_attrs.get(RUN_DIR_ATTR),
            }
        )
    return rows


def summary(plan: StudyPlan, study: optuna.Study) -> dict[str, Any]:
    rows = trial_rows(study)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    best = best_row(study)
    return {
        "study": plan.name,
        "storage": plan.storage_shown,
        "metric": plan.hpo.metric,
        "direction": study.direction.name.lower(),
        "n_trials": plan.hpo.n_trials,
        "counts": counts,
        "best": best,
        "trials": rows,
    }


def best_row(study: optuna.Study) -> dict[str, Any] | None:
    """The best completed trial, or None when no trial completed yet."""
    try:
        best = study.best_trial
    except ValueError:
        return None
    return {
        "number": best.number,
        "value": best.value,
        "params": dict(best.params),
        "run_dir": best.user_attrs.get(RUN_DIR_ATTR),
    }


def best_config(plan: StudyPlan, study: optuna.Study, sets: list[str]) -> JobConfig:
    """The best trial's own config (its ``config.yaml``: what it trained with, though a later
    ``hpo run`` may have changed the study's base), else the base job with its values; ``--set``
    overrides on top (more steps, more nodes), named ``<study>-best`` in the base's
    ``run.out_dir``; its hpo section is reset (it trains, it does not search)."""
    best = best_row(study)
    if best is None:
        raise UserError(
            f"study {plan.name!r} has no completed trial yet (hpcpipe hpo status {plan.study_dir})"
        )
    trained = RunLayout(Path(best["run_dir"])).config if best["run_dir"] else None
    base = load_config(trained) if trained is not None and trained.is_file() else plan.base
    # The base's checkpoint directories, not the trial's own: it would resume the trial's last step.
    own = {
        "checkpoint.dir": plan.base.checkpoint.dir,
        "checkpoint.durable_dir": plan.base.checkpoint.durable_dir,
    }
    named = {"run.name": f"{plan.name}-best", "run.out_dir": plan.base.run.out_dir, **own}
    job = apply_values(base, {**best["params"], **named})
    job = job.model_copy(update={"hpo": HpoConfig()})
    try:
        return with_overrides(job, sets)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


def write_best(job: JobConfig, path: Path, note: str) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {note}\n" + job.to_yaml())
    except OSError as exc:
        raise UserError(f"--export {path}: cannot write ({exc.strerror})") from None
    return path


def write_trials_csv(rows: list[dict[str, Any]], study_dir: Path) -> Path:
    """``STUDY_DIR/trials.csv``: one row per trial, a column per parameter (for `hpcpipe report`
    and spreadsheets; the storage stays the source of truth)."""
    import csv

    params = sorted({key for row in rows for key in row["params"]})
    columns = ["number", "state", "value", "last_step", "seconds", "retry_of", *params, "run_dir", "note"]
    path = StudyLayout(study_dir).trials_csv
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # `hpo status` and workers write it at once
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, **row["params"]})
    tmp.replace(path)
    return path
