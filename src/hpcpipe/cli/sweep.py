"""`hpcpipe sweep`: train every point of a grid as an ordinary run directory; one CSV row per run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from hpcpipe.cli.common import (
    ConfigArg,
    GridOption,
    JsonOption,
    NprocOption,
    SetOption,
    console,
    load_new_run,
    print_table,
    write_json,
)
from hpcpipe.errors import UserError


def sweep(
    config: ConfigArg,
    grids: GridOption = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file", "-f", help="A sweep YAML with grid: {section.key: \\[values]}.", show_default=False
        ),
    ] = None,
    sets: SetOption = None,
    nproc: NprocOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Directory of the point runs and sweep.csv (default: <run.out_dir>/sweep-<run.name>)."
        ),
    ] = None,
    json_out: JsonOption = None,
) -> None:
    """Train every combination of the grid, one after another; skip points already finished.

    Each point is an ordinary run directory OUT/<name>-<point>/ (OUT: --out, or
    <run.out_dir>/sweep-<run.name>); OUT/sweep.csv has one row per
    point: run id, job id, nodes, devices, global batch, precision, bucket size, workers,
    throughput, time/epoch, final accuracy, git SHA and config hash. Re-running the same command
    skips finished points. Plot it with `hpcpipe report OUT`.

    Examples:

      hpcpipe sweep resnet-tiny -g 'parallel.bucket_cap_mb=\\[25,50,100]' -g 'train.precision=\\[fp32,bf16]'

      hpcpipe sweep resnet18-cifar10 --file sweep.yaml --set train.epochs=1 --nproc 4
    """
    from hpcpipe.launch.job import WorkerFailure, prestart_fork_server, run_job
    from hpcpipe.sweep import (
        is_done,
        load_sweep_file,
        parse_grid_option,
        plan_points,
        run_sweep,
        sweep_dir_of,
    )
    from hpcpipe.train.preempt import Preempted

    grid = load_sweep_file(file) if file else {}
    for item in grids or []:
        key, values = parse_grid_option(item)
        if key in grid:  # a second --grid of one key (or one the file has) replaced the first
            raise UserError(f"--grid {key}: given twice (once with every value)")
        grid[key] = values
    if not grid:
        raise UserError("sweep: give at least one --grid section.key=[values] or --file sweep.yaml")
    overrides = [*(sets or []), *([f"parallel.nproc={nproc}"] if nproc else [])]
    base = load_new_run(config, overrides, resumes=False)  # a secret in launch env: before any point runs
    out_dir = out or sweep_dir_of(base)
    points = plan_points(config, overrides, grid, out_dir)
    pending = [point.job for point in points if not is_done(point)]
    if pending:  # before a one-rank point trains in this process: every point's workers fork from it
        prestart_fork_server(pending[0], nproc=max(job.parallel.nproc for job in pending))
    quiet = json_out == "-"
    try:
        result = run_sweep(
            points, out_dir, run_job, report=lambda line: None if quiet else console.print(escape(line))
        )
    except (WorkerFailure, Preempted) as exc:  # preempted, interrupted or pruned: the sweep stops
        if isinstance(exc, Preempted):  # a one-rank point trained in this process
            console.print(escape(f"{exc}; run the sweep again to resume"))
        raise typer.Exit(exc.exit_code) from None
    if not quiet:
        cells = [
            [
                row["point"],
                row["status"],
                _fmt(row.get("throughput")),
                _fmt(row.get("time_per_epoch_s")),
                _fmt(row.get("final_accuracy")),
            ]
            for row in result["rows"]
        ]
        headers = ("point", "status", "throughput/s", "time/epoch (s)", "accuracy")
        print_table(headers, cells, typed={"point"}, title=f"sweep ({len(points)} points)")
        console.print(f"wrote {result['csv']}")
    write_json(result, json_out)
    if result["failed"]:
        raise typer.Exit(1)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
