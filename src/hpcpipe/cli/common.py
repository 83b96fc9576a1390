"""Options and helpers shared by CLI verbs. Heavy imports (torch) stay inside the verbs."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from hpcpipe.config import JobConfig, load_config
from hpcpipe.errors import UserError

# soft_wrap: a line (a path, a command to copy) is never broken at the console width by rich;
# tables lay themselves out (see `table`).
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)  # one message, one line: never wrapped at 80 columns

ConfigArg = Annotated[
    str,
    typer.Argument(
        help="A shipped preset name (see `hpcpipe presets list`) or a path to a job YAML.",
        show_default=False,
    ),
]
SetOption = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        help="Override one config key, e.g. --set train.steps=40 --set model.variant=llama "
        "(repeatable; the value is parsed to the key's type).",
        show_default=False,
    ),
]
GridOption = Annotated[
    list[str] | None,
    typer.Option(
        "--grid",
        "-g",
        help="One sweep axis: section.key=\\[v1,v2,...] (repeatable; the points are every combination).",
        show_default=False,
    ),
]
NprocOption = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        "-n",
        min=1,
        help="Local worker processes (overrides parallel.nproc). Ignored when already started "
        "by torchrun or srun.",
        show_default=False,
    ),
]
MaxRestartsOption = Annotated[
    int,
    typer.Option(
        "--max-restarts",
        min=0,
        help="Restart the worker group up to K times when a worker dies; each restart resumes "
        "from the newest verified checkpoint (set checkpoint.every_steps).",
    ),
]
JsonOption = Annotated[
    str | None,
    typer.Option(
        "--json",
        help="Write the machine-readable result to this path ('-' for standard output).",
        show_default=False,
    ),
]


def load_job(config: str, sets: list[str] | None, nproc: int | None = None) -> JobConfig:
    """The JobConfig named on the command line, with --set and --nproc applied."""
    overrides = list(sets or [])
    if nproc is not None:
        overrides.append(f"parallel.nproc={nproc}")
    return load_config(config, overrides)


def write_json(result: Any, target: str | None) -> None:
    """Write a JSON result to a path, or to standard output for '-'."""
    if target is None:
        return
    text = json.dumps(result, indent=2, sort_keys=True, default=str)
    if target == "-":
        sys.stdout.write(text + "\n")
        return
    write_text(Path(target), text + "\n")


def write_text(path: Path, text: str) -> None:
    """Write an output file a user named; one line (exit 2) when it cannot be written (a
    directory there, no permission, a full disk)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise UserError(f"{path}: cannot write it ({exc.strerror or exc})") from None


def scheduler_overrides(
    nodes: str | None, gpus: int | None, gpus_key: str, more: dict[str, str | None] | None = None
) -> list[str]:
    """``--set`` items for a launcher's --nodes / --gpus-per-node (and more), checked first."""
    if nodes is not None and not all(part.isdigit() and int(part) >= 1 for part in nodes.split(":", 1)):
        raise UserError(f"--nodes {nodes}: give a node count >= 1, or MIN:MAX")
    if gpus is not None and gpus < 0:
        raise UserError(f"--gpus-per-node {gpus}: must be 0 or more")
    pairs = {"parallel.nnodes": nodes, gpus_key: gpus, **(more or {})}
    return [f"{key}={value}" for key, value in pairs.items() if value is not None]


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    typed: Collection[str] = (),
    title: str | None = None,
) -> None:
    """Print rows the way the reader can use them; ``typed`` columns hold what a user types back
    (names, job ids, paths) and are never cut or wrapped.

    - Piped or redirected: tab-separated lines, a header first (``| grep``, ``| cut -f``).
    - A terminal wide enough for the typed columns whole: a table whose other cells fold (wrap).
    - A narrower terminal: one block of ``header: value`` lines per row.

    Cells may hold rich markup (``[green]yes[/]``); it is dropped off a terminal.
    """
    if not console.is_terminal:
        for row in (headers, *rows):
            typer.echo("\t".join(Text.from_markup(str(cell)).plain for cell in row))
        return
    widest = {
        h: max([len(h), *(len(Text.from_markup(str(r[i])).plain) for r in rows)])
        for i, h in enumerate(headers)
    }
    needed = sum(widest[h] if h in typed else min(len(h), 6) for h in headers) + 3 * len(headers) + 1
    if needed > console.width:
        for row in rows:
            for header, cell in zip(headers, row, strict=True):
                console.print(f"[bold]{escape(header)}[/]: {cell}", soft_wrap=True)
            console.print()
        return
    columns = [
        Column(h, no_wrap=True, min_width=widest[h]) if h in typed else Column(h, overflow="fold")
        for h in headers
    ]
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console.print(table)
