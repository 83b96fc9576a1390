"""hpo: the config section, the space, storages, liveness (heartbeats, retries), the trial budget,
the trainer's link to its trial, the best config, and the Slurm array script. The worker's
handling of each trial's end, retries and run directories: test_worker_trials.py."""

from __future__ import annotations

import shutil
import subprocess
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from tests.helpers import run_cli

from hpcpipe.config import load_config
from hpcpipe.errors import ConfigError, UserError
from hpcpipe.hpo.liveness import HEARTBEAT_ATTR, fail_stale_trials, mark_alive, retried_from
from hpcpipe.hpo.results import best_config
from hpcpipe.hpo.space import check_space, grid_space, maximize, suggest
from hpcpipe.hpo.study import build_sampler, open_study, plan_study, warn_if_parallel_sqlite, write_record
from hpcpipe.hpo.worker import RUN_DIR_ATTR, SURPLUS_ATTR, _budget_spent, _is_surplus
from hpcpipe.train.trial import ENV_STORAGE, ENV_STUDY, ENV_TRIAL, TrialLink, build_pruner

SPACE = (
    "hpo.space={train.lr: {type: float, low: 1.0e-4, high: 0.1, log: true}, "
    "train.optimizer: {type: categorical, choices: [adamw, sgd]}, "
    "train.momentum: {type: float, low: 0.8, high: 0.99, when: {train.optimizer: sgd}}}"
)


def _job(tmp_path: Path, *sets: str):  # type: ignore[no-untyped-def]
    return load_config("tiny", [f"run.out_dir={tmp_path}", SPACE, *sets])


def test_param_shapes_and_storage_passwords_are_checked() -> None:
    bad = {
        "hpo.space={train.lr: {type: float, low: 0, high: 1, log: true}}": "low > 0",
        "hpo.space={train.optimizer: {type: categorical}}": "choices",
        "hpo.space={train.lr: {type: float, low: 2, high: 1}}": "above high",
        "hpo.storage=postgresql://me:secret@db:5432/hpo": "PGPASSWORD",
        "hpo.storage=postgresql://me@db:5432/hpo?sslmode=require&password=secret": "PGPASSWORD",
        "hpo.space={model.n_layers: {type: int, low: 1, high: 8, step: 0.5}}": "whole-number step",
        "hpo.heartbeat_s=30": "grace_s",
        # 1 == True to Optuna: the grid searched one value where the user listed two
        "hpo.space={train.compile: {type: categorical, choices: [1, true]}}": "1 and True are the same",
        "hpo.space={train.lr: {type: categorical, choices: [0.1, [0.2]]}}": "not a plain value",
    }
    for item, needle in bad.items():
        with pytest.raises(ConfigError, match=needle) as info:
            load_config("tiny", [item])
        assert "secret" not in str(info.value)


def test_space_keys_values_conditions_and_metric_are_named(tmp_path: Path) -> None:
    check_space(_job(tmp_path))
    cases = {
        "hpo.space={train.lrr: {type: float, low: 0.1, high: 1}}": "hpo.space.train.lrr: unknown config key",
        "hpo.space={train.steps: {type: int, low: 0, high: 4}}": "hpo.space.train.steps",
        "hpo.space={train.momentum: {type: float, low: 0.8, high: 0.9, when: {train.optimizer: sgd}}}": (
            "declared before"
        ),
        "hpo.metric=val_acc": "evaluates val_loss, val_ppl",
        # SGD for sgd: momentum was never sampled, without a word
        "hpo.space={train.optimizer: {type: categorical, choices: [adamw, sgd]}, "
        "train.momentum: {type: float, low: 0.8, high: 0.9, when: {train.optimizer: SGD}}}": (
            "train.optimizer never takes 'SGD' \\(its choices: adamw, sgd\\)"
        ),
    }
    # An int or float parent's value it never takes: the key under it was never sampled either.
    parent = "hpo.space={model.n_layers: {type: int, low: 1, high: 5, step: 2}, "
    child = "train.lr: {type: float, low: 0.01, high: 0.1, when: {model.n_layers: %s}}}"
    for wanted, why in {
        "7": "its range: 1 to 5",
        "2": "its steps: 1, 3, 5",
        "four": "it is an int parameter",
        "true": "it is an int parameter",
    }.items():
        cases[parent + child % wanted] = f"hpo.space.train.lr.when: model.n_layers never takes .*{why}"
    dropout = "hpo.space={model.dropout: {type: float, low: 0.0, high: 0.3%s}, " + child.replace(
        "model.n_layers: %s", "model.dropout: 0.3"
    )
    cases[dropout % ""] = "without a step"
    stepped = load_config("tiny", [SPACE, dropout % ", step: 0.1"])
    check_space(stepped)  # 0.3 is a step: fine, and a step that drifted in its last bits matches
    drifted = optuna.trial.FixedTrial({"model.dropout": 0.1 * 3, "train.lr": 0.05})
    assert suggest(drifted, stepped.hpo.space)["train.lr"] == 0.05
    for item, needle in cases.items():
        with pytest.raises(UserError, match=needle):
            check_space(load_config("tiny", [SPACE, item]))


