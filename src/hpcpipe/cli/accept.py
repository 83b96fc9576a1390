"""`hpcpipe accept`: the cluster acceptance suite, PASS/FAIL against a thresholds file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from hpcpipe.cli.common import JsonOption, console, err_console, print_whole, writable_output, write_json
from hpcpipe.errors import UserError

if TYPE_CHECKING:
    from hpcpipe.accept.evaluate import Row


def accept(
    thresholds: Annotated[
        str,
        typer.Option(
            "--thresholds",
            "-t",
            help="A shipped thresholds name (cpu, h100-8x-ib) or a path to a thresholds YAML.",
        ),
    ] = "cpu",
    out: Annotated[
        Path, typer.Option(help="Directory for acceptance.json, acceptance.md, plots and benchmark runs.")
    ] = Path("runs/acceptance"),
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc",
            "-n",
            min=1,
            help="Local ranks for the group benchmarks and the throughput run (default: the thresholds "
            "file's nproc). Ignored under torchrun or srun.",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = None,
) -> None:
    """Run the acceptance suite and print a PASS/FAIL table; exit 0 only when every row passes.

    The thresholds file decides the rows: connectivity (every rank reachable, hosts listed),
    collective bus bandwidth at given sizes, compute ceilings on every device, training
    throughput per device (and MFU), and scaling efficiency. A failing row names the rank or host
    and the measured vs required figure. Writes OUT/acceptance.json and OUT/acceptance.md.

    Examples:

      hpcpipe accept                                  (CPU development thresholds, 2 gloo ranks)

      hpcpipe accept --thresholds h100-8x-ib --out runs/accept-node17      (one 8-GPU node)

      srun -N 2 --ntasks-per-node 8 hpcpipe accept -t my_cluster.yaml      (across nodes)
    """
    from hpcpipe.accept.evaluate import evaluate
    from hpcpipe.accept.report import build_report, write_report
    from hpcpipe.accept.suite import measure
    from hpcpipe.accept.thresholds import load_thresholds, thresholds_path
    from hpcpipe.bench.group import exit_process
    from hpcpipe.bench.runner import world_size_for

    th = load_thresholds(thresholds)
    writable_report(out)
    world = world_size_for(nproc or th.nproc)
    measurements = measure(th, nproc, out, log=_log)
    if measurements is None:  # a rank other than 0 under torchrun/srun: rank 0 reports
        exit_process(0)
        return
    rows = evaluate(th, measurements, world)
    report = build_report(th, str(thresholds_path(thresholds)), rows, measurements, world)
    json_path, md_path = write_report(report, out)
    if json_out != "-":
        print_whole(verdict_table(th.name, rows), wraps={"required", "where"})
        verdict = "[green]PASS[/green]" if report["passed"] else "[bold red]FAIL[/bold red]"
        console.print(
            f"{verdict}: {report['counts']['passed']}/{report['counts']['rows']} rows; {json_path}, {md_path}"
        )
    write_json(report, json_out)
    code = 0 if report["passed"] else 1
    exit_process(code)  # a torchrun/srun rank leaves here (see bench.group)
    raise typer.Exit(code)


def writable_report(out: Path) -> None:
    """Refuse, before minutes of measuring, an --out where the report cannot be written (a file
    there, a read-only folder): found when writing it, after the suite, the results were lost.
    Every rank checks, so that none is left waiting for a rank that stopped."""
    for name in ("acceptance.json", "acceptance.md"):
        try:
            writable_output(out / name)
        except UserError as exc:
            raise UserError(f"--out: {exc}") from None


def verdict_table(name: str, rows: list[Row]) -> Table:
    """One line per acceptance row: PASS/FAIL, the check, measured vs required, where."""
    from hpcpipe.accept.evaluate import fmt

    table = Table("result", "check", "measured", "required", "where", title=f"acceptance: {name}")
    for row in rows:
        verdict = "[green]PASS[/green]" if row.passed else "[bold red]FAIL[/bold red]"
        required = f"{row.comparison} {fmt(row.required)} {row.unit}".rstrip()
        table.add_row(verdict, escape(row.check), fmt(row.measured), required, escape(row.where))
    return table


def _log(line: str) -> None:
    """Progress on standard error, from rank 0 only (every rank runs the suite under srun)."""
    from hpcpipe.bench.runner import is_main_process

    if is_main_process():
        err_console.print(f"[dim]{escape(line)}[/dim]")
