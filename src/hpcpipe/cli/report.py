"""`hpcpipe report study`: plots and tables of a scaling study, regenerated from its CSVs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpcpipe.cli.common import JsonOption, console, write_json

app = typer.Typer(
    help="Reports regenerated from the files runs and benchmarks leave behind.", no_args_is_help=True
)


@app.command("study")
def study(
    directory: Annotated[
        Path,
        typer.Argument(help="Directory holding scaling.csv and/or sweep.csv files (searched recursively)."),
    ],
    out: Annotated[Path | None, typer.Option(help="Where to write (default: DIRECTORY/report).")] = None,
    json_out: JsonOption = None,
) -> None:
    """Throughput and efficiency vs devices, weak-scaling time/epoch, sweep plots, bottleneck
    verdicts and a before/after table per optimization, from the CSVs alone (run directories
    may be deleted).

    Examples:

      hpcpipe bench scaling resnet18-cifar10 --nproc 1,2,4,8 --out study/
      hpcpipe sweep resnet18-cifar10 --grid 'train.precision=[fp32,bf16]' --out study/sweep
      hpcpipe report study study/
    """
    from hpcpipe.report.study import build_study

    made = build_study(directory, out)
    if json_out != "-":
        console.print((Path(made["markdown"])).read_text(), markup=False, highlight=False)
        console.print(f"wrote {made['markdown']} and {len(made['plots'])} plots")
    write_json(made, json_out)
