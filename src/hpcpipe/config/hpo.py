"""The ``hpo:`` config section: an Optuna study over any config key (``hpcpipe hpo``).

Its own module: the search, its storage and its workers are apart from what one run trains.
The space's keys are checked against the job's own keys when the study starts
(``hpcpipe.hpo.space.check_space``): this module knows only the shape of a parameter.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import Field, field_validator, model_validator

from hpcpipe.config.section import Section, one_line

SamplerName = Literal["tpe", "random", "cmaes", "gp", "grid"]
PrunerName = Literal["median", "hyperband", "successive_halving", "none"]


class ParamSpec(Section):
    """One searched key: ``{type: float, low: 1e-4, high: 1e-1, log: true}``,
    ``{type: int, low: 2, high: 8, step: 2}`` or ``{type: categorical, choices: [adamw, sgd]}``;
    ``when: {other.key: value}`` samples it only when an earlier parameter took that value."""

    type: Literal["float", "int", "categorical"] = Field(description="How the value is sampled.")
    low: float | None = Field(None, description="The lowest value (float, int).")
    high: float | None = Field(None, description="The highest value, included (float, int).")
    log: bool = Field(False, description="Sample on a log scale (needs low > 0; not with step).")
    step: float | None = Field(None, gt=0, description="Sample only low, low + step, ... (float, int).")
    choices: list[Any] | None = Field(None, description="The values a categorical parameter takes.")
    when: dict[str, Any] = Field(
        default_factory=dict,
        description="Sample this key only when each named earlier key took the given value.",
    )

    @model_validator(mode="after")
    def _shape(self) -> ParamSpec:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
            if self.low is not None or self.high is not None:
                raise ValueError("a categorical parameter takes 'choices', not low/high")
            _plain_distinct(self.choices)
            return self
        if self.choices is not None:
            raise ValueError(f"a {self.type} parameter takes low/high, not 'choices'")
        if self.low is None or self.high is None:
            raise ValueError(f"a {self.type} parameter needs 'low' and 'high'")
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) is above high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale parameter needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("'log' and 'step' cannot be combined (Optuna's rule)")
        if self.type == "int" and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("an int parameter needs whole-number low and high")
        if self.type == "int" and self.step is not None and not float(self.step).is_integer():
            raise ValueError(f"an int parameter needs a whole-number step (got {self.step:g})")
        return self


def _plain_distinct(choices: list[Any]) -> None:
    """Optuna stores a choice as a plain value and finds it again by ``==``: a nested list is not
    storable, and ``[1, true]`` or ``[1, 1.0]`` are one choice twice (``1 == True``), so the grid
    and the samplers would silently search one value where the user listed two."""
    for i, choice in enumerate(choices):
        if choice is not None and not isinstance(choice, str | int | float | bool):
            raise ValueError(f"choice {choice!r} is not a plain value (null, a boolean, a number or a text)")
        for earlier in choices[:i]:
            if earlier == choice:
                raise ValueError(
                    f"choices {earlier!r} and {choice!r} are the same value to Optuna; list each value once"
                )


class SamplerConfig(Section):
    """The Optuna sampler that proposes each trial's values."""

    name: SamplerName = Field(
        "tpe",
        description="tpe (default; Optuna's TPESampler), random, cmaes (needs the `cmaes` package; "
        "floats and ints only), gp (Gaussian process), grid (every combination of the "
        "categorical choices and int/float steps).",
    )
    n_startup_trials: int = Field(5, ge=0, description="Random trials before tpe/gp/cmaes model the space.")


class PrunerConfig(Section):
    """The Optuna pruner that stops unpromising trials early."""

    name: PrunerName = Field(
        "median",
        description="median (stop a trial whose metric is worse than the median of earlier trials "
        "at the same step), hyperband, successive_halving, or none.",
    )
    n_startup_trials: int = Field(2, ge=0, description="median: trials that finish before any is pruned.")
    n_warmup_steps: int = Field(0, ge=0, description="median: training steps before a trial may be pruned.")
    min_resource: int = Field(
        1, ge=1, description="hyperband / successive_halving: steps every trial trains at least."
    )
    reduction_factor: int = Field(3, ge=2, description="hyperband / successive_halving: keep 1 in this many.")


