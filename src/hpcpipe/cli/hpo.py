"""`hpcpipe hpo`: Optuna studies whose trials are ordinary hpcpipe runs (run, worker, status,
best, plots, launch slurm / katib)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from hpcpipe.cli.common import (
    ConfigArg,
    JsonOption,
    NprocOption,
    SetOption,
    console,
    err_console,
    load_job,
    load_new_run,
    print_table,
    write_json,
    write_text,
)
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    from hpcpipe.config import JobConfig
    from hpcpipe.hpo.study import StudyPlan
    from hpcpipe.hpo.worker import StopFlag

app = typer.Typer(
    help="Hyper-parameter search: an Optuna study over any config key; every trial is an "
    "ordinary run directory.\n\nStart with `hpcpipe hpo run tiny-hpo --workers 2`.",
    no_args_is_help=True,
)
launch_app = typer.Typer(help="Run a study's workers on a cluster.", no_args_is_help=True)
app.add_typer(launch_app, name="launch")

StudyArg = Annotated[
    str,
    typer.Argument(
        help="A study directory (holding study.json), or the job config / preset that started it.",
        show_default=False,
    ),
]
WorkersOption = Annotated[
    int, typer.Option("--workers", "-w", min=1, help="Trials that run at the same time.")
]
TrialsOption = Annotated[
    int | None, typer.Option("--trials", min=1, help="Overrides hpo.n_trials.", show_default=False)
]


def _say(text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _start(
    config: str, sets: list[str] | None, nproc: int | None, trials: int | None, workers: int
) -> StudyPlan:
    """Validate the job and its space, create the study once, write study.json and base.yaml."""
    plan = _checked_plan(config, sets, nproc, trials)
    _create(plan, workers)
    return plan


def _checked_plan(config: str, sets: list[str] | None, nproc: int | None, trials: int | None) -> StudyPlan:
    """The study's plan from a job whose space is checked (nothing is written)."""
    from hpcpipe.hpo.liveness import check_stop_window
    from hpcpipe.hpo.space import check_space, grid_size
    from hpcpipe.hpo.study import plan_study

    job = load_new_run(
        config, [*(sets or []), *([f"hpo.n_trials={trials}"] if trials else [])], nproc, resumes=False
    )
    check_space(job)
    check_stop_window(job)
    if job.hpo.sampler.name == "grid" and grid_size(job.hpo.space) < job.hpo.n_trials:
        size = grid_size(job.hpo.space)
        err_console.print(f"note: the grid has {size} points; hpo.n_trials {job.hpo.n_trials} -> {size}")
        job = load_job(config, [*(sets or []), f"hpo.n_trials={size}"], nproc)
    return plan_study(job)


def _create(plan: StudyPlan, workers: int) -> None:
    from hpcpipe.hpo.study import check_record, open_study, warn_if_parallel_sqlite, write_record

    warning = warn_if_parallel_sqlite(plan, workers)
    if warning:
        err_console.print(escape(warning), style="yellow")
    check_record(plan)  # before the store is created in another study's directory
    open_study(plan, create=True)
    write_record(plan)


