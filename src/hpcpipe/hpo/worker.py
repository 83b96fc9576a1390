"""One study worker: ask for a trial, train it as an ordinary run, tell the study how it ended.

Each trial is ``python -m hpcpipe train <trial dir>/config.yaml --nproc P`` in its own process
(a crash or an out-of-memory kill ends the trial, not the worker), with its output in
``<trial dir>/train.log``. The trial process reports evaluations itself (``train/trial.py``);
the worker owns the trial's state:

- exit 0: the metric of the last evaluation row is the trial's value (COMPLETE);
- exit 76 (``PRUNED_EXIT_CODE``): PRUNED, at the last reported value;
- exit ``fault.preempt_exit_code`` (75; preempted) with a checkpoint newer than the try started
  from: FAIL, retried in the same run directory, so the retry resumes the checkpoint, however
  often (a preemption is no fault of the trial's, and the trial got further);
- a crash: the same, up to ``hpo.max_retries`` times; so is a preemption that committed no newer
  checkpoint (caught before its first save every time, it would be retried forever) and one after
  a heartbeat lapse;
- exit 2 (the sampled values make a bad config): FAIL, not retried.

Many workers may share one study (local processes, Slurm array tasks): the budget of
``hpo.n_trials`` counts original trials by number, so exactly that many run however the asks
interleave; a trial asked past it is closed as surplus and never trained.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcpipe.config.checkpoint import own_checkpoint_dirs
from hpcpipe.errors import USER_ERROR_EXIT_CODE, UserError
from hpcpipe.hpo.liveness import (
    Heartbeat,
    check_stop_window,
    claim,
    fail_stale_trials,
    retried_from,
    retry,
    stop_window_s,
)
from hpcpipe.hpo.space import maximize, suggest, trial_config
from hpcpipe.hpo.study import StudyPlan, open_study, seed_from_first_trial
from hpcpipe.layout import RunLayout
from hpcpipe.train.trial import ENV_STORAGE, ENV_STUDY, ENV_TRIAL, PRUNED_EXIT_CODE

if TYPE_CHECKING:
    import optuna

    from hpcpipe.config import JobConfig
    from hpcpipe.config.hpo import HpoConfig

RUN_DIR_ATTR = "run_dir"  # a user attribute: retries inherit it and resume there
SURPLUS_ATTR = "hpcpipe:surplus"
STUDY_FAILED_IT = "the study failed it before it started (another worker's sweep); its retry, if any, runs it"


@dataclass
class TrialOutcome:
    number: int
    state: str  # COMPLETE, PRUNED, FAIL
    value: float | None
    run_dir: Path
    seconds: float
    note: str = ""


class StopFlag:
    """Set by SIGTERM/SIGUSR1/SIGINT: finish (or forward the signal to) the running trial, ask for
    no more."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.child: int | None = None  # the running trial's pid
        self.signum: int | None = None  # the first signal that stopped the worker
        self.lapsed = False  # the running trial's heartbeat lapsed: stop it, without stopping the worker
        self._lock = threading.Lock()  # the child's start against a lapse: one SIGTERM

    def install(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def started(self, pid: int) -> None:
        with self._lock:
            self.child = pid
            # The signal or the lapse came while the trial was starting: it was not passed on.
            if self.event.is_set() or self.lapsed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)

    def stopping(self) -> bool:
        """The worker was stopped, or the running trial's heartbeat lapsed: start no trial."""
        return self.event.is_set() or self.lapsed

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
        self.event.set()
        self.stop_child()

    def lapse(self) -> None:
        """The heartbeat's lapse: the running trial stops, or the starting one at its start (its
        watchdog fires once: a lapse while the zygote forked the trial was lost, and it trained on
        beside its retry)."""
        with self._lock:  # (the watchdog's thread; the signal handler cannot wait for the lock)
            self.lapsed = True
            self.stop_child()

    def stop_child(self) -> None:
        """SIGTERM the running trial: it checkpoints and exits 75."""
        child = self.child
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGTERM)


