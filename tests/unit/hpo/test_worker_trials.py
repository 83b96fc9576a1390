"""hpo's worker and its trials: how a trial's end decides its state and retry (preemptions,
crashes, divergence), trials stopped or failed before they start, retries and the stale sweep
racing a tell, earlier studies' folders, and each trial's own run and checkpoint directories.
The study, its space, storages and heartbeats: test_hpo.py (whose ``new_study`` these use)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import optuna
import pytest
from tests.helpers import run_cli
from tests.unit.hpo.test_hpo import new_study

from hpcpipe.hpo.liveness import fail_stale_trials, mark_alive, retried_from
from hpcpipe.hpo.space import suggest
from hpcpipe.hpo.worker import RUN_DIR_ATTR, _budget_spent, _tell
from hpcpipe.train.preempt import PREEMPT_EXIT_CODE
from hpcpipe.train.trial import ENV_STORAGE, ENV_STUDY, ENV_TRIAL, PRUNED_EXIT_CODE


def test_how_a_trial_process_ended_decides_its_state_and_retry(tmp_path: Path) -> None:
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 5, "loss": 3.0}\n{"step": 5, "val_loss": 2.5}\n')
    said: list[str] = []
    outcomes = {}
    codes = (0, PRUNED_EXIT_CODE, PREEMPT_EXIT_CODE, 2, -9)
    trials = [study.ask() for _ in codes]  # all asked first: a retry would be the next ask
    for code, trial in zip(codes, trials, strict=True):
        suggest(trial, plan.hpo.space)
        trial.report(4.0, 5)
        outcomes[code] = _tell(plan, study, storage, trial, code, run_dir, 1.0, said.append)
    assert outcomes[0].state == "COMPLETE" and outcomes[0].value == 2.5
    assert outcomes[PRUNED_EXIT_CODE].state == "PRUNED" and outcomes[PRUNED_EXIT_CODE].value == 4.0
    assert outcomes[PREEMPT_EXIT_CODE].note.startswith("preempted") and outcomes[-9].note.startswith(
        "exit code -9"
    )
    retries = [retried_from(t) for t in study.get_trials() if t.state.name == "WAITING"]
    assert retries == [2, 4]  # preempted and crashed trials come back; a refused config does not
    assert "refused its config" in outcomes[2].note
    assert study.get_trials()[3].user_attrs["hpcpipe:failure"] == outcomes[2].note
    # The preempted trial's retry completes: it inherits the note ("preempted"), shown no longer.
    from hpcpipe.hpo.results import trial_rows

    retry_of_preempted = study.ask()
    assert retried_from(study.get_trials()[retry_of_preempted.number]) == 2
    study.tell(retry_of_preempted, 1.0)
    assert [r["note"] for r in trial_rows(study) if r["number"] == retry_of_preempted.number] == [""]


def test_a_grid_study_tells_its_last_point_and_ends(tmp_path: Path) -> None:
    """Optuna's GridSampler calls study.stop() after the last point, which raises outside
    study.optimize: the worker died with a traceback on every grid study's last trial."""
    grid = "hpo.space={train.optimizer: {type: categorical, choices: [adamw, sgd]}}"
    plan, study, storage = new_study(tmp_path, grid, "hpo.sampler.name=grid", "hpo.n_trials=10")
    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 5, "val_loss": 2.5}\n')
    said: list[str] = []
    for _ in range(2):
        assert not _budget_spent(study, 10)
        trial = study.ask()
        suggest(trial, plan.hpo.space)
        assert _tell(plan, study, storage, trial, 0, run_dir, 1.0, said.append).state == "COMPLETE"
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE", "COMPLETE"]
    assert _budget_spent(study, 10)  # every point ran: asking again would repeat one


