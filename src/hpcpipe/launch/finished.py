"""A run that trained to its last step, started again with other training settings: resumed, it
would train nothing, yet rank 0 would record the new settings (config.yaml, lineage.json) for a
model the old ones trained, and evaluate, export and the registry would describe it by them.
``hpcpipe train`` (``launch/job.py run_job``), each node's ``hpcpipe launch agent`` (Slurm,
Kubeflow), ``hpcpipe launch slurm`` before it queues, and ``hpcpipe run``'s train step
(``pipeline/steps.py``) refuse it here, in one line; more steps (or epochs) train on."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from hpcpipe.config import JobConfig
from hpcpipe.config.changes import training_changes
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout

if TYPE_CHECKING:
    from hpcpipe.recipes.base import Recipe

SHOWN = 3  # changed keys named in the one line


def finished_at(job: JobConfig) -> int | None:
    """The step of the checkpoint a resume would load, the newest committed of either tier, when
    the run finished there (a ``run_finished`` event at that step: ``train.steps``, or its
    epochs' steps); else None. The fast tier alone missed a run whose final checkpoint was left
    in the durable tier only (a node-local fast tier lost): it resumed there and trained nothing."""
    from hpcpipe.checkpoint.resume_choice import newest_committed, resume_tiers
    from hpcpipe.checkpoint.tiers import fast_root
    from hpcpipe.observe.metrics import read_events

    try:
        newest = newest_committed(resume_tiers(job.checkpoint, fast_root(job.checkpoint.dir, job.run_dir)))
    except OSError:  # a tier that cannot be listed: the store's own checks name its key
        return None
    if newest is None:
        return None
    reached = newest[0]
    events = read_events(job.run_dir)
    ended = any(e.get("event") == "run_finished" and e.get("step") == reached for e in events)
    return reached if ended else None


def refuse_new_settings(
    job: JobConfig,
    before: dict[str, Any],
    reached: int,
    also: Sequence[str] = (),
    prepare: bool = True,
    recipe: Recipe | None = None,
) -> None:
    """UserError when ``job`` changes a training key against ``before`` (the settings that
    trained the run to ``reached``, its last step) and asks for no more steps than that; ``also``
    names other changes (a new dataset) that count the same. ``prepare`` false (a login node, each
    rank of torchrun/srun before its node prepared): a job counted in epochs is left to where its
    data give its steps, unless ``recipe`` (its data prepared) gives them."""
    changed = [*also, *training_changes(before, job.to_dict())]
    if not changed:
        return
    asked = _steps_asked(job, prepare, recipe)
    if asked is None or asked > reached:
        return
    if job.train.epochs is None:
        more = "more train.steps to train on"
    else:
        more = f"more train.epochs to train on ({job.train.epochs:g} end at step {asked})"
    shown = ", ".join(changed[:SHOWN]) + (" ..." if len(changed) > SHOWN else "")
    raise UserError(
        f"{job.run_dir} already trained to step {reached} with other settings ({shown}): resumed, "
        f"nothing would be trained with them; give a new run.name to train anew, or {more}"
    )


def refuse_finished_run(job: JobConfig, prepare: bool = True, recipe: Recipe | None = None) -> None:
    """``refuse_new_settings`` against the run's config.yaml (what rank 0 recorded once the
    checkpoint loaded); nothing to compare when the run has not finished or has no config."""
    reached = finished_at(job)
    if reached is None:
        return
    before = _recorded(RunLayout(job.run_dir).config)
    if before is not None:
        refuse_new_settings(job, before, reached, prepare=prepare, recipe=recipe)


def _steps_asked(job: JobConfig, prepare: bool, recipe: Recipe | None) -> int | None:
    """The step ``job`` trains to: train.steps, or its train.epochs by the trainer's own rule
    (``resolve_steps``) on its dataset: ``recipe``'s, prepared already, else prepared first when
    ``prepare`` (idempotent: a no-op when it is, and the launch prepares it next anyway); else
    None. Comparing epochs with the earlier run's epochs refused a run counted in steps switched
    to epochs that meant more steps."""
    if job.train.epochs is None:
        return job.train.steps
    if recipe is None and not prepare:
        return None
    from hpcpipe.recipes import build_recipe
    from hpcpipe.train.schedule import resolve_steps

    if recipe is None:
        recipe = build_recipe(job)
        recipe.prepare(progress=False)
    return resolve_steps(job.train, recipe.samples_per_epoch()).steps


def _recorded(path: Path) -> dict[str, Any] | None:
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return tree if isinstance(tree, dict) else None
