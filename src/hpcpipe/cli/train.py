"""`hpcpipe train` (train a job) and `hpcpipe run` (the whole job as a pipeline of steps)."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from hpcpipe.cli.common import (
    ConfigArg,
    MaxRestartsOption,
    NprocOption,
    SetOption,
    console,
    err_console,
    load_new_run,
)
from hpcpipe.config import JobConfig
from hpcpipe.errors import UserError

if TYPE_CHECKING:  # the CLI imports torch only inside the verbs
    from hpcpipe.launch.job import WorkerFailure
    from hpcpipe.train.preempt import Preempted


def train(
    config: ConfigArg,
    sets: SetOption = None,
    nproc: NprocOption = None,
    max_restarts: MaxRestartsOption = 0,
) -> None:
    """Train a job: prepare its data if needed, then train on NPROC local workers.

    Examples:

      hpcpipe train quickstart --nproc 2 --set train.steps=40

      hpcpipe train my_job.yaml --set parallel.strategy=fsdp --set train.precision=bf16

      hpcpipe train quickstart --nproc 2 --max-restarts 3 --set checkpoint.every_steps=50

      torchrun --nproc-per-node 8 -m hpcpipe train gpt-124m   (or: srun hpcpipe train gpt-124m)

    Writes runs/<run.name>/: config.yaml, lineage.json, metrics.jsonl, metrics.csv, events.jsonl,
    sample.txt, checkpoints/. Running it again resumes from the newest verified checkpoint.
    A preempted run (SIGTERM/SIGUSR1) checkpoints and exits with fault.preempt_exit_code (75).
    """
    from hpcpipe.launch.job import prestart_fork_server

    job = load_new_run(config, sets, nproc)
    with _preempted_early(job):
        prestart_fork_server(job, max_restarts)  # before the data preparation computes anything
        run_dir, _ = _train(job, max_restarts)
    console.print(f"[green]done[/green]: {run_dir}")


StepOption = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Run from this step on, even where nothing changed (prepare, stage, train, evaluate, "
        "export, register, report).",
        show_default=False,
    ),
]
OnlyOption = Annotated[
    str | None,
    typer.Option("--only", help="Run this one step (the steps before it must have run).", show_default=False),
]
OnOption = Annotated[
    str,
    typer.Option(
        "--on",
        help="local: train on local workers. k8s: the train step creates the job `launch k8s` renders "
        "(in-cluster or $KUBECONFIG) and waits for it; each pod stages its own node's data.",
    ),
]
ApiOption = Annotated[str, typer.Option("--api", help="With --on k8s: trainjob or pytorchjob.")]
RecordOption = Annotated[
    Path | None,
    typer.Option(
        "--record", help="With --only: write the step's lineage record here (JSON).", show_default=False
    ),
]
UpstreamOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--upstream",
        help="An upstream step's record (--record): its outputs must be the run directory's (repeatable).",
        show_default=False,
    ),
]
ParamsOption = Annotated[
    Path | None,
    typer.Option(
        "--params",
        help='JSON {"dotted.key": value} applied as --set (Katib\'s best trial).',
        show_default=False,
    ),
]


def run(
    config: ConfigArg,
    sets: SetOption = None,
    nproc: NprocOption = None,
    max_restarts: MaxRestartsOption = 0,
    start: StepOption = None,
    only: OnlyOption = None,
    on: OnOption = "local",
    api: ApiOption = "trainjob",
    record: RecordOption = None,
    upstream: UpstreamOption = None,
    params: ParamsOption = None,
) -> None:
    """Run the whole job as a pipeline: prepare → stage → train → evaluate → export → register →
    report. Each step records its inputs and outputs (hashes) in RUN_DIR/lineage.json; a step
    whose inputs are unchanged is skipped and says so, and a failed step runs again while the
    steps before it are skipped. `hpcpipe lineage RUN_DIR` prints the graph.

    `hpcpipe run quickstart` trains a small GPT with DDP over 2 CPU processes on the Python
    standard library's source in a few minutes, and leaves runs/quickstart/ with metrics, a
    loss-curve PNG, a generated text sample, summary.md, eval.json, an HF export and
    report/report.html.

    Examples:

      hpcpipe run quickstart                 (again: every step is skipped)

      hpcpipe run quickstart --set pipeline.export_format=safetensors   (export and later re-run)

      hpcpipe run quickstart --only report

    One step per pod (what `hpcpipe launch kfp` compiles): --only STEP --on k8s, with --record
    for the step's lineage record and --upstream for the records it builds on.
    """
    from hpcpipe.launch.job import WorkerFailure, prestart_fork_server
    from hpcpipe.pipeline import handoff
    from hpcpipe.pipeline.engine import StepContext, run_pipeline
    from hpcpipe.pipeline.steps import STEPS
    from hpcpipe.pipeline.tracing import pipeline_trace
    from hpcpipe.train.environment import detect_environment
    from hpcpipe.train.preempt import Preempted

    if on not in ("local", "k8s"):
        raise UserError(f"--on {on}: use local or k8s")
    if api not in ("trainjob", "pytorchjob"):  # before any step runs (a step that fails is recorded)
        raise UserError(f"--api {api}: use trainjob or pytorchjob")
    if record is not None and only is None:
        raise UserError("--record: give --only STEP (one step's record)")
    job = load_new_run(config, [*(sets or []), *(handoff.params_overrides(params) if params else [])], nproc)
    if on == "k8s":  # a pipeline step's pod was compiled with the job's image, claims and env
        from hpcpipe.kfp.spec import check_compiled

        check_compiled(job)
    if record is not None and record.resolve().is_relative_to(job.run_dir.resolve()):
        raise UserError(f"--record {record}: inside the run directory {job.run_dir}; write it elsewhere")
    handoff.check_upstream(job.run_dir, list(upstream or []))
    trace = pipeline_trace(job)  # TRACEPARENT for the workers: before the fork server copies os.environ
    with _preempted_early(job):
        if only in (None, "train") and on == "local":
            prestart_fork_server(job, max_restarts)  # before the prepare step computes anything
        ctx = StepContext(job, job.run_dir, max_restarts, say=lambda text: console.print(text, markup=False))
        ctx.trace = trace
        ctx.on, ctx.api = on, api
        env = detect_environment()
        if env.is_external and env.is_distributed:  # torchrun / srun started this on every rank
            ctx.group_steps, ctx.is_main = ("prepare", "train"), env.rank == 0
            if not ctx.is_main:
                ctx.say = lambda _: None
        try:
            run_pipeline(STEPS, ctx, start=start, only=only)
        except (WorkerFailure, Preempted) as exc:
            _report_failure(job, exc)
    if not ctx.is_main:
        return
    if record is not None and only is not None:
        handoff.write_record(job.run_dir, only, record)
    summary = ctx.results.get("summary")
    if summary is not None:
        console.print(summary.read_text(), markup=False, highlight=False)
    console.print(f"[green]done[/green]: {job.run_dir} (hpcpipe lineage {job.run_dir})")


def _train(job: JobConfig, max_restarts: int) -> tuple[Path, float]:
    from hpcpipe.launch.job import WorkerFailure, run_job
    from hpcpipe.train.preempt import Preempted

    start = time.perf_counter()
    try:
        run_dir = run_job(job, max_restarts=max_restarts)
    except (WorkerFailure, Preempted) as exc:
        _report_failure(job, exc)
    return run_dir, time.perf_counter() - start


@contextlib.contextmanager
def _preempted_early(job: JobConfig) -> Iterator[None]:
    """A preemption signal before the agent's handler (imports, the fork server, the data
    preparation) or the trainer's ends the launcher with fault.preempt_exit_code in one line, as
    ``launch agent`` does: dying of it (143, 138) printed nothing and read as a crash. Not in a
    worker of an external launcher (torchrun, srun), whose own agent answers for it."""
    from hpcpipe.launch.agent import AgentPreempted, stop_early_on_preemption
    from hpcpipe.train.environment import detect_environment

    if detect_environment().is_external:
        yield
        return
    previous = stop_early_on_preemption(job.fault.preempt_exit_code)
    try:
        yield
    except AgentPreempted as exc:
        # Not _report_failure, which imports torch: the signal may have cut `import torch` short,
        # and torch cannot be imported again in this process (a 112-line ImportError, exit 1).
        _say_preempted(job)
        raise typer.Exit(exc.exit_code) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report_failure(job: JobConfig, exc: WorkerFailure | Preempted) -> NoReturn:
    from hpcpipe.train.preempt import INTERRUPT_EXIT_CODE, Preempted
    from hpcpipe.train.trial import PRUNED_EXIT_CODE, Pruned

    if isinstance(exc, Pruned) or exc.exit_code == PRUNED_EXIT_CODE:
        _say(f"{exc if isinstance(exc, Pruned) else 'pruned by the study'}; checkpoint committed")
    elif isinstance(exc, Preempted):
        resume = "run again to resume" if exc.checkpointed else "set checkpoint.every_steps to resume"
        _say(f"{exc}; {resume} ({job.run_dir})")
    elif exc.exit_code == job.fault.preempt_exit_code:
        _say_preempted(job)
    elif exc.exit_code == INTERRUPT_EXIT_CODE:
        _say(f"interrupted (Ctrl-C); run again to resume from the newest checkpoint ({job.run_dir})")
    else:
        _say(f"error: {exc}; run dir: {job.run_dir}")
    raise typer.Exit(exc.exit_code) from None


def _say_preempted(job: JobConfig) -> None:
    _say(f"preempted; run again to resume from the newest committed checkpoint ({job.run_dir})")


def _say(message: str) -> None:
    """A worker's outcome as plain text: paths and messages may hold `[` (no rich markup)."""
    err_console.print(message, markup=False, highlight=False)
