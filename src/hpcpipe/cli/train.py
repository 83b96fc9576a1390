"""`hpcpipe train` (train a job) and `hpcpipe run` (the whole job: data, training, report)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from hpcpipe.cli.common import (
    ConfigArg,
    MaxRestartsOption,
    NprocOption,
    SetOption,
    console,
    err_console,
    load_job,
)
from hpcpipe.config import JobConfig


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
    job = load_job(config, sets, nproc)
    run_dir, _ = _train(job, max_restarts)
    console.print(f"[green]done[/green]: {run_dir}")


def run(
    config: ConfigArg,
    sets: SetOption = None,
    nproc: NprocOption = None,
    max_restarts: MaxRestartsOption = 0,
) -> None:
    """Run the whole job: prepare data, train, evaluate, write a loss curve and summary.md.

    `hpcpipe run quickstart` trains a small GPT with DDP over 2 CPU processes on the Python
    standard library's source in a few minutes, and leaves runs/quickstart/ with metrics, a
    loss-curve PNG, a generated text sample and summary.md.
    """
    from hpcpipe.report.loss_curve import plot_loss_curve
    from hpcpipe.report.summary import write_summary

    job = load_job(config, sets, nproc)
    run_dir, wall = _train(job, max_restarts)
    if not _is_main_process():
        return
    plot_loss_curve(run_dir)
    summary = write_summary(run_dir, wall_time_s=wall)
    console.print(summary.read_text(), markup=False, highlight=False)
    made = [name for name in ("summary.md", "loss_curve.png", "sample.txt") if (run_dir / name).is_file()]
    console.print(f"[green]done[/green]: {run_dir} ({', '.join(made)})")


def _train(job: JobConfig, max_restarts: int) -> tuple[Path, float]:
    from hpcpipe.launch.job import WorkerFailure, run_job
    from hpcpipe.train.preempt import Preempted

    start = time.perf_counter()
    try:
        run_dir = run_job(job, max_restarts=max_restarts)
    except WorkerFailure as exc:
        if exc.exit_code == job.fault.preempt_exit_code:
            err_console.print(f"preempted: checkpoint committed; run again to resume ({job.run_dir})")
        else:
            err_console.print(f"error: {exc}; run dir: {job.run_dir}")
        raise typer.Exit(exc.exit_code) from None
    except Preempted as exc:
        err_console.print(f"{exc}; run again to resume ({job.run_dir})")
        raise typer.Exit(exc.exit_code) from None
    return run_dir, time.perf_counter() - start


def _is_main_process() -> bool:
    from hpcpipe.train.environment import detect_environment

    return detect_environment().rank == 0