def run(
    config: ConfigArg,
    workers: WorkersOption = 1,
    nproc: NprocOption = None,
    trials: TrialsOption = None,
    sets: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Create (or continue) the study of JOB's hpo section and run its trials on this machine.

    Each trial is an ordinary run directory STUDY_DIR/trials/trial-NNNN/ (config.yaml, metrics,
    checkpoints, train.log). The trial reports hpo.metric at every evaluation and the pruner may
    stop it (it checkpoints and is recorded as pruned). Running the command again continues the
    study: trials already done count toward hpo.n_trials. Writes the study's plots to
    STUDY_DIR/plots/ at the end. Stopped by SIGTERM before the study has its trials, it exits with
    fault.preempt_exit_code (75; 130 after Ctrl-C).

    Examples:

      hpcpipe hpo run tiny-hpo --workers 2

      hpcpipe hpo run my_job.yaml --nproc 2 --trials 30 --set hpo.storage=journal:/shared/study.log

      PGPASSWORD=... hpcpipe hpo run my_job.yaml --workers 4 --set hpo.storage=postgresql://hpo@db:5432/hpo
    """
    from hpcpipe.hpo.study import open_study
    from hpcpipe.hpo.worker import trial_imports
    from hpcpipe.launch import zygote

    if workers == 1:  # before the study opens its storage and anything computes: the trials fork from it
        zygote.prestart(trial_imports(load_job(config, sets or [], nproc)))
    plan = _start(config, sets, nproc, trials, workers)
    _say(f"study {plan.name}: {plan.hpo.n_trials} trials, {workers} worker(s), storage {plan.storage_shown}")
    _say(f"study directory: {plan.study_dir}")
    code = _run_here(plan) if workers == 1 else _run_processes(plan, workers)
    study, _ = open_study(plan)
    _finish(plan, study, json_out)
    if code:
        raise typer.Exit(code if code > 0 else 1)


def _run_here(plan: StudyPlan) -> int:
    from hpcpipe.hpo.worker import StopFlag, run_worker

    stop = StopFlag()
    stop.install()
    run_worker(plan, plan.base.parallel.nproc, _say, stop)
    return _stopped(plan, stop, _say)


def _stopped(plan: StudyPlan, stop: StopFlag, say: Callable[[str], None]) -> int:
    """The worker's exit code (0, or 75/130 when a signal left the study unfinished), said in a line."""
    from hpcpipe.hpo.worker import stopped_exit_code

    code = stopped_exit_code(plan, stop)
    if code:
        name = signal.Signals(stop.signum or signal.SIGTERM).name
        say(f"stopped by {name} before the study's {plan.hpo.n_trials} trials ran; run it again to continue")
    return code


def _run_processes(plan: StudyPlan, workers: int) -> int:
    """N `hpcpipe hpo worker` processes; SIGTERM/SIGINT here reaches each of them."""
    from hpcpipe.train.environment import sharing_cores

    argv = [sys.executable, "-m", "hpcpipe", "hpo", "worker", str(plan.study_dir)]
    env = sharing_cores(os.environ)  # the workers' trials share this node's cores
    procs = [
        subprocess.Popen([*argv, "--label", f"w{i}", "--index", str(i)], env=env) for i in range(workers)
    ]

    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, forward)
    codes = [proc.wait() for proc in procs]
    if any(codes):
        err_console.print(f"worker exit codes: {codes} (their messages are above)")
    code = max(codes, key=abs)
    if received[:1] == [signal.SIGINT] and code == plan.base.fault.preempt_exit_code:
        return 130  # Ctrl-C here: the workers were passed SIGTERM
    return code


def _finish(plan: StudyPlan, study: Any, json_out: str | None) -> None:
    from hpcpipe.hpo.plots import write_plots
    from hpcpipe.hpo.results import summary, write_trials_csv

    result = summary(plan, study)
    write_trials_csv(result["trials"], plan.study_dir)
    written, skipped = write_plots(study, plan.layout.plots)
    result["plots"] = [str(p) for p in written]
    if json_out != "-":
        _print_summary(result)
        for name, why in skipped.items():
            _say(f"plot {name} skipped: {why}")
        _say(f"plots: {plan.layout.plots}; best config: hpcpipe hpo best {plan.study_dir} --export best.yaml")
    write_json(result, json_out)


def _print_summary(result: dict[str, Any]) -> None:
    cells = []
    for row in result["trials"]:
        state = row["state"] + (f" (retry of {row['retry_of']})" if row["retry_of"] is not None else "")
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in row["params"].items())
        cells.append(
            [
                str(row["number"]),
                state,
                _fmt(row["value"]),
                _fmt(row["last_step"]),
                _fmt(row["seconds"]),
                escape(params),
            ]
        )
    headers = ("trial", "state", result["metric"], "last step", "s", "params")
    print_table(headers, cells, typed={"trial"}, title=f"study {result['study']}")
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(result["counts"].items()))
    _say(f"{counts or 'no trials'} ({result['direction']} {result['metric']}; storage {result['storage']})")
    best = result["best"]
    if best:
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in best["params"].items())
        _say(f"best: trial {best['number']}, {result['metric']}={_fmt(best['value'])}: {params}")


def worker(
    study: StudyArg,
    label: Annotated[str, typer.Option(help="A prefix for this worker's lines.")] = "",
    index: Annotated[
        int,
        typer.Option(
            min=0,
            envvar="SLURM_ARRAY_TASK_ID",
            help="This worker's number: it seeds the sampler with hpo.seed + INDEX, so workers "
            "draw different points (an array task's id by default).",
        ),
    ] = 0,
    nproc: NprocOption = None,
    sets: SetOption = None,
) -> None:
    """Run trials of an existing study until it has hpo.n_trials (one Slurm array task runs this).

    SIGTERM stops it after the running trial checkpoints; that trial is retried by a worker. A
    worker stopped so before the study has its trials exits with fault.preempt_exit_code (75;
    130 after Ctrl-C).
    """
    from hpcpipe.hpo.study import load_plan
    from hpcpipe.hpo.worker import StopFlag, run_worker, trial_imports
    from hpcpipe.launch import zygote

    plan = load_plan(study, sets)
    zygote.prestart(trial_imports(plan.base))  # before anything computes: the trials fork from it
    stop = StopFlag()
    stop.install()
    prefix = f"[{label}] " if label else ""

    def say(text: str) -> None:
        _say(prefix + text)

    run_worker(plan, nproc or plan.base.parallel.nproc, say, stop, worker=index)
    if code := _stopped(plan, stop, say):
        raise typer.Exit(code)


