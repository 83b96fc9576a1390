"""A chaos scenario file, one trial's context and its result.

``SCENARIOS.yaml`` is a list of scenarios (or a mapping with a ``scenarios:`` list)::

    scenarios:
      - name: kill-a-rank          # unique; names the results and the report's rows
        kind: kill_rank            # one of hpcpipe.chaos.kinds.KINDS
        job: tiny                  # preset or config file the trials train (training kinds)
        nproc: 2                   # ranks per trial
        set: ["checkpoint.every_steps=4"]   # config overrides, as --set
        params: {max_restarts: 1}  # what the kind takes (each kind documents its own)
        trials: 50                 # optional: overrides --trials for this scenario

Every trial draws where and when its fault lands from ``random.Random("SEED/NAME/TRIAL")``, so
``hpcpipe chaos run FILE --seed SEED --only NAME --trial TRIAL`` replays it exactly.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hpcpipe.chaos.kinds import KIND_PARAMS, KINDS, STALL_HANG_TIMEOUT_S
from hpcpipe.config import first_error, load_config
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.yamlfile import read_yaml_file


class Scenario(BaseModel):
    """One declared fault scenario (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: str
    job: str = "tiny"
    nproc: int = Field(default=2, ge=1, le=8)
    sets: tuple[str, ...] = Field(default=(), alias="set")
    params: dict[str, Any] = Field(default_factory=dict)
    trials: int | None = Field(default=None, ge=1, le=10_000)
    timeout_s: float = Field(default=300.0, gt=0, le=7200)

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; one of {sorted(KINDS)}")
        return kind

    @model_validator(mode="after")
    def _known_params(self) -> Scenario:
        known = KIND_PARAMS.get(self.kind, {})
        for key, value in self.params.items():
            if key not in known:
                takes = ", ".join(sorted(known)) or "none"
                raise ValueError(f"params.{key}: kind {self.kind} takes no such param (it takes: {takes})")
            kind, low, below = known[key]
            if not _in_range(value, kind, low, below):
                want = "an int" if kind is int else "a finite number"
                upper = "" if below is None else f" and < {below:g}"
                raise ValueError(f"params.{key}: {value!r} is not {want} >= {low:g}{upper}")
        return self

    @model_validator(mode="after")
    def _watchdog_fires_within_the_trial(self) -> Scenario:
        # A stalled rank is found at hang_timeout_s; past the trial's own timeout, every trial timed out.
        hang = self.stall_hang_timeout_s()
        if hang is not None and hang >= self.timeout_s:
            raise ValueError(
                f"params.hang_timeout_s: {hang:g} must be smaller than timeout_s ({self.timeout_s:g})"
            )
        return self

    def stall_hang_timeout_s(self) -> float | None:
        """The watchdog timeout a ``stall`` trial sets (``fault.hang_timeout_s``); None for other kinds."""
        if self.kind != "stall":
            return None
        return float(self.params.get("hang_timeout_s", STALL_HANG_TIMEOUT_S))


def _in_range(value: Any, kind: type, low: float, below: float | None) -> bool:
    """``value`` is a ``kind`` (an int counts as a float; a bool as neither), finite, in [low, below)."""
    if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return value >= low and (below is None or value < below)


class ScenarioFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scenarios: tuple[Scenario, ...] = Field(min_length=1)


def load_scenarios(path: Path) -> list[Scenario]:
    """The scenarios of ``path`` (a ConfigError naming the file and the key when invalid)."""
    if not path.is_file():
        raise ConfigError(f"scenario file not found: {path}")
    raw = read_yaml_file(path, "scenario file")
    if isinstance(raw, list):
        raw = {"scenarios": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a list of scenarios or a mapping with 'scenarios:'")
    try:
        scenarios = list(ScenarioFile.model_validate(raw).scenarios)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {first_error(exc)}") from None
    names = [s.name for s in scenarios]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ConfigError(f"{path}: scenario name {duplicate!r} is used twice")
    for scenario in scenarios:
        _check_stall_against_job(path, scenario)
    return scenarios


def _check_stall_against_job(path: Path, scenario: Scenario) -> None:
    """A stall scenario's watchdog timeout is below its job's ``parallel.timeout_s``: the job
    refuses it otherwise (``JobConfig``), which failed every trial as "not recovered"."""
    hang = scenario.stall_hang_timeout_s()
    if hang is None:
        return
    try:
        job = load_config(scenario.job, list(scenario.sets))
    except UserError:
        return  # a job that does not load: each trial reports it, as for every other kind
    if hang >= job.parallel.timeout_s:
        raise ConfigError(
            f"{path}: scenario {scenario.name}: params.hang_timeout_s: {hang:g} must be smaller than "
            f"its job's parallel.timeout_s ({job.parallel.timeout_s:g})"
        )


def trial_rng(seed: int, scenario: str, trial: int) -> random.Random:
    """The generator every random choice of one trial comes from (string seeds are stable)."""
    return random.Random(f"{seed}/{scenario}/{trial}")


@dataclass
class TrialContext:
    """What a kind's ``run`` gets for one trial."""

    scenario: Scenario
    trial: int
    seed: int
    rng: random.Random
    work: Path  # this trial's own directory (exists, empty at the start)
    shared: Path  # shared by every trial of the chaos run: prepared data, reference runs
    cli: Any = None  # the hpcpipe CLI's click command (passed in: the CLI room sits above chaos)

    def param(self, key: str, default: Any) -> Any:
        """``params[key]`` (or ``default``); a wrong type is a ConfigError naming the key."""
        value = self.scenario.params.get(key, default)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)  # `hang_timeout_s: 5` means 5.0
        wrong_bool = isinstance(value, bool) and not isinstance(default, bool)
        if default is not None and (wrong_bool or not isinstance(value, type(default))):
            want = type(default).__name__
            raise ConfigError(f"scenario {self.scenario.name}: params.{key} must be a {want}, got {value!r}")
        return value


@dataclass
class TrialResult:
    """The verdict of one trial. ``recovered`` is the assertion; ``lost`` must be 0."""

    recovered: bool
    detail: str  # one line: what happened, or which check failed
    placement: dict[str, Any] = field(default_factory=dict)  # where/when the fault landed
    lost: int = 0  # training steps (or committed checkpoints, files) lost or not reproduced
    ttr_s: float | None = None  # time to recover: from the fault to the first step after resume
    # ttr_s split into phases (chaos/phases.py: detection, teardown, ..., other), where measured
    phases: dict[str, float] | None = None

    def as_row(self) -> dict[str, Any]:
        row = {
            "recovered": self.recovered,
            "detail": self.detail,
            "placement": self.placement,
            "lost": self.lost,
            "ttr_s": self.ttr_s,
        }
        return row if self.phases is None else {**row, "phases": self.phases}
