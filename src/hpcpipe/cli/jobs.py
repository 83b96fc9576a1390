"""`hpcpipe jobs status|logs|cancel`: a submitted Slurm job, by its id or its run directory."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from hpcpipe.cli.common import JsonOption, console, write_json

app = typer.Typer(help="Follow and stop jobs submitted with `hpcpipe launch slurm`.", no_args_is_help=True)

JobArg = Annotated[
    str,
    typer.Argument(
        help="A Slurm job id (123, or 123_4 for an array task), or the run or sweep directory "
        "`hpcpipe launch slurm` printed.",
        show_default=False,
    ),
]


@app.command("status")
def status(job: JobArg, json_out: JsonOption = None) -> None:
    """State, exit code, run time, nodes and requeue count of the job (each array task): from
    scontrol while slurmctld remembers the job, from sacct after that."""
    from hpcpipe.launch.slurm_jobs import job_states, resolve_job

    rows = job_states(resolve_job(job).job_id)
    if json_out != "-":
        table = Table("job", "state", "exit", "elapsed", "nodes", "restarts")
        for row in rows:
            cells = [
                row.get(key, "-") for key in ("job", "state", "exit_code", "elapsed", "nodes", "restarts")
            ]
            table.add_row(*cells)
        console.print(table)
    write_json(rows, json_out)


@app.command("logs")
def logs(
    job: JobArg,
    tail: Annotated[int, typer.Option(min=0, help="Last N lines of each log (0: all).")] = 100,
) -> None:
    """Print the job's output file(s): one per job, or per array task (appended across requeues)."""
    from hpcpipe.launch.slurm_jobs import log_files, resolve_job

    files = log_files(resolve_job(job))
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        console.rule(str(path))
        console.print("\n".join(lines[-tail:] if tail else lines), markup=False, highlight=False)


@app.command("cancel")
def cancel(
    job: JobArg,
    signal: Annotated[
        str | None,
        typer.Option(help="Send this signal instead of ending the job (USR1: checkpoint, exit 75, requeue)."),
    ] = None,
) -> None:
    """Cancel the job with scancel, or send its tasks a signal (--signal USR1 preempts it)."""
    from hpcpipe.launch.slurm_jobs import cancel_job, resolve_job

    ref = resolve_job(job)
    cancel_job(ref.job_id, signal)
    what = f"sent {signal} to" if signal else "cancelled"
    console.print(f"{what} job {ref.job_id}")