class HpoConfig(Section):
    """``hpcpipe hpo run JOB``: every trial is an ordinary run directory of JOB with the sampled
    values set; the trainer reports ``metric`` at each evaluation and the pruner may stop it."""

    study: str | None = Field(
        None, min_length=1, description="Study name (default: run.name); trials share it in the storage."
    )
    dir: str | None = Field(
        None,
        min_length=1,
        description="Study directory: trials, plots, study.json (default: <run.out_dir>/hpo-<study>).",
    )
    storage: str | None = Field(
        None,
        description="null: SQLite in the study directory (one machine, one worker); "
        "postgresql://USER@HOST:PORT/DB for many workers (password from PGPASSWORD or ~/.pgpass, "
        "never in the URL); journal:PATH for Optuna's journal file on a shared file system "
        "(journal alone: STUDY_DIR/journal.log).",
    )
    metric: str = Field(
        "val_loss",
        min_length=1,
        description="The objective, reported at every evaluation and taken at the last one: a key "
        "of the recipe's evaluation rows (its metric_goals: `hpcpipe recipes show NAME`).",
    )
    direction: Literal["minimize", "maximize"] | None = Field(
        None,
        description="null: the recipe's goal for hpo.metric (maximize accuracy, minimize a loss; "
        "its metric_goals).",
    )
    n_trials: int = Field(20, ge=1, description="Trials the study ends with (all workers together).")
    timeout_s: float | None = Field(
        None, gt=0, description="A worker starts no new trial after this many seconds."
    )
    seed: int | None = Field(
        0, ge=0, le=2**31 - 1, description="Sampler seed (null: random); workers add their index to it."
    )  # Optuna's samplers take seeds below 2**32: the workers' offsets keep within it
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    pruner: PrunerConfig = Field(default_factory=PrunerConfig)
    space: dict[str, ParamSpec] = Field(default_factory=dict, description="section.key: parameter.")
    heartbeat_s: float = Field(10.0, gt=0, description="A worker marks its running trial alive this often.")
    grace_s: float = Field(
        60.0,
        gt=0,
        description="A running trial not marked alive for this long is failed (its worker died) and retried. "
        "At least 1.5 x heartbeat_s + fault.preempt_grace_s + 10 s: a worker whose beats stop landing "
        "stops its trial fault.preempt_grace_s + 10 s before that, for its checkpoint.",
    )
    max_retries: int = Field(
        1,
        ge=0,
        description="Retries of a failed or crashed trial (same values; resumes). A preempted trial "
        "(exit fault.preempt_exit_code with a newer checkpoint than its try started from) is always "
        "retried and uses none.",
    )

    _one_line = field_validator("study", "dir", "storage")(one_line)  # in the array's script

    @field_validator("study")
    @classmethod
    def _study_is_a_plain_name(cls, study: str | None) -> str | None:
        # The name becomes a directory under run.out_dir (hpo-<study>): it must not climb out of it.
        if study is not None and ("/" in study or "\\" in study or study in {".", ".."}):
            raise ValueError("must be a plain name (it names the directory hpo-<study>)")
        return study

    @field_validator("storage")
    @classmethod
    def _no_password_in_url(cls, url: str | None) -> str | None:
        parts = urlsplit(url) if url is not None and "://" in url else None
        in_query = parts is not None and any(
            key.lower() == "password" for key, _ in parse_qsl(parts.query, keep_blank_values=True)
        )
        if parts is not None and (parts.password is not None or in_query):
            raise ValueError(
                "holds a password: config.yaml is saved with every trial; set PGPASSWORD "
                "(or ~/.pgpass) in the workers' environment instead"
            )
        return url

    @model_validator(mode="after")
    def _heartbeat_within_grace(self) -> HpoConfig:
        if self.grace_s <= 2 * self.heartbeat_s:
            raise ValueError(
                f"grace_s ({self.grace_s:g}) must exceed 2 x heartbeat_s ({self.heartbeat_s:g}): "
                "a live trial would be failed between two heartbeats"
            )
        return self