def status(study: StudyArg, sets: SetOption = None, json_out: JsonOption = None) -> None:
    """Print the study's trials: state, value, last reported step, parameters; and the best.

    Running trials whose worker died (no heartbeat for hpo.grace_s) are failed and retried here.
    """
    from hpcpipe.hpo.liveness import fail_stale_trials
    from hpcpipe.hpo.results import summary, write_trials_csv
    from hpcpipe.hpo.study import load_plan, open_study

    plan = load_plan(study, sets)
    opened, storage = open_study(plan)
    for number in fail_stale_trials(opened, storage, plan.hpo.grace_s, plan.hpo.max_retries):
        err_console.print(
            f"trial {number}: its worker stopped sending heartbeats; failed (retried if retries are left)"
        )
    result = summary(plan, opened)
    write_trials_csv(result["trials"], plan.study_dir)
    if json_out != "-":
        _print_summary(result)
    write_json(result, json_out)


def best(
    study: StudyArg,
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            help="Write the best trial's config here, --set overrides applied.",
            show_default=False,
        ),
    ] = None,
    sets: SetOption = None,
    json_out: JsonOption = None,
) -> None:
    """Print the best trial; --export writes a config that retrains it, e.g. at larger scale.

    --set finds the study (e.g. run.out_dir, as for `hpo run`) and is applied to the exported config.

    Examples:

      hpcpipe hpo best runs/hpo-tiny-hpo

      hpcpipe hpo best runs/hpo-tiny-hpo --export best.yaml --set train.steps=2000 --set parallel.nnodes=4

      hpcpipe train best.yaml
    """
    from hpcpipe.hpo.results import best_config, best_row, write_best
    from hpcpipe.hpo.study import load_plan, open_study

    plan = load_plan(study, sets)
    opened, _ = open_study(plan)
    row = best_row(opened)
    if row is None:
        raise UserError(
            f"study {plan.name!r} has no completed trial yet (hpcpipe hpo status {plan.study_dir})"
        )
    if export is not None:
        job = best_config(plan, opened, list(sets or []))
        note = f"the best trial ({row['number']}, {plan.hpo.metric}={row['value']:.6g}) of study {plan.name}"
        write_best(job, export, note)
        row["exported"] = str(export)
    if json_out != "-":
        params = ", ".join(f"{k}={_fmt(v)}" for k, v in row["params"].items())
        _say(
            f"best: trial {row['number']}, {plan.hpo.metric}={_fmt(row['value'])}: {params} "
            f"({row['run_dir']})"
        )
        if export is not None:
            _say(f"wrote {export}: hpcpipe train {export}")
    write_json(row, json_out)


def plots(study: StudyArg, sets: SetOption = None) -> None:
    """Write the study's plots (optimisation history, parameter importances, parallel
    coordinates, intermediate values) as PNG files in STUDY_DIR/plots/.

    For a live view: `pip install optuna-dashboard` and `optuna-dashboard <storage URL>`.
    """
    from hpcpipe.hpo.plots import write_plots
    from hpcpipe.hpo.study import load_plan, open_study

    plan = load_plan(study, sets)
    opened, _ = open_study(plan)
    written, skipped = write_plots(opened, plan.layout.plots)
    for path in written:
        _say(f"wrote {path}")
    for name, why in skipped.items():
        _say(f"plot {name} skipped: {why}")


DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print what would be submitted; submit nothing.")
]


@launch_app.command("slurm")
def launch_slurm(
    config: ConfigArg,
    workers: WorkersOption = 2,
    nproc: NprocOption = None,
    trials: TrialsOption = None,
    sets: SetOption = None,
    dry_run: DryRunOption = False,
) -> None:
    """Submit a Slurm job array of WORKERS study workers (one node each) on a shared store.

    The study is created here first (hpo.storage must be PostgreSQL or journal:PATH on a shared
    file system; SQLite is refused). Each array task runs `hpcpipe hpo worker STUDY_DIR`, training
    its trials on the node's GPUs (launch.slurm.gpus_per_node). The launch.slurm keys
    (partition, time, account, setup, container, env) apply as for `hpcpipe launch slurm`.

    Examples:

      hpcpipe hpo launch slurm my_job.yaml --workers 8 --set hpo.storage=journal:/lustre/me/study.log

      hpcpipe hpo launch slurm my_job.yaml -w 16 -s hpo.storage=postgresql://hpo@db/hpo --dry-run
    """
    from hpcpipe.hpo.slurm import check_shared_storage, render_array, write_array
    from hpcpipe.launch.slurm import check_partition, submit

    plan = _checked_plan(config, sets, nproc, trials)  # a dry run refuses what a launch would
    check_shared_storage(plan)
    if dry_run:
        sys.stdout.write(render_array(plan, workers))
        return
    check_partition(plan.base.launch.slurm.partition)
    _create(plan, workers=1)  # after every check: a refused launch writes nothing
    script = write_array(plan, workers)
    job_id = submit(script)
    _say(f"submitted array job {job_id} ({workers} workers) for study {plan.name}; script {script}")
    _say(f"follow it: hpcpipe hpo status {plan.study_dir}")