def test_a_diverged_trial_is_complete_and_ranked_worst(tmp_path: Path) -> None:
    """A NaN final metric was passed to Optuna, which FAILed the trial while the worker counted
    it COMPLETE; TPE never learnt that the region diverges."""
    plan, study, storage = new_study(tmp_path)
    run_dir = tmp_path / "trial"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 5, "val_loss": NaN}\n')
    trial = study.ask()
    suggest(trial, plan.hpo.space)
    outcome = _tell(plan, study, storage, trial, 0, run_dir, 1.0, lambda _: None)
    assert outcome.state == "COMPLETE" and outcome.value == float("inf")
    assert study.get_trials()[0].state.name == "COMPLETE" and study.get_trials()[0].value == float("inf")


def test_a_preemption_uses_no_retry_and_crashes_stay_bounded(tmp_path: Path) -> None:
    """A preemption counted against hpo.max_retries (1 by default): a trial stopped by two Slurm
    time limits was failed for good, though the exit-75 message said to run again to continue."""
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    said: list[str] = []
    ends = []
    codes = (PREEMPT_EXIT_CODE, PREEMPT_EXIT_CODE, PREEMPT_EXIT_CODE, -9, PREEMPT_EXIT_CODE, -9)
    for step, code in enumerate(codes, start=1):
        trial = study.ask()
        suggest(trial, plan.hpo.space)
        _commit(tmp_path, step)  # each try got further
        ends.append(_tell(plan, study, storage, trial, code, tmp_path, 1.0, said.append, since=step - 1))
    assert [t.state.name for t in study.get_trials()] == ["FAIL"] * 6  # each came back but the last
    assert ends[0].note == "preempted (checkpoint committed at step 1)"
    assert [retried_from(t) for t in study.get_trials()] == [None, 0, 0, 0, 0, 0]
    assert said[-1].endswith("exit code -9 (see " + str(tmp_path / "train.log") + ")")  # none enqueued
    # Stopped by its own worker (its heartbeat lapsed): that uses a retry, as a crash does.
    plan, study, storage = new_study(tmp_path / "lapsed", "hpo.max_retries=1")
    for _ in range(2):
        trial = study.ask()
        suggest(trial, plan.hpo.space)
        _tell(plan, study, storage, trial, PREEMPT_EXIT_CODE, tmp_path, 1.0, said.append, lapsed=True)
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL"]
    assert "heartbeat did not reach the study" in study.get_trials()[1].user_attrs["hpcpipe:failure"]


def _commit(run_dir: Path, step: int) -> None:
    """A committed checkpoint of ``step`` in the run's fast tier (what the worker lists)."""
    (run_dir / "checkpoints" / f"step-{step:08d}").mkdir(parents=True, exist_ok=True)


def test_a_preemption_without_a_new_checkpoint_uses_a_retry(tmp_path: Path) -> None:
    """The trainer exits 75 without a checkpoint too (stopped before it trained a step, or past
    fault.preempt_grace_s): a trial caught so on every try was retried forever, each try said
    "checkpoint committed", and the study never ended."""
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    _commit(tmp_path, 20)
    said: list[str] = []
    for _ in range(2):
        trial = study.ask()
        suggest(trial, plan.hpo.space)
        _tell(plan, study, storage, trial, PREEMPT_EXIT_CODE, tmp_path, 1.0, said.append, since=20)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "FAIL"]  # its one retry used: no third try
    assert retried_from(trials[1]) == 0
    assert said[0].endswith(
        "preempted before a new checkpoint (still at step 20; counts as a retry); retry enqueued"
    )
    assert "retry enqueued" not in said[1]


def test_the_trials_own_preempt_exit_code_is_a_preemption(tmp_path: Path) -> None:
    """Only the constant 75 counted: with fault.preempt_exit_code 85 a preempted trial was a crash,
    failed for good after hpo.max_retries."""
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1", "fault.preempt_exit_code=85")
    said: list[str] = []
    for step in (1, 2, 3):
        trial = study.ask()
        suggest(trial, plan.hpo.space)
        _commit(tmp_path, step)
        _tell(plan, study, storage, trial, 85, tmp_path, 1.0, said.append, since=step - 1)
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "FAIL", "FAIL", "WAITING"]
    assert all("preempted (checkpoint committed" in line for line in said), said
    # A trial's own config decides (where the space searched it): 75 is then a crash.
    job = plan.base.model_copy(update={"fault": plan.base.fault.model_copy(update={"preempt_exit_code": 86})})
    trial = study.ask()
    _tell(plan, study, storage, trial, 86, tmp_path, 1.0, said.append, job=job, since=3)
    assert "preempted" in said[-1]