def run_worker(
    plan: StudyPlan,
    nproc: int,
    say: Callable[[str], None] = print,
    stop: StopFlag | None = None,
    worker: int = 0,
) -> list[TrialOutcome]:
    """Run trials until the study has ``hpo.n_trials`` originals and no retry waits, the timeout
    passes, or ``stop`` is set; returns what this worker ran."""
    check_stop_window(plan.base)
    study, storage = open_study(
        plan, worker=worker
    )  # first: it says which extra to install when Optuna is absent
    import optuna

    stop = stop or StopFlag()
    hpo = plan.hpo
    deadline = time.monotonic() + hpo.timeout_s if hpo.timeout_s else None
    outcomes: list[TrialOutcome] = []
    asked = False
    while not stop.event.is_set() and (deadline is None or time.monotonic() < deadline):
        for number in fail_stale_trials(study, storage, hpo.grace_s, hpo.max_retries):
            say(
                f"trial {number}: its worker stopped sending heartbeats; failed (retried if retries are left)"
            )
        if _budget_spent(study, hpo.n_trials):
            _say_still_running(study, hpo.grace_s, say)
            break
        trial = _ask(study, storage, hpo, worker, first=not asked)
        asked = True
        if _is_surplus(study, storage, trial, hpo.n_trials):
            _told(study, trial, state=optuna.trial.TrialState.FAIL)
            continue
        outcomes.append(run_trial(plan, study, storage, trial, nproc, say, stop))
    return outcomes


def _ask(
    study: optuna.Study, storage: optuna.storages.BaseStorage, hpo: HpoConfig, worker: int, first: bool
) -> optuna.trial.Trial:
    """The next trial, marked alive at once; a worker's first also seeds its sampler."""
    trial = study.ask()
    with contextlib.suppress(Exception):  # the store briefly unreachable: the heartbeat retries
        claim(storage, trial._trial_id)
    if first:
        seed_from_first_trial(study, storage, hpo, worker, trial)
    return trial


def stopped_exit_code(plan: StudyPlan, stop: StopFlag) -> int:
    """0, unless a signal stopped the worker before the study's budget was spent: then 130 after
    Ctrl-C and fault.preempt_exit_code (75) after SIGTERM/SIGUSR1, as a preempted training run
    ends. A worker stopped with its trial preempted and the study unfinished exited 0, and a
    scheduler or a script took the study for done."""
    if stop.signum is None:
        return 0
    study, _ = open_study(plan)
    if _budget_spent(study, plan.hpo.n_trials):
        return 0
    return 130 if stop.signum == signal.SIGINT else plan.base.fault.preempt_exit_code


def _say_still_running(study: optuna.Study, grace_s: float, say: Callable[[str], None]) -> None:
    """Trials other workers still run count toward the budget; one whose worker died elsewhere
    is retried only by a worker that sweeps after hpo.grace_s."""
    import optuna

    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    if running:
        numbers = ", ".join(str(t.number) for t in running)
        say(
            f"trials {numbers} still run in other workers; if one's worker died, `hpcpipe hpo run` "
            f"again after hpo.grace_s ({grace_s:g} s) retries it"
        )


