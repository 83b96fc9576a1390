"""The search space: ``hpo.space`` -> Optuna suggestions -> ``section.key=value`` overrides.

Parameter names in the study are the config keys themselves (``train.lr``), so a trial's params
are the overrides that make its config, and ``hpo best --export`` writes them back unchanged.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcpipe.config import JobConfig, apply_values
from hpcpipe.config.checkpoint import own_checkpoint_dirs
from hpcpipe.config.hpo import ParamSpec
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.recipes.registry import recipe_class

if TYPE_CHECKING:
    import optuna


def suggest(trial: optuna.trial.Trial, space: dict[str, ParamSpec]) -> dict[str, Any]:
    """One value per active parameter, in declared order (a ``when`` names earlier keys only)."""
    values: dict[str, Any] = {}
    for key, spec in space.items():
        if not _active(spec, values):
            continue
        if spec.type == "categorical":
            values[key] = trial.suggest_categorical(key, spec.choices or [])
        elif spec.type == "int":
            step = int(spec.step or 1)
            values[key] = trial.suggest_int(
                key, int(spec.low or 0), int(spec.high or 0), step=step, log=spec.log
            )
        else:
            values[key] = trial.suggest_float(
                key, spec.low or 0.0, spec.high or 0.0, step=spec.step, log=spec.log
            )
    return values


def _active(spec: ParamSpec, values: dict[str, Any]) -> bool:
    return all(_same(values.get(key), wanted) for key, wanted in spec.when.items())


def _same(value: Any, wanted: Any) -> bool:
    """A float parameter's steps drift in the last bits (0.1 + 2 x 0.1): 0.3 is still 0.3."""
    if _number(value) and _number(wanted):
        return math.isclose(value, wanted, rel_tol=1e-9, abs_tol=1e-12)
    return bool(value == wanted)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def maximize(job: JobConfig) -> bool:
    """Whether the study maximises ``hpo.metric``: ``hpo.direction``, or else the recipe's goal for
    the metric (its ``metric_goals``; a metric it does not declare is minimised)."""
    if job.hpo.direction is not None:
        return job.hpo.direction == "maximize"
    return recipe_class(job.run.recipe).metric_goals.get(job.hpo.metric) == "max"


def check_space(job: JobConfig) -> None:
    """Every key exists in the job and takes the space's extremes; ``when`` keys come earlier;
    the metric is one the recipe evaluates. One line naming the key otherwise."""
    hpo = job.hpo
    if not hpo.space:
        raise UserError("hpo.space is empty: give at least one section.key: {type: ..., ...}")
    metrics = recipe_class(job.run.recipe).metric_goals
    if hpo.metric not in metrics:
        raise UserError(
            f"hpo.metric {hpo.metric!r}: run.recipe {job.run.recipe!r} evaluates {', '.join(metrics)}"
        )
    seen: list[str] = []
    for key, spec in hpo.space.items():
        if key.startswith("hpo.") or key.startswith("run."):
            raise UserError(f"hpo.space.{key}: the study's own settings and run names cannot be searched")
        for other, wanted in spec.when.items():
            if other not in seen:
                raise UserError(
                    f"hpo.space.{key}.when: {other!r} must be a parameter declared before {key!r}"
                )
            choices = hpo.space[other].choices
            if choices is not None and wanted not in choices:  # the key would never be sampled
                raise UserError(
                    f"hpo.space.{key}.when: {other} never takes {wanted!r} (its choices: "
                    f"{', '.join(map(str, choices))})"
                )
            if choices is None and (why := _unreachable(hpo.space[other], wanted)) is not None:
                raise UserError(f"hpo.space.{key}.when: {other} never takes {wanted!r} ({why})")
        for value in _extremes(spec):
            try:
                apply_values(job, {key: value})
            except ConfigError as exc:
                raise UserError(f"hpo.space.{key}: {exc}") from None
        seen.append(key)


def _unreachable(spec: ParamSpec, wanted: Any) -> str | None:
    """Why an int or float parameter never takes ``wanted`` (None when it can): a condition on
    such a value was accepted, and the key under it silently never sampled."""
    if not _number(wanted):
        return f"it is {'an' if spec.type == 'int' else 'a'} {spec.type} parameter"
    low, high = spec.low or 0.0, spec.high or 0.0
    if not low <= wanted <= high:
        return f"its range: {low:g} to {high:g}"
    if spec.type == "float" and spec.step is None:
        return "a float range without a step takes any one value with probability 0; give it a step"
    step = spec.step or 1
    if abs((wanted - low) / step - round((wanted - low) / step)) > 1e-8:
        return f"its steps: {low:g}, {low + step:g}, {low + 2 * step:g}, ..."
    return None


def _extremes(spec: ParamSpec) -> list[Any]:
    if spec.type == "categorical":
        return list(spec.choices or [])
    if spec.type == "int":
        return [int(spec.low or 0), int(spec.high or 0)]
    return [spec.low, spec.high]


def grid_space(space: dict[str, ParamSpec]) -> dict[str, list[Any]]:
    """Optuna's GridSampler space: categorical choices and the steps of int/float ranges."""
    grid: dict[str, list[Any]] = {}
    for key, spec in space.items():
        if spec.when:
            raise UserError(f"hpo.space.{key}: the grid sampler cannot search conditional parameters")
    for key, spec in space.items():
        if spec.type == "categorical":
            grid[key] = list(spec.choices or [])
        elif spec.step is None and spec.type == "float":
            raise UserError(f"hpo.space.{key}: the grid sampler needs a 'step' for a float range")
        else:
            low, high, step = spec.low or 0.0, spec.high or 0.0, spec.step or 1
            # Points within [low, high] only (round() took 1, 3, 5 from low 1, high 4, step 2);
            # 12 significant digits drop the drift of a sum (0.30000000000000004).
            count = math.floor((high - low) / step + 1e-9) + 1
            points = [float(f"{low + i * step:.12g}") for i in range(count)]
            grid[key] = [int(p) for p in points] if spec.type == "int" else points
    return grid


def grid_size(space: dict[str, ParamSpec]) -> int:
    return len(list(itertools.product(*grid_space(space).values())))


def trial_config(base: JobConfig, values: dict[str, Any], name: str, out_dir: str) -> JobConfig:
    """The trial's config: the base job with the sampled values, its own run name and directory."""
    own = own_checkpoint_dirs(base.checkpoint, name, Path(out_dir))  # shared: trial 1 resumed trial 0
    try:
        return apply_values(base, {**values, **own, "run.name": name, "run.out_dir": out_dir})
    except ConfigError as exc:
        raise UserError(f"trial {name}: {exc}") from None