def test_a_trial_stopped_before_it_started_is_never_launched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat lapsed (or the worker was signalled) before the trial's process started: it
    was launched all the same, and its SIGTERM could land before it could checkpoint anything."""
    from hpcpipe.hpo import worker

    class LapsesAtOnce:
        def __init__(self, *args: object) -> None:
            self.on_lapse = args[4]

        def __enter__(self) -> None:
            self.on_lapse()  # type: ignore[operator]

        def __exit__(self, *exc: object) -> None:
            pass

    def never(*_: object) -> int:
        raise AssertionError("the trial was launched")

    monkeypatch.setattr(worker, "Heartbeat", LapsesAtOnce)
    monkeypatch.setattr(worker, "_train", never)
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    said: list[str] = []
    outcome = worker.run_trial(plan, study, storage, study.ask(), 1, said.append, worker.StopFlag())
    assert outcome.state == "FAIL" and "heartbeat did not reach the study before it started" in outcome.note
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]
    assert said[-1].endswith("retry enqueued")


def test_a_retry_whose_values_left_the_changed_space_fails_in_one_line(tmp_path: Path) -> None:
    """A retry waits with its original's values; the study was continued with other choices:
    Optuna's check raised in the worker, which died and left the trial RUNNING."""
    from hpcpipe.hpo.worker import StopFlag, run_trial

    plan, study, storage = new_study(tmp_path)
    study.enqueue_trial({"train.lr": 0.01, "train.optimizer": "lion"})  # the old space's choice
    said: list[str] = []
    outcome = run_trial(plan, study, storage, study.ask(), 1, said.append, StopFlag())
    assert outcome.state == "FAIL" and "do not fit the changed hpo.space" in said[0]
    assert study.get_trials()[0].state.name == "FAIL"


def test_a_trial_the_study_already_failed_leaves_its_run_dir_alone(tmp_path: Path) -> None:
    """A trial whose worker was SIGKILLed trains on, orphaned, while another worker fails and
    retries it in the same directory: at its next evaluation it committed a checkpoint there."""
    plan, study, _ = new_study(tmp_path, "hpo.pruner.name=none")
    trial = study.ask()
    study.tell(trial, state=optuna.trial.TrialState.FAIL)  # the stale check failed it
    env = {ENV_STORAGE: plan.storage_url, ENV_STUDY: plan.name, ENV_TRIAL: str(trial._trial_id)}
    sets = [f"run.out_dir={tmp_path}", "train.steps=6", "train.eval_every=2", "checkpoint.every_steps=4"]
    proc = run_cli("train", "tiny", *(a for s in sets for a in ("--set", s)), cwd=tmp_path, env=env)
    assert proc.returncode == PRUNED_EXIT_CODE, proc.stderr[-2000:]
    run = tmp_path / "tiny"
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").glob("step-*"))
    assert '"pruned"' not in (run / "events.jsonl").read_text()