def _originals(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    return [t for t in trials if retried_from(t) is None and not t.user_attrs.get(SURPLUS_ATTR)]


def _budget_spent(study: optuna.Study, n_trials: int) -> bool:
    import optuna

    trials = study.get_trials(deepcopy=False)
    waiting = any(t.state == optuna.trial.TrialState.WAITING for t in trials)
    if waiting:
        return False
    grid = study.sampler  # a grid has run its points: asking again would repeat one
    exhausted = isinstance(grid, optuna.samplers.GridSampler) and grid.is_exhausted(study)
    return exhausted or len(_originals(trials)) >= n_trials


def _told(study: optuna.Study, trial: optuna.trial.Trial, *args: Any, **kwargs: Any) -> Any:
    """``study.tell``: the frozen trial. After a grid's last point, Optuna's GridSampler calls
    ``study.stop()``, which raises outside ``study.optimize`` once the trial is stored: that trial
    is told, and the worker's loop ends at its budget check (``_budget_spent``)."""
    try:
        return study.tell(trial, *args, **kwargs)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise
        return study.get_trials(deepcopy=False)[trial.number]


def _is_surplus(
    study: optuna.Study, storage: optuna.storages.BaseStorage, trial: optuna.trial.Trial, n_trials: int
) -> bool:
    """An original asked after ``n_trials`` originals with lower numbers (workers raced the check)."""
    frozen = storage.get_trial(trial._trial_id)
    if retried_from(frozen) is not None:
        return False
    earlier = [t for t in _originals(study.get_trials(deepcopy=False)) if t.number < trial.number]
    if len(earlier) < n_trials:
        return False
    trial.set_user_attr(SURPLUS_ATTR, True)
    return True


def run_trial(
    plan: StudyPlan,
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    trial: optuna.trial.Trial,
    nproc: int,
    say: Callable[[str], None],
    stop: StopFlag,
) -> TrialOutcome:
    """Train one trial in a child process while marking it alive; tell the study the result."""
    import optuna

    retry_of = trial.user_attrs.get(RUN_DIR_ATTR)  # a retry resumes its original's folder
    run_dir = Path(retry_of or plan.layout.trial_dir(trial.number))
    started = time.monotonic()
    try:
        prepared = _prepare(plan, study, storage, trial, run_dir, retry_of is None, say, stop)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another worker's sweep failed it since the ask (and enqueued its retry): a finished
        # trial takes no values, and the worker died with a traceback at the next suggest.
        say(f"trial {trial.number}: {STUDY_FAILED_IT}")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, 0.0, STUDY_FAILED_IT)
    if isinstance(prepared, TrialOutcome):
        return prepared
    run_dir.mkdir(parents=True, exist_ok=True)
    RunLayout(run_dir).config.write_text(prepared.to_yaml())
    stop.lapsed = False  # a lapse of an earlier trial's heartbeat (after its end) is not this one's
    since = committed_step(prepared, run_dir)
    hpo, window = plan.hpo, stop_window_s(prepared.fault)
    with Heartbeat(storage, trial._trial_id, hpo.heartbeat_s, hpo.grace_s, stop.lapse, window):
        # Stopped meanwhile: never started (a SIGTERM at its start would cut it before a save).
        code = None if stop.stopping() else _train(run_dir, nproc, _trial_env(plan, trial), stop)
    if code is None:
        return _not_started(plan, study, storage, trial, run_dir, say, lapsed=stop.lapsed)
    seconds = time.monotonic() - started
    return _tell(plan, study, storage, trial, code, run_dir, seconds, say, stop.lapsed, prepared, since)


def _prepare(
    plan: StudyPlan,
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    trial: optuna.trial.Trial,
    run_dir: Path,
    new: bool,
    say: Callable[[str], None],
    stop: StopFlag,
) -> JobConfig | TrialOutcome:
    """The trial's values and config, or how it ended without training."""
    import optuna

    if new:  # its folder, and its own checkpoint directories outside it, are new
        own = own_checkpoint_dirs(plan.base.checkpoint, run_dir.name, run_dir.parent).values()
        for directory in (d for d in (run_dir, *map(Path, own)) if d.exists()):
            aside = _set_aside(directory)
            say(f"trial {trial.number}: {directory} holds an earlier study's trial; moved to {aside}")
    try:
        values = suggest(trial, plan.hpo.space)
    except ValueError as exc:  # a retry's fixed values, against a space changed since (Optuna's check)
        note = f"its values do not fit the changed hpo.space ({str(exc).splitlines()[0]})"
        trial_note(storage, trial, note)
        _told(study, trial, state=optuna.trial.TrialState.FAIL)
        say(f"trial {trial.number}: failed, not retried: {note}")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, 0.0, note)
    trial.set_user_attr(RUN_DIR_ATTR, str(run_dir))
    shown = ", ".join(f"{k}={_short(v)}" for k, v in values.items())
    try:
        job = trial_config(plan.base, values, run_dir.name, str(run_dir.parent))
    except UserError as exc:
        trial_note(storage, trial, str(exc))
        _told(study, trial, state=optuna.trial.TrialState.FAIL)
        say(f"trial {trial.number}: {shown}: bad config, failed ({exc})")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, 0.0, str(exc))
    if stop.event.is_set():  # stopped since the ask (Slurm's signal before the time limit)
        return _not_started(plan, study, storage, trial, run_dir, say, lapsed=False)
    say(f"trial {trial.number}: {shown} -> {run_dir}")
    return job


def _not_started(
    plan: StudyPlan,
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    trial: optuna.trial.Trial,
    run_dir: Path,
    say: Callable[[str], None],
    lapsed: bool,
) -> TrialOutcome:
    """Failed before its process started: the worker was stopped (its retry uses none of
    hpo.max_retries, as a preemption) or the trial's heartbeat lapsed (one, as a crash)."""
    if lapsed:
        note = "its heartbeat did not reach the study before it started"
    else:
        note = "the worker was stopped before the trial started"
    trial_note(storage, trial, note)
    frozen = _failed(study, storage, trial)
    if frozen is None:  # by a sweep, which enqueued the retry
        say(f"trial {trial.number}: {STUDY_FAILED_IT}")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, 0.0, STUDY_FAILED_IT)
    retried = retry(study, frozen, plan.hpo.max_retries, preempted=not lapsed)
    say(f"trial {trial.number}: {note}{'; retry enqueued' if retried else ''}")
    return TrialOutcome(trial.number, "FAIL", None, run_dir, 0.0, note)