def test_conditional_parameters_are_sampled_only_when_their_condition_holds(tmp_path: Path) -> None:
    space = _job(tmp_path).hpo.space
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = []
    for _ in range(12):
        trial = study.ask()
        values = suggest(trial, space)
        seen.append(values["train.optimizer"])
        assert ("train.momentum" in values) == (values["train.optimizer"] == "sgd")
        assert 1e-4 <= values["train.lr"] <= 0.1
        study.tell(trial, 1.0)
    assert set(seen) == {"adamw", "sgd"}


def test_grid_space_needs_steps_for_floats_and_no_conditions(tmp_path: Path) -> None:
    job = load_config(
        "tiny",
        [
            "hpo.space={train.lr: {type: float, low: 0.1, high: 0.3, step: 0.1}, "
            "model.n_layers: {type: int, low: 1, high: 3}}"
        ],
    )
    grid = grid_space(job.hpo.space)
    assert grid["model.n_layers"] == [1, 2, 3] and grid["train.lr"] == [
        0.1,
        0.2,
        0.3,
    ]  # no 0.30000000000000004
    # Points stay within [low, high]: round() gave 1, 3, 5 and 0, 0.3, 0.6.
    uneven = (
        "hpo.space={model.n_layers: {type: int, low: 1, high: 4, step: 2}, "
        "train.lr: {type: float, low: 0, high: 0.5, step: 0.3}}"
    )
    assert grid_space(load_config("tiny", [uneven]).hpo.space) == {
        "model.n_layers": [1, 3],
        "train.lr": [0.0, 0.3],
    }
    with pytest.raises(UserError, match="conditional"):
        grid_space(_job(tmp_path).hpo.space)


def test_storage_urls_are_absolute_and_parallel_sqlite_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan = plan_study(_job(Path("runs")))
    assert plan.storage_url == f"sqlite:///{tmp_path}/runs/hpo-tiny/study.db"
    assert warn_if_parallel_sqlite(plan, 1) is None
    assert "advises against SQLite" in (warn_if_parallel_sqlite(plan, 2) or "")
    journal = plan_study(_job(Path("runs"), "hpo.storage=journal:shared/study.log"))
    assert journal.storage_url == f"journal:{tmp_path}/shared/study.log"
    assert plan_study(_job(Path("runs"), "hpo.storage=journal")).storage_url == (
        f"journal:{tmp_path}/runs/hpo-tiny/journal.log"
    )
    with pytest.raises(UserError, match="use sqlite"):
        plan_study(_job(Path("runs"), "hpo.storage=mysql://db/hpo"))


def test_postgresql_connections_time_out_unless_the_url_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libpq waits forever by default: a store cut off by the network hung the worker and its
    trial's heartbeat in a connect or a query."""
    import sqlalchemy

    from hpcpipe.train.trial import open_storage

    seen: dict[str, dict] = {}

    def storage(url: str, engine_kwargs: dict) -> SimpleNamespace:
        seen[url] = engine_kwargs  # the engine connects only when used
        return SimpleNamespace(engine=sqlalchemy.create_engine(url, **engine_kwargs))

    monkeypatch.setattr(optuna.storages, "RDBStorage", storage)
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    open_storage("postgresql://me@db:5432/hpo")
    open_storage("postgresql://me@db:5432/hpo?connect_timeout=3")
    plain, given = (kwargs["connect_args"] for kwargs in seen.values())
    assert plain["connect_timeout"] == 10 and plain["tcp_user_timeout"] > 0
    assert "connect_timeout" not in given  # the URL's 3 stands