def test_a_new_trial_moves_an_earlier_studys_folder_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store reset (journal deleted, SQLite -> journal): trial 0 resumed the old trial 0's
    checkpoint and reported its value without training."""
    from hpcpipe.hpo import worker

    plan, study, storage = new_study(tmp_path)
    old = plan.layout.trial_dir(0)
    old.mkdir(parents=True)
    (old / "metrics.jsonl").write_text('{"step": 20, "val_loss": 4.2111}\n')

    def train(run_dir: Path, *_: object) -> int:
        assert not (run_dir / "metrics.jsonl").exists()  # a fresh folder
        (run_dir / "metrics.jsonl").write_text('{"step": 20, "val_loss": 3.5}\n')
        return 0

    monkeypatch.setattr(worker, "_train", train)
    said: list[str] = []
    outcome = worker.run_trial(plan, study, storage, study.ask(), 1, said.append, worker.StopFlag())
    assert outcome.value == 3.5 and f"moved to {old}.earlier-1" in said[0]
    assert (old.parent / f"{old.name}.earlier-1" / "metrics.jsonl").read_text().endswith("4.2111}\n")


def test_a_trial_failed_meanwhile_by_a_sweep_is_not_retried_twice(tmp_path: Path) -> None:
    plan, study, storage = new_study(tmp_path, "hpo.max_retries=3")
    trial = study.ask()
    suggest(trial, plan.hpo.space)
    mark_alive(storage, trial._trial_id, time.time() - 600)
    assert fail_stale_trials(study, storage, 60.0, 3) == [0]  # and enqueued its retry
    said: list[str] = []
    outcome = _tell(plan, study, storage, trial, -9, tmp_path, 1.0, said.append)
    assert outcome.state == "FAIL" and "already failed it" in said[0]
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]


def test_a_trial_a_sweep_fails_while_it_is_told_is_retried_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep failing the trial after _tell's "already finished?" check: the FAIL tell skipped
    quietly and the worker enqueued a second retry of the same values in the same folder."""
    from hpcpipe.hpo import worker

    plan, study, storage = new_study(tmp_path, "hpo.max_retries=3")
    trial = study.ask()
    suggest(trial, plan.hpo.space)
    trial.set_user_attr(RUN_DIR_ATTR, str(tmp_path / "trial-0000"))
    mark_alive(storage, trial._trial_id, time.time() - 600)  # its beats stopped landing
    noted = worker.trial_note

    def sweep_meanwhile(*args: object) -> None:  # another worker sweeps right here
        assert fail_stale_trials(study, storage, 60.0, 3) == [0]
        noted(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(worker, "trial_note", sweep_meanwhile)
    said: list[str] = []
    outcome = _tell(plan, study, storage, trial, PREEMPT_EXIT_CODE, tmp_path, 1.0, said.append)
    assert outcome.state == "FAIL" and "already failed it" in said[0]
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]


def test_a_trial_whose_worker_died_on_this_host_is_failed_at_once(tmp_path: Path) -> None:
    import os
    import sys

    from hpcpipe.hpo.liveness import WORKER_ATTR, WORKER_NS_ATTR, pid_namespace

    _, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    dead, alive = study.ask(), study.ask()
    elsewhere = study.ask()  # another container of this host name (host networking): other pids
    for trial, pid in (
        (dead, gone.stdout.strip()),
        (alive, str(os.getpid())),
        (elsewhere, gone.stdout.strip()),
    ):
        trial.set_user_attr(WORKER_ATTR, f"{os.uname().nodename}:{pid}")
        trial.set_user_attr(WORKER_NS_ATTR, pid_namespace() if trial is not elsewhere else "other-boot:1")
        mark_alive(storage, trial._trial_id)  # beats are fresh: hpo.grace_s has not passed
    assert fail_stale_trials(study, storage, 600.0, 1) == [0]
    assert study.get_trials()[0].user_attrs["hpcpipe:failure"] == "its worker died"


def test_a_retry_is_not_failed_for_its_dead_originals_worker(tmp_path: Path) -> None:
    """A retry inherits its original's user attributes, the dead worker's host:pid among them:
    a sweep between the retry's ask and its worker naming itself failed the retry at once, and
    the worker's next suggest raised UpdateFinishedTrialError (a traceback, the trial lost)."""
    import os
    import sys

    from hpcpipe.hpo.liveness import claim
    from hpcpipe.hpo.worker import StopFlag, _ask, run_trial

    plan, study, storage = new_study(tmp_path, "hpo.max_retries=2")
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], check=True, capture_output=True, text=True
    )
    original = study.ask()
    with pytest.MonkeyPatch.context() as patch:  # its worker was that process, gone now
        patch.setattr(os, "getpid", lambda: int(gone.stdout))
        claim(storage, original._trial_id)
    suggest(original, plan.hpo.space)
    assert fail_stale_trials(study, storage, 600.0, 2) == [0]  # failed at once, its retry waits
    retry = _ask(study, storage, plan.hpo, 0, first=True)
    assert retried_from(storage.get_trial(retry._trial_id)) == 0
    assert fail_stale_trials(study, storage, 600.0, 2) == []  # the retry's worker is this one
    # Failed all the same before it started (its heartbeat lapsed): one line, no traceback.
    storage.set_trial_state_values(retry._trial_id, optuna.trial.TrialState.FAIL)
    said: list[str] = []
    outcome = run_trial(plan, study, storage, retry, 1, said.append, StopFlag())
    assert outcome.state == "FAIL" and "failed it before it started" in said[-1]