@launch_app.command("katib")
def launch_katib(
    config: ConfigArg,
    workers: WorkersOption = 2,
    trials: TrialsOption = None,
    sets: SetOption = None,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace (default: launch.k8s.namespace).", show_default=False)
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Write the YAML here instead of standard output.", show_default=False
        ),
    ] = None,
    submit: Annotated[
        bool,
        typer.Option("--submit", help="Create the ConfigMap and the Experiment (in-cluster or $KUBECONFIG)."),
    ] = False,
    wait: Annotated[
        bool, typer.Option("--wait", help="With --submit: wait until the Experiment ends.")
    ] = False,
    best: Annotated[
        Path | None,
        typer.Option(
            "--best",
            help='With --wait: write the best trial\'s values here as JSON {"key": value} '
            "(hpcpipe run --params reads it).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Render the study as a Katib Experiment (Kubeflow) with its base-config ConfigMap.

    The same search space, objective, algorithm and median-stop early stopping; WORKERS is the
    Experiment's parallelTrialCount. Each trial is a PyTorchJob running `hpcpipe train` with the
    values as --set; Katib reads hpo.metric from the trainer's evaluation lines (StdOut
    collector). Checked against the rules Katib's admission webhook enforces; apply it with
    `kubectl apply -f`. What Katib cannot express (conditional parameters) is refused; what it
    ignores (another pruner, a timeout) is said on standard error.

    Example:

      hpcpipe hpo launch katib my_job.yaml -w 4 -s launch.k8s.image=registry/hpcpipe:1 -o exp.yaml
    """
    from hpcpipe.hpo.katib import experiment_warnings, render_experiment
    from hpcpipe.kfp.spec import check_compiled
    from hpcpipe.launch.kubernetes import to_yaml

    if (wait and not submit) or (best is not None and not wait):
        raise UserError("--wait needs --submit, and --best needs --wait")
    job = load_job(config, [*(sets or []), *([f"hpo.n_trials={trials}"] if trials else [])])
    check_compiled(job)  # as a pipeline's Katib step: its pod has the compiled image and claims
    docs = render_experiment(job, parallel_trials=workers, namespace=namespace)
    for line in experiment_warnings(job):
        err_console.print(f"note: {escape(line)}")
    text = to_yaml(docs)
    if out is not None:
        write_text(out, text)
        _say(f"wrote {out}" + ("" if submit else f": kubectl apply -f {out}"))
    if submit:
        _submit_experiment(job, docs, wait, best)
    elif out is None:
        sys.stdout.write(text)


def _submit_experiment(job: JobConfig, docs: list[dict[str, Any]], wait: bool, best: Path | None) -> None:
    """Create the Experiment; with ``wait``, follow it to its end and write the best values."""
    import json

    from hpcpipe.hpo.katib import best_parameters
    from hpcpipe.launch import k8s_cluster
    from hpcpipe.launch.k8s_train import POLL_VAR

    k8s_cluster.require_client()
    connection = k8s_cluster.connect()
    poll = float(os.environ.get(POLL_VAR, "10"))
    # A retried step follows the Experiment it created (same config), rather than a second one.
    ref, running = k8s_cluster.reuse_or_clear(connection, docs, poll)
    if running:
        _say(f"following Experiment {ref.namespace}/{ref.name}, created before")
    else:
        ref = k8s_cluster.create(connection, docs)
        _say(f"created Experiment {ref.namespace}/{ref.name}")
    if not wait:
        return
    try:
        experiment = k8s_cluster.wait(connection, ref, poll_s=poll, say=_say)
    except k8s_cluster.JobFailed as exc:
        raise UserError(str(exc)) from None
    values = best_parameters(job, experiment)
    _say(f"best trial: {', '.join(f'{k}={v}' for k, v in values.items())}")
    if best is not None:
        write_text(best, json.dumps(values, indent=1) + "\n")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


app.command("run")(run)
app.command("worker")(worker)
app.command("status")(status)
app.command("best")(best)
app.command("plots")(plots)