def test_a_statement_timeout_in_pgoptions_or_the_url_stands_even_when_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An explicit statement_timeout=0 (no limit, on purpose) read back as '0', as no limit at all
    does, and the default 60 s replaced it."""
    from hpcpipe.train.trial import open_storage, statement_timeout_given

    limited: list[str] = []
    monkeypatch.setattr(optuna.storages, "RDBStorage", lambda url, engine_kwargs: SimpleNamespace(engine=url))
    monkeypatch.setattr("hpcpipe.train.trial.limit_statements", limited.append)
    monkeypatch.delenv("PGSERVICE", raising=False)
    monkeypatch.setenv("PGOPTIONS", "-c search_path=hpo")
    open_storage("postgresql://me@db/hpo")
    open_storage("postgresql://me@db/hpo?options=-c%20statement_timeout%3D0")
    monkeypatch.setenv("PGOPTIONS", "-c statement_timeout=0")
    open_storage("postgresql://me@db/hpo")
    assert limited == ["postgresql+psycopg://me@db/hpo"]  # only where neither names it
    monkeypatch.setenv("PGOPTIONS", "--statement-timeout=5min -c search_path=hpo")
    assert statement_timeout_given("postgresql://me@db/hpo")
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=5s")
    assert not statement_timeout_given("postgresql://me@db/hpo?options=-c%20idle_session_timeout%3D0")


def test_postgresql_settings_leave_the_environment_and_other_databases_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """libpq's keywords went to every non-SQLite URL (pymysql refuses them), and overrode
    PGCONNECT_TIMEOUT and PGOPTIONS (a search_path there was lost); the statement limit went in
    the ``options`` startup parameter, which PgBouncer refuses."""
    from hpcpipe.train.trial import open_storage

    seen: dict[str, dict] = {}
    monkeypatch.setattr(
        optuna.storages,
        "RDBStorage",
        lambda url, engine_kwargs: seen.update({url: engine_kwargs}) or SimpleNamespace(engine=None),
    )
    monkeypatch.setattr("hpcpipe.train.trial.limit_statements", lambda engine: None, raising=False)
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "30")
    monkeypatch.setenv("PGOPTIONS", "-c search_path=hpo")
    open_storage("mysql+pymysql://me@db:3306/hpo")
    open_storage("postgresql://me@db/hpo?options=-c%20search_path%3Dhpo")
    open_storage("postgresql://me@db/hpo?service=hpo")
    mysql, pg, service = seen.values()
    assert "connect_args" not in mysql
    assert "options" not in pg["connect_args"] and "connect_timeout" not in pg["connect_args"]
    assert pg["connect_args"]["keepalives"] == 1
    assert service["connect_args"] == {}  # its service file says what it wants


def new_study(tmp_path: Path, *sets: str):  # type: ignore[no-untyped-def]
    plan = plan_study(_job(tmp_path, *sets))
    study, storage = open_study(plan, create=True)
    write_record(plan)
    return plan, study, storage


def test_a_trial_without_heartbeats_is_failed_and_retried_in_its_run_dir(tmp_path: Path) -> None:
    plan, study, storage = new_study(tmp_path, "hpo.heartbeat_s=1", "hpo.grace_s=3", "hpo.max_retries=1")
    dead, alive = study.ask(), study.ask()
    for trial in (dead, alive):
        suggest(trial, plan.hpo.space)
        trial.set_user_attr(RUN_DIR_ATTR, f"/runs/trial-{trial.number}")
    time.sleep(1.5)  # both started 1.5 s ago; one beat since, one did not
    mark_alive(storage, dead._trial_id, time.time() - 60)
    mark_alive(storage, alive._trial_id)
    assert fail_stale_trials(study, storage, 1.0, 1) == [0]
    assert fail_stale_trials(study, storage, 1.0, 1) == []  # the second sweep finds nothing
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "RUNNING", "WAITING"]
    retry = trials[2]
    assert retried_from(retry) == 0 and retry.params == trials[0].params
    assert retry.user_attrs[RUN_DIR_ATTR] == "/runs/trial-0"  # the retry resumes there
    study.tell(alive, 1.0)
    # The retry fails again: max_retries=1 is used up, nothing more is enqueued.
    started = study.ask()
    assert started.number == 2
    assert storage.get_trial(started._trial_id).system_attrs[HEARTBEAT_ATTR][0] == dead._trial_id  # inherited
    time.sleep(0.01)
    assert fail_stale_trials(study, storage, 5.0, 1) == []  # the inherited beat is not its own: just asked
    mark_alive(storage, started._trial_id, time.time() - 60)
    assert fail_stale_trials(study, storage, 5.0, 1) == [2]
    assert len(study.get_trials()) == 3


def test_a_heartbeat_of_an_older_worker_still_counts(tmp_path: Path) -> None:
    """A bare time (the format before the trial id) read as no heartbeat: a live trial of a worker
    still on the older version was failed and retried into its own run directory."""
    _, study, storage = new_study(tmp_path)
    trial = study.ask()
    time.sleep(1.2)
    storage.set_trial_system_attr(trial._trial_id, HEARTBEAT_ATTR, time.time())  # alive just now
    assert fail_stale_trials(study, storage, 1.0, 0) == []


def test_a_dead_trial_is_failed_when_the_sweeping_worker_is_in_another_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Optuna's datetime_start is the asking host's naive local time: read 10 h west of it, the
    trial had started in the future, and a dead trial looked alive for 10 hours."""
    _, study, storage = new_study(tmp_path)
    monkeypatch.setenv("TZ", "UTC-5")  # POSIX: five hours east of UTC
    time.tzset()
    trial = study.ask()
    mark_alive(storage, trial._trial_id, time.time() - 60)  # its worker died a minute ago
    monkeypatch.setenv("TZ", "UTC+5")
    time.tzset()
    try:
        assert fail_stale_trials(study, storage, 10.0, 0) == [0]
    finally:
        monkeypatch.undo()
        time.tzset()


