"""A study on disk and in its storage: where it lives, how to open it, how it samples.

``<study dir>/study.json`` names the study and its storage (never a password), and
``<study dir>/base.yaml`` is the job every trial starts from; workers anywhere (a local process,
a Slurm array task) open the study from these two files alone (``hpcpipe.layout.StudyLayout``).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpcpipe.config import JobConfig, load_config
from hpcpipe.config.hpo import HpoConfig
from hpcpipe.errors import UserError, hide_credentials
from hpcpipe.fsutil import read_json_object
from hpcpipe.hpo.space import grid_space, maximize
from hpcpipe.layout import StudyLayout
from hpcpipe.train.trial import build_pruner, open_storage

if TYPE_CHECKING:
    import optuna

SQLITE_ADVICE = (
    "Optuna's documentation advises against SQLite for parallel workers (one writer at a time: "
    "lock timeouts and slow asks); set hpo.storage to postgresql://USER@HOST:PORT/DB, or "
    "journal:PATH on a shared file system"
)


@dataclass(frozen=True)
class StudyPlan:
    base: JobConfig  # the job every trial starts from (its hpo section drives the study)
    name: str
    study_dir: Path
    storage_url: str  # journal:/abs/path, sqlite:////abs/path or postgresql://user@host:port/db

    @property
    def hpo(self) -> HpoConfig:
        return self.base.hpo

    @property
    def layout(self) -> StudyLayout:
        return StudyLayout(self.study_dir)

    @property
    def storage_shown(self) -> str:
        return hide_credentials(self.storage_url)


def plan_study(job: JobConfig) -> StudyPlan:
    """Name, directory and storage URL of ``job``'s study (relative paths made absolute, so the
    workers and their trial processes agree wherever they start)."""
    name = job.hpo.study or job.run.name
    study_dir = Path(job.hpo.dir or Path(job.run.out_dir) / f"hpo-{name}").absolute()
    return StudyPlan(job, name, study_dir, _absolute_url(job.hpo.storage, study_dir))


def _absolute_url(url: str | None, study_dir: Path) -> str:
    if url is None:
        return f"sqlite:///{StudyLayout(study_dir).sqlite}"
    if url == "journal":  # the journal file in the study directory
        return f"journal:{StudyLayout(study_dir).journal}"
    if url.startswith("journal:"):
        return f"journal:{Path(url.removeprefix('journal:')).absolute()}"
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return f"sqlite:///{Path(url.removeprefix('sqlite:///')).absolute()}"
    if url.startswith(("sqlite:", "postgresql://")):
        return url
    raise UserError(
        f"hpo.storage {hide_credentials(url)!r}: use sqlite:///PATH, postgresql://USER@HOST:PORT/DB "
        "or journal:PATH"
    )


def _require_store_file(plan: StudyPlan) -> None:
    """A study that is only read (status, best, plots, workers) must already have its SQLite or
    journal file: opening a missing one would leave an empty store wherever the path points."""
    url = plan.storage_url
    path = url.removeprefix("journal:") if url.startswith("journal:") else None
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        path = url.removeprefix("sqlite:///")
    if path is not None and not Path(path).is_file():
        raise UserError(
            f"study {plan.name!r} is not in {plan.storage_shown} (start it with `hpcpipe hpo run`)"
        )


def warn_if_parallel_sqlite(plan: StudyPlan, workers: int) -> str | None:
    """The warning for SQLite shared by more than one worker (None when it is fine)."""
    if workers > 1 and plan.storage_url.startswith("sqlite"):
        return f"warning: {workers} workers on SQLite ({plan.storage_shown}): {SQLITE_ADVICE}"
    return None


METRIC_ATTR = "hpcpipe:metric"  # the study's hpo.metric, in the storage: every worker sees it
DIR_ATTR = "hpcpipe:study_dir"  # where its trials train: one search per study


def check_record(plan: StudyPlan) -> None:
    """A study directory holds one study: a second name there would share its trial folders."""
    if not plan.layout.record.is_file():
        return
    recorded = read_json_object(plan.layout.record).get("study")
    if recorded != plan.name:
        raise UserError(
            f"{plan.study_dir}: holds study {recorded!r}, not {plan.name!r} (their trials would share "
            "its trial folders; give hpo.dir another directory)"
        )


def write_record(plan: StudyPlan) -> None:
    """``study.json`` and ``base.yaml``. A storage path given relative to the directory `hpo run`
    started in is saved absolute: `hpo status` from another directory found no study there."""
    plan.study_dir.mkdir(parents=True, exist_ok=True)
    given = plan.hpo.storage
    base = plan.base
    if given not in (None, "journal") and given != plan.storage_url:  # made absolute by plan_study
        base = base.model_copy(update={"hpo": plan.hpo.model_copy(update={"storage": plan.storage_url})})
    plan.layout.base.write_text(base.to_yaml())
    record = {"study": plan.name, "storage": plan.storage_shown, "metric": plan.hpo.metric}
    plan.layout.record.write_text(json.dumps(record, indent=1) + "\n")


def load_plan(source: str | Path, sets: list[str] | None = None) -> StudyPlan:
    """A study directory (holding study.json), or a job config / preset whose hpo section names one."""
    path = Path(source)
    if path.is_dir():
        layout = StudyLayout(path)
        if not layout.record.is_file():
            raise UserError(
                f"{path}: not a study directory (no {layout.RECORD}; start one with `hpcpipe hpo run`)"
            )
        record = read_json_object(layout.record)
        if not isinstance(record.get("study"), str):
            raise UserError(f"{layout.record}: no 'study' name (start the study with `hpcpipe hpo run`)")
        base = load_config(layout.base, sets or [])
        return StudyPlan(
            base, record["study"], path.absolute(), _absolute_url(base.hpo.storage, path.absolute())
        )
    return plan_study(load_config(source, sets or []))


def require_optuna() -> Any:
    """The optuna module, or one line saying which extra brings it."""
    try:
        import optuna
    except ImportError:
        raise UserError("hpcpipe hpo needs Optuna: pip install 'hpcpipe[hpo]'") from None
    return optuna


def build_sampler(hpo: HpoConfig, worker: int = 0, held: int = 0) -> optuna.samplers.BaseSampler:
    """The sampler; worker W of a study holding ``held`` trials seeds it with ``hpo.seed + W +
    10007 x held``: workers seeded alike would draw the same random start-up points and run the
    same trials side by side, and a continued study would draw its first run's points again.

    The grid is the exception: its seed shuffles the grid, and the grid id each trial stores
    indexes that shuffled list, so every process must shuffle alike (Optuna's advice): seeded
    apart, one id was another point in each worker, and points ran twice or never."""
    import optuna

    startup = hpo.sampler.n_startup_trials
    seed = None if hpo.seed is None else (hpo.seed + worker + 10_007 * held) % 2**32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if hpo.sampler.name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if hpo.sampler.name == "cmaes":
            return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=startup)
        if hpo.sampler.name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)
        if hpo.sampler.name == "grid":
            return optuna.samplers.GridSampler(grid_space(hpo.space), seed=hpo.seed or 0)
        # TPE's constant liar keeps parallel workers from sampling the same point.
        return optuna.samplers.TPESampler(
            seed=seed, n_startup_trials=startup, multivariate=True, constant_liar=True
        )


def seed_from_first_trial(
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    hpo: HpoConfig,
    worker: int,
    trial: optuna.trial.Trial,
) -> None:
    """Seed a worker's sampler from the number of its first trial, before that trial samples
    (Optuna draws at the first suggest, not at the ask). Processes that opened the study together
    (two `hpcpipe hpo run` commands: both worker 0, both seeing T trials) seeded alike and drew the
    same points; every trial number is handed out once. A lone process's first trial is number T
    (unless it resumes a waiting retry), so its seed, and its draws, are as ``open_study`` chose."""
    if hpo.sampler.name == "grid":  # one shuffle for every process (build_sampler)
        return
    study.sampler = build_sampler(hpo, worker, held=trial.number)
    study.sampler.before_trial(study, storage.get_trial(trial._trial_id))


def open_study(
    plan: StudyPlan, create: bool = False, worker: int = 0
) -> tuple[optuna.Study, optuna.storages.BaseStorage]:
    """The study and its storage; ``create`` makes it when missing (``hpo run`` does, once)."""
    optuna = require_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if create:
        plan.study_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite file lives there
    else:
        _require_store_file(plan)
    try:
        storage = open_storage(plan.storage_url)
        kwargs: dict[str, Any] = {
            "sampler": build_sampler(plan.hpo, worker),
            "pruner": build_pruner(plan.hpo.pruner),
        }
        if create:
            direction: Literal["minimize", "maximize"] = "maximize" if maximize(plan.base) else "minimize"
            study = optuna.create_study(
                storage=storage, study_name=plan.name, direction=direction, load_if_exists=True, **kwargs
            )
        else:
            study = optuna.load_study(study_name=plan.name, storage=storage, **kwargs)
    except KeyError:
        raise UserError(
            f"study {plan.name!r} is not in {plan.storage_shown} (start it with `hpcpipe hpo run`)"
        ) from None
    except Exception as exc:  # the driver's own message (connection refused, no such database...)
        if isinstance(exc, UserError):
            raise
        reason = hide_credentials(
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        )
        raise UserError(f"hpo.storage {plan.storage_shown}: cannot open the study ({reason})") from None
    if create and study.direction.name.lower() != ("maximize" if maximize(plan.base) else "minimize"):
        raise UserError(
            f"study {plan.name!r} exists with direction {study.direction.name.lower()}; hpo.direction differs"
        )
    if create:
        _same_metric(study, plan)
        _same_directory(study, plan)
    study.sampler = build_sampler(plan.hpo, worker, held=len(study.get_trials(deepcopy=False)))
    return study, storage


def _same_metric(study: optuna.Study, plan: StudyPlan) -> None:
    """A study ranks its trials by one metric: continuing it with another compared, say, val_ppl
    with val_loss (best trial, the median pruner). Studies older than the record get it now."""
    recorded = study.user_attrs.get(METRIC_ATTR)
    if recorded is None:
        study.set_user_attr(METRIC_ATTR, plan.hpo.metric)
    elif recorded != plan.hpo.metric:
        raise UserError(
            f"study {plan.name!r} ranks its trials by {recorded}; hpo.metric is {plan.hpo.metric} "
            "(continue it with the same metric, or give the new search another hpo.study)"
        )


def _same_directory(study: optuna.Study, plan: StudyPlan) -> None:
    """Two searches of one name on a shared store (another run.out_dir or hpo.dir) would merge:
    the second ran none of its own trials and reported the first's best as its own."""
    recorded = study.user_attrs.get(DIR_ATTR)
    if recorded is None:
        study.set_user_attr(DIR_ATTR, str(plan.study_dir))
    elif recorded != str(plan.study_dir):
        raise UserError(
            f"study {plan.name!r} in {plan.storage_shown} is the search of {recorded}, not of "
            f"{plan.study_dir} (continue it from there, or give this search another hpo.study)"
        )
