"""`hpcpipe report DIR...`: a self-contained report of runs, sweeps and scaling studies."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hpcpipe.cli.common import JsonOption, console, write_json


def report(
    directories: Annotated[
        list[Path],
        typer.Argument(
            help="Run directories (holding config.yaml) and/or sweep or scaling-study directories "
            "(holding sweep.csv / scaling.csv somewhere under them).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where to write (default: DIR/report for one directory, ./report for several).",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOption = None,
) -> None:
    """Write a self-contained report of one run, a comparison of several, or a study.

    Writes report.md, report.html (one file: plots inlined, no scripts, nothing
    fetched), the PNGs, and series.csv (columns run,step,series,value): every
    plot is drawn from those rows, so it can be redrawn from the CSV alone.

    One run: recipe, world size, hosts, git SHA, config and dataset hashes; key
    figures; loss with validation loss and events marked; throughput, MFU,
    memory and step-time phases; events and evaluation tables.

    Several runs: one row per run, the config keys that differ, and loss,
    validation-loss and throughput curves overlaid.

    A sweep or scaling-study directory (sweep.csv / scaling.csv under it) also
    gets study.md and its plots, and the run directories in it are compared.

    Output goes to DIR/report/ for one directory, ./report/ for several
    (--out to change). Only run files are read: the same inputs give the same
    report.md.

    Examples:

      hpcpipe report runs/quickstart

      hpcpipe report runs/bf16 runs/fp32 --out reports/precision

      hpcpipe report runs/sweep-resnet18-cifar10
    """
    from hpcpipe.report.run_report import build_report

    made = build_report(directories, out)
    if json_out != "-":
        _print_summary(made)
    write_json(made, json_out)


def _print_summary(made: dict[str, Any]) -> None:
    """The Markdown of a single run (or of a lone study), then where every file went."""
    runs, studies = made["runs"], made["studies"]
    if len(runs) == 1 and not studies:
        _say(Path(made["markdown"]).read_text())
    elif not runs and len(studies) == 1 and "markdown" in studies[0]:
        _say(Path(studies[0]["markdown"]).read_text())
    for study in studies:
        if "markdown" in study:  # a sweep or scaling study (an hpo study's section is in the report)
            _say(f"wrote {study['markdown']} and {len(study['plots'])} plots")
    for key in ("markdown", "html", "series_csv"):
        _say(f"wrote {made[key]}")
    if made["plots"]:
        _say(f"wrote {len(made['plots'])} plots in {Path(made['plots'][0]).parent}")


def _say(text: str) -> None:
    # soft_wrap: a long path stays on one line, so it can be copied.
    console.print(text, soft_wrap=True, markup=False, highlight=False)