def test_exactly_n_trials_run_however_the_asks_interleave(tmp_path: Path) -> None:
    _, study, storage = new_study(tmp_path, "hpo.n_trials=2")
    asked = [study.ask() for _ in range(3)]  # three workers asked before anyone checked
    assert [_is_surplus(study, storage, t, 2) for t in asked] == [False, False, True]
    study.tell(asked[2], state=optuna.trial.TrialState.FAIL)
    assert storage.get_trial(asked[2]._trial_id).user_attrs[SURPLUS_ATTR] is True
    assert _budget_spent(study, 2)
    for trial in asked[:2]:
        study.tell(trial, 1.0)
    assert _budget_spent(study, 2)


def test_the_trainer_link_reports_prunes_and_stops_on_a_finished_trial(tmp_path: Path) -> None:
    plan, study, _ = new_study(tmp_path, "hpo.pruner.n_startup_trials=1")
    assert not TrialLink(plan.hpo, True, env={}).active
    done = study.ask()
    done.report(1.0, 5)
    study.tell(done, 1.0)
    trial = study.ask()
    env = {ENV_STORAGE: plan.storage_url, ENV_STUDY: plan.name, ENV_TRIAL: str(trial._trial_id)}
    assert TrialLink(plan.hpo, False, env=env).should_stop(5, {"val_loss": 9.0}, None) is None  # rank 1
    link = TrialLink(plan.hpo, True, env=env)
    assert link.should_stop(5, {"val_loss": 9.0}, None) == "pruned by the study's pruner"
    assert study.get_trials()[1].intermediate_values == {5: 9.0}
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert link.should_stop(10, {"val_loss": 0.5}, None) == "the trial already ended in the study"