def test_a_worker_stopped_since_the_ask_starts_no_trial_and_retries_it(tmp_path: Path) -> None:
    from hpcpipe.hpo.worker import StopFlag, run_trial

    plan, study, storage = new_study(tmp_path, "hpo.max_retries=1")
    stop = StopFlag()
    stop.event.set()
    said: list[str] = []
    outcome = run_trial(plan, study, storage, study.ask(), 1, said.append, stop)
    assert outcome.state == "FAIL" and not outcome.run_dir.exists()
    assert [t.state.name for t in study.get_trials()] == ["FAIL", "WAITING"]


def test_a_worker_a_signal_stopped_before_the_budget_exits_75_or_130(tmp_path: Path) -> None:
    """`hpo run` and `hpo worker` exited 0 after SIGTERM or Ctrl-C with the trial preempted and
    the study unfinished: a scheduler or a script took the study for done."""
    import signal

    from hpcpipe.hpo.worker import StopFlag, stopped_exit_code

    plan, study, _ = new_study(tmp_path, "hpo.n_trials=1")
    codes = {}
    for signum in (None, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        stop = StopFlag()
        if signum is not None:
            stop._on_signal(signum, None)
        codes[signum] = stopped_exit_code(plan, stop)
    assert codes == {None: 0, signal.SIGTERM: 75, signal.SIGUSR1: 75, signal.SIGINT: 130}
    study.tell(study.ask(), 1.0)  # the budget is spent: stopped or not, the study is done
    stop = StopFlag()
    stop._on_signal(signal.SIGTERM, None)
    assert stopped_exit_code(plan, stop) == 0


def test_each_trial_has_its_own_checkpoint_directory(tmp_path: Path) -> None:
    """A checkpoint.dir outside the trials: trial 1 resumed trial 0's checkpoint."""
    from hpcpipe.hpo.space import trial_config

    plan, _, _ = new_study(tmp_path, f"checkpoint.dir={tmp_path}/ck")
    trials = str(plan.layout.trials)
    dirs = {trial_config(plan.base, {}, f"trial-{n:04d}", trials).checkpoint.dir for n in (0, 1)}
    assert len(dirs) == 2 and all(str(d).startswith(f"{tmp_path}/ck/") for d in dirs)
    # Another study's trial 0 (another directory, the same checkpoint.dir): its own directory too.
    other = trial_config(plan.base, {}, "trial-0000", str(tmp_path / "other" / "trials")).checkpoint.dir
    assert other not in dirs
    # The best trial's retrain starts fresh: not in the trial's own directory, which it would resume.
    from hpcpipe.hpo.results import best_config

    _, study, _ = new_study(tmp_path, f"checkpoint.dir={tmp_path}/ck")
    trial = study.ask()
    suggest(trial, plan.hpo.space)
    run_dir = plan.layout.trial_dir(0)
    run_dir.mkdir(parents=True)
    trained = trial_config(plan.base, dict(trial.params), run_dir.name, str(run_dir.parent))
    (run_dir / "config.yaml").write_text(trained.to_yaml())
    trial.set_user_attr(RUN_DIR_ATTR, str(run_dir))
    study.tell(trial, 1.0)
    assert best_config(plan, study, []).checkpoint.dir == f"{tmp_path}/ck"