def committed_step(job: JobConfig, run_dir: Path) -> int:
    """The step of the trial's newest committed checkpoint, in either tier (0: none, or a tier
    that cannot be listed: a file where it goes, a stale NFS mount; the trial's own run says why).
    Relative checkpoint directories are the worker's: its trials run in its working directory."""
    from hpcpipe.checkpoint.resume_choice import newest_committed, resume_tiers
    from hpcpipe.checkpoint.tiers import fast_root

    try:
        newest = newest_committed(resume_tiers(job.checkpoint, fast_root(job.checkpoint.dir, run_dir)))
    except OSError:  # it ran outside any guard: the worker died with the trial left RUNNING
        return 0
    return newest[0] if newest else 0


def _set_aside(run_dir: Path) -> Path:
    """Move an earlier study's folder (the store was reset or replaced) out of a new trial's way:
    the new trial would resume its checkpoint and report its result without training."""
    for n in itertools.count(1):
        aside = run_dir.with_name(f"{run_dir.name}.earlier-{n}")
        if not aside.exists():
            run_dir.rename(aside)
            return aside
    raise AssertionError("unreachable")


def _trial_env(plan: StudyPlan, trial: optuna.trial.Trial) -> dict[str, str]:
    env = dict(os.environ)
    env.update({ENV_STORAGE: plan.storage_url, ENV_STUDY: plan.name, ENV_TRIAL: str(trial._trial_id)})
    return env


def _train(run_dir: Path, nproc: int, env: dict[str, str], stop: StopFlag) -> int:
    """The trial's ``hpcpipe train``, its output appended to its train log; its exit code. It is
    forked from this worker's zygote (``launch/zygote.py``): no interpreter start per trial."""
    from hpcpipe.launch import zygote

    layout = RunLayout(run_dir)
    argv = ["train", str(layout.config), "--nproc", str(nproc)]
    with layout.train_log.open("ab") as log:
        # The worker torn down (an exception, Ctrl-C): the trial is killed, as a child it started.
        how = zygote.Launch(output=log.fileno(), started=stop.started)
        try:
            return zygote.run_hpcpipe(
                argv, Path.cwd(), env, how, preload=trial_imports(layout.config)
            ).returncode
        finally:
            stop.child = None


def trial_imports(config: Path | JobConfig) -> tuple[str, ...]:
    """What the trials' workers import (their recipe's module and worker_imports: what the zygote
    they fork from preloads); nothing where the config does not load (the trial then says why)."""
    from hpcpipe.config import load_config
    from hpcpipe.recipes.registry import recipe_class

    try:
        job = load_config(config) if isinstance(config, Path) else config
        cls = recipe_class(job.run.recipe)
    except Exception:
        return ()
    return (cls.__module__, *cls.worker_imports)