def test_best_config_sets_the_values_and_the_overrides(tmp_path: Path) -> None:
    plan, study, _ = new_study(tmp_path)
    with pytest.raises(UserError, match="no completed trial"):
        best_config(plan, study, [])
    lr = optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)
    for value, loss in ((0.01, 2.0), (0.002, 1.5)):
        study.add_trial(
            optuna.create_trial(params={"train.lr": value}, distributions={"train.lr": lr}, value=loss)
        )
    job = best_config(plan, study, ["train.steps=99", "parallel.nnodes=2"])
    assert job.train.lr == pytest.approx(0.002)
    assert job.train.steps == 99 and job.parallel.node_range == (2, 2)
    assert job.run.name == "tiny-best" and job.hpo.space == {}
    with pytest.raises(UserError, match=r"train\.stepz"):
        best_config(plan, study, ["train.stepz=1"])
    # The best trial's own config.yaml wins over the study's base, which a later `hpo run
    # --set train.steps=100` rewrote: the export reproduces what the trial trained with.
    run_dir = tmp_path / "trained"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(_job(tmp_path, "train.steps=7", "train.lr=0.004").to_yaml())
    trial = optuna.create_trial(params={"train.lr": 0.004}, distributions={"train.lr": lr}, value=1.0)
    trial.set_user_attr(RUN_DIR_ATTR, str(run_dir))
    study.add_trial(trial)
    job = best_config(plan, study, [])
    assert (job.train.steps, job.train.lr, job.run.name) == (7, 0.004, "tiny-best")
    assert job.run.out_dir == plan.base.run.out_dir and job.hpo.space == {}


def test_the_cli_names_bad_input_in_one_line(tmp_path: Path) -> None:
    bad = run_cli(
        "hpo", "run", "tiny", "--set", "hpo.space={train.nope: {type: int, low: 1, high: 2}}", cwd=tmp_path
    )
    assert bad.returncode == 2 and "hpo.space.train.nope" in bad.stderr and "Traceback" not in bad.stderr
    empty = run_cli("hpo", "run", "tiny", cwd=tmp_path)
    assert empty.returncode == 2 and "hpo.space is empty" in empty.stderr
    missing = run_cli("hpo", "status", str(tmp_path), cwd=tmp_path)
    assert missing.returncode == 2 and "not a study directory" in missing.stderr
    # A grace the workers could not stop a trial within before its retry: refused before the study.
    short = run_cli("hpo", "run", "tiny", "--set", SPACE, "--set", "hpo.grace_s=41", cwd=tmp_path)
    assert short.returncode == 2 and short.stderr.startswith("error: hpo.grace_s (41) must be at least 55 s")
    assert len(short.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_the_slurm_array_script_runs_workers_and_refuses_sqlite(tmp_path: Path) -> None:
    from hpcpipe.hpo.slurm import check_shared_storage, render_array

    plan = plan_study(_job(tmp_path, "hpo.storage=journal:/shared/study.log", "launch.slurm.gpus_per_node=4"))
    script = render_array(plan, workers=3)
    assert "#SBATCH --array=0-2" in script and "--gpus-per-node=4" in script
    assert f"hpo worker {plan.study_dir} --nproc 4" in script
    path = tmp_path / "hpo.sbatch"
    path.write_text(script)
    shellcheck = shutil.which("shellcheck") or str(Path(__import__("sys").executable).parent / "shellcheck")
    proc = subprocess.run([shellcheck, str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout
    with pytest.raises(UserError, match="cannot share SQLite"):
        check_shared_storage(plan_study(_job(tmp_path)))
    # The study name and directory land in the script: a newline would add a command to it.
    with pytest.raises(ConfigError, match=r"hpo\.study: must not contain newlines"):
        _job(tmp_path, "hpo.study=x\necho pwned")
    # A secret in launch.slurm.env is refused when the script is rendered (the config loads).
    secret = plan_study(_job(tmp_path, "hpo.storage=journal:/s.log", "launch.slurm.env={HF_TOKEN: hf_1}"))
    with pytest.raises(ConfigError, match=r"launch\.slurm\.env: HF_TOKEN looks like a secret"):
        render_array(secret, workers=3)


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "gp", "grid"])
def test_every_sampler_suggests_values_inside_the_space(sampler: str) -> None:
    space = (
        "hpo.space={train.lr: {type: float, low: 0.001, high: 0.003, step: 0.001}, "
        "model.n_layers: {type: int, low: 1, high: 3}}"
    )
    job = load_config("tiny", [space, f"hpo.sampler.name={sampler}", "hpo.sampler.n_startup_trials=1"])
    study = optuna.create_study(sampler=build_sampler(job.hpo))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            trial = study.ask()
            values = suggest(trial, job.hpo.space)
            assert 0.001 <= values["train.lr"] <= 0.003 and values["model.n_layers"] in (1, 2, 3)
            study.tell(trial, values["train.lr"] * values["model.n_layers"])


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("median", "MedianPruner"),
        ("hyperband", "HyperbandPruner"),
        ("successive_halving", "SuccessiveHalvingPruner"),
        ("none", "NopPruner"),
    ],
)
def test_pruners_are_optunas(name: str, kind: str) -> None:
    assert type(build_pruner(load_config("tiny", [f"hpo.pruner.name={name}"]).hpo.pruner)).__name__ == kind