def _tell(
    plan: StudyPlan,
    study: optuna.Study,
    storage: optuna.storages.BaseStorage,
    trial: optuna.trial.Trial,
    code: int,
    run_dir: Path,
    seconds: float,
    say: Callable[[str], None],
    lapsed: bool = False,
    job: JobConfig | None = None,
    since: int = 0,
) -> TrialOutcome:
    """Tell the study how the trial's process ended. ``job``: the trial's config (None: the base's,
    with the trial's own checkpoint directories); ``since``: its newest committed checkpoint's step
    when this try started; ``lapsed``: the worker stopped it, its heartbeat lapsed."""
    import optuna

    state = optuna.trial.TrialState
    head, free = f"trial {trial.number}: ", False
    if storage.get_trial(trial._trial_id).state.is_finished():
        # Failed meanwhile by a stale sweep (the heartbeat lapsed), which enqueued its retry: a
        # second retry here would train the same values in the same folder twice.
        note = "the study had already failed it (its heartbeat lapsed); its retry, if any, resumes it"
        say(f"{head}{note}")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, seconds, note)
    if code == 0:
        value = final_metric(run_dir, plan.hpo.metric)
        if value is not None and math.isnan(value):
            # Diverged: ranked worst, as the pruner saw it (Optuna would FAIL a NaN while the
            # worker said COMPLETE, and TPE would never learn that region is bad).
            value = -math.inf if maximize(plan.base) else math.inf
        if value is not None:
            _told(study, trial, value, skip_if_finished=True)
            say(f"{head}{plan.hpo.metric}={value:.5g} ({seconds:.0f} s)")
            return TrialOutcome(trial.number, "COMPLETE", value, run_dir, seconds)
        note = f"finished without an evaluation row holding {plan.hpo.metric!r}"
    elif code == PRUNED_EXIT_CODE:
        frozen = _told(study, trial, state=state.PRUNED, skip_if_finished=True)
        say(f"{head}pruned at step {max(frozen.intermediate_values, default=0)} ({seconds:.0f} s)")
        return TrialOutcome(trial.number, "PRUNED", frozen.value, run_dir, seconds)
    elif code == (job or plan.base).fault.preempt_exit_code:
        note, free = _preempted(job or _trial_job(plan, run_dir), run_dir, since, lapsed)
    elif code == USER_ERROR_EXIT_CODE:
        note = f"the trial refused its config (exit 2; see {RunLayout(run_dir).train_log})"
    else:
        note = f"exit code {code} (see {RunLayout(run_dir).train_log})"
    trial_note(storage, trial, note)
    frozen = _failed(study, storage, trial)
    if frozen is None:
        note = "the study had already failed it (its heartbeat lapsed); its retry, if any, resumes it"
        say(f"{head}{note}")
        return TrialOutcome(trial.number, "FAIL", None, run_dir, seconds, note)
    retried = code != USER_ERROR_EXIT_CODE and retry(study, frozen, plan.hpo.max_retries, free)
    say(f"{head}failed: {note}{'; retry enqueued' if retried else ''}")
    return TrialOutcome(trial.number, "FAIL", None, run_dir, seconds, note)


def _preempted(job: JobConfig, run_dir: Path, since: int, lapsed: bool) -> tuple[str, bool]:
    """Why a trial that exited fault.preempt_exit_code failed, and whether its retry is free (uses
    none of hpo.max_retries): only when preempted with a checkpoint newer than the try started
    from. The trainer exits so without one too (stopped before it trained a step, or past
    fault.preempt_grace_s): a trial caught so every time was retried forever and the study never
    ended. A lapse (its worker stopped it: a store too slow for the heartbeat) is never free."""
    reached = committed_step(job, run_dir)
    saved = f"checkpoint committed at step {reached}" if reached > since else "no new checkpoint"
    if lapsed:
        return f"stopped: its heartbeat did not reach the study ({saved})", False
    if reached > since:
        return f"preempted ({saved})", True
    return f"preempted before a new checkpoint (still at step {since}; counts as a retry)", False


def _trial_job(plan: StudyPlan, run_dir: Path) -> JobConfig:
    """The base job as the trial in ``run_dir`` has it: its own checkpoint directories."""
    return trial_config(plan.base, {}, run_dir.name, str(run_dir.parent))


def _failed(
    study: optuna.Study, storage: optuna.storages.BaseStorage, trial: optuna.trial.Trial
) -> optuna.trial.FrozenTrial | None:
    """Tell FAIL: the frozen trial when this tell failed it, None when a stale sweep of another
    worker did first (and enqueued the retry: a second one trained the same values in the same
    folder at once). Optuna refuses a finished trial before the write, or at it in a race."""
    import optuna

    try:
        return _told(study, trial, state=optuna.trial.TrialState.FAIL)
    except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
        if not storage.get_trial(trial._trial_id).state.is_finished():
            raise
        return None


def trial_note(storage: optuna.storages.BaseStorage, trial: optuna.trial.Trial, note: str) -> None:
    """Why the trial failed (before it is told: a finished trial takes no attributes)."""
    import optuna

    # Failed meanwhile by another worker's stale sweep: that note stands.
    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
        storage.set_trial_user_attr(trial._trial_id, "hpcpipe:failure", note)


def final_metric(run_dir: Path, metric: str) -> float | None:
    """``metric`` of the last evaluation row in the run's metrics.jsonl."""
    from hpcpipe.observe.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if r.get(metric) is not None]
    return float(rows[-1][metric]) if rows else None


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