def test_grid_workers_and_continuations_train_each_point_once(tmp_path: Path) -> None:
    """The grid's seed shuffles its points and a trial's grid id indexes that order: seeded per
    worker and per continuation, one id was another point in each, so n_layers 4, 4, 1, 1 ran."""
    from hpcpipe.hpo.worker import _told

    grid = "hpo.space={model.n_layers: {type: int, low: 1, high: 4}}"
    hpo = _job(tmp_path, grid, "hpo.sampler.name=grid").hpo
    storage = optuna.storages.InMemoryStorage()
    optuna.create_study(storage=storage, study_name="g")
    ran = []
    for worker, held in ((0, 0), (1, 0), (0, 2), (1, 3)):  # two workers, then a continuation
        study = optuna.load_study(study_name="g", storage=storage, sampler=build_sampler(hpo, worker, held))
        trial = study.ask()
        ran.append(suggest(trial, hpo.space)["model.n_layers"])
        _told(study, trial, 1.0)
    assert sorted(ran) == [1, 2, 3, 4]


def test_a_relative_storage_path_is_found_from_any_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpo.storage=journal:shared/s.log` was saved as given: `hpo status STUDY_DIR` from another
    directory looked for shared/s.log there and said the study did not exist."""
    from hpcpipe.hpo.study import load_plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "shared").mkdir()
    plan, study, _ = new_study(tmp_path, "hpo.storage=journal:shared/s.log")
    study.tell(study.ask(), 1.0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    again = load_plan(plan.study_dir)
    assert again.storage_url == f"journal:{tmp_path / 'shared/s.log'}"
    assert len(open_study(again)[0].get_trials()) == 1


def test_the_tiny_hpo_preset_is_a_valid_study() -> None:
    job = load_config("tiny-hpo")
    check_space(job)
    assert job.hpo.space["train.momentum"].when == {"train.optimizer": "sgd"} and not maximize(job)


def test_workers_seed_their_samplers_apart(tmp_path: Path) -> None:
    """Two workers seeded alike would start with the same random trial."""
    hpo = _job(tmp_path).hpo
    firsts = []
    for worker in (0, 1, 0):
        study = optuna.create_study(sampler=build_sampler(hpo, worker))
        firsts.append(suggest(study.ask(), hpo.space)["train.lr"])
    assert firsts[0] == firsts[2] and firsts[0] != firsts[1]


def test_processes_opening_a_study_together_draw_apart_and_a_lone_one_reproducibly(tmp_path: Path) -> None:
    """Two `hpo run` commands on one store, started together: both worker 0, both seeing no
    trials, seeded alike, and drew the same points side by side."""
    from hpcpipe.hpo.worker import _ask

    plan, _, _ = new_study(tmp_path / "shared", "hpo.sampler.name=random")
    a, store_a = open_study(plan, worker=0)
    b, store_b = open_study(plan, worker=0)
    first_a, first_b = _ask(a, store_a, plan.hpo, 0, first=True), _ask(b, store_b, plan.hpo, 0, first=True)
    drawn = [suggest(t, plan.hpo.space)["train.lr"] for t in (first_a, first_b)]
    assert drawn[0] != drawn[1]
    # One process alone on a study: its draws follow hpo.seed, run after run.
    alone = []
    for name in ("one", "two"):
        plan, study, storage = new_study(tmp_path / name, "hpo.sampler.name=random")
        alone.append(
            [suggest(_ask(study, storage, plan.hpo, 0, first=n == 0), plan.hpo.space) for n in range(2)]
        )
    assert alone[0] == alone[1] and alone[0][0]["train.lr"] == drawn[0]


def test_a_continued_study_keeps_its_metric_and_draws_new_points(tmp_path: Path) -> None:
    """Continuing with another hpo.metric compared val_ppl with val_loss; continuing at all
    (a second `hpo run`, worker 0 again) drew the first run's random points one for one."""
    random = ("hpo.sampler.name=random", "hpo.seed=3")
    plan, study, _ = new_study(tmp_path, *random)
    first = [suggest(study.ask(), plan.hpo.space)["train.lr"] for _ in range(2)]
    again, _ = open_study(plan_study(_job(tmp_path, *random)), create=True)
    assert suggest(again.ask(), plan.hpo.space)["train.lr"] not in first
    with pytest.raises(UserError, match=r"ranks its trials by val_loss; hpo.metric is val_ppl"):
        open_study(plan_study(_job(tmp_path, *random, "hpo.metric=val_ppl")), create=True)


def test_every_verb_that_takes_a_study_accepts_its_directory_or_the_job_and_out_dir(tmp_path: Path) -> None:
    """status, best, plots and worker find the same study from STUDY_DIR or from JOB --set run.out_dir."""
    from typer.testing import CliRunner

    from hpcpipe.cli.app import app

    out = tmp_path / "R"
    plan = plan_study(load_config("tiny-hpo", [f"run.out_dir={out}"]))
    write_record(plan)
    open_study(plan, create=True)
    forms = {"dir": [str(plan.study_dir)], "job": ["tiny-hpo", "--set", f"run.out_dir={out}"]}
    runner = CliRunner()
    for form, where in forms.items():
        status = runner.invoke(app, ["hpo", "status", *where, "--json", "-"])
        assert status.exit_code == 0 and f'"study": "{plan.name}"' in status.stdout, (form, status.output)
        best = runner.invoke(app, ["hpo", "best", *where])  # found it: it has no completed trial yet
        assert isinstance(best.exception, UserError) and "no completed trial yet" in str(best.exception), form
        plots = runner.invoke(app, ["hpo", "plots", *where])
        assert plots.exit_code == 0, (form, plots.output)
    elsewhere = runner.invoke(app, ["hpo", "best", "tiny-hpo", "--set", f"run.out_dir={tmp_path / 'none'}"])
    assert isinstance(elsewhere.exception, UserError)


def test_one_search_per_study_name_and_per_study_directory(tmp_path: Path) -> None:
    """A second search of the same name on a shared store ran none of its trials and reported the
    first's best as its own; a second study in one hpo.dir shared its trial folders."""
    from hpcpipe.hpo.study import check_record

    shared = f"hpo.storage=journal:{tmp_path}/shared.log"
    new_study(tmp_path / "a", shared)
    with pytest.raises(UserError, match=r"is the search of .*/a/hpo-tiny, not of .*/b/hpo-tiny"):
        open_study(plan_study(_job(tmp_path / "b", shared)), create=True)
    open_study(plan_study(_job(tmp_path / "a", shared)), create=True)  # continuing it is fine
    other = plan_study(_job(tmp_path / "a", "hpo.study=other", f"hpo.dir={tmp_path}/a/hpo-tiny"))
    with pytest.raises(UserError, match=r"holds study 'tiny', not 'other'"):
        check_record(other)


def test_hpo_launch_slurm_checks_everything_before_it_writes(tmp_path: Path) -> None:
    proc = run_cli("hpo", "launch", "slurm", "tiny", "--set", SPACE, cwd=tmp_path)  # SQLite
    assert proc.returncode == 2 and "cannot share SQLite" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no study.db, study.json or base.yaml
    bad = "hpo.space={train.lrr: {type: float, low: 0.1, high: 1}}"
    proc = run_cli("hpo", "launch", "slurm", "tiny", "--dry-run", "--set", bad, cwd=tmp_path)
    assert proc.returncode == 2 and "hpo.space.train.lrr" in proc.stderr
