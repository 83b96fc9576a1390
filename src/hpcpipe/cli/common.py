"""Options and helpers shared by CLI verbs. Heavy imports (torch) stay inside the verbs."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
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
        "(repeatable; the value is parsed to the key's type; a mapping given for a section, "
        "--set 'train={lr: 0.01}', sets those keys and keeps the others).",
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


def writable_output(value: Any) -> Any:
    """A typer callback for an output file's option (--json, --plot): refuse, before the work
    that the file would report, a path that cannot be written (a folder there, a file where a
    folder is due, a read-only or pseudo file system). '-' (standard output) and None pass."""
    if value is None or str(value) == "-":
        return value
    path = Path(value)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; name the output file")
    if path.exists():  # a file, /dev/null, /dev/fd/63 of a shell's >(...): the file's own permission
        if not os.access(path, os.W_OK):
            raise UserError(f"{path}: cannot write it (Permission denied)")
        return value
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{ancestor}: not a directory, so {path} cannot be written")
    try:  # the only sure test (root passes os.access; /proc refuses new files)
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as exc:
        raise UserError(f"{path}: cannot write it ({exc.strerror or exc})") from None
    return value


JsonOption = Annotated[
    str | None,
    typer.Option(
        "--json",
        help="Write the machine-readable result to this path ('-' for standard output).",
        show_default=False,
        callback=writable_output,
    ),
]


def load_job(config: str, sets: list[str] | None, nproc: int | None = None) -> JobConfig:
    """The JobConfig named on the command line, with --set and --nproc applied."""
    overrides = list(sets or [])
    if nproc is not None:
        overrides.append(f"parallel.nproc={nproc}")
    return load_config(config, overrides)


def load_new_run(
    config: str, sets: list[str] | None, nproc: int | None = None, resumes: bool = True
) -> JobConfig:
    """``load_job`` for a command that starts a run or a submission (train, run, sweep, hpo):
    a secret-looking launch env name is refused here, as config.yaml and the tracked params
    would carry its value in plain text, unless ``resumes`` (train, run: the same run goes on)
    and CONFIG is the run's own stored config.yaml that already held it (a resume of a run from
    before the check, a requeued trial). A sweep or a study starts new runs from it: no names pass."""
    from hpcpipe.config.launch import check_plain_env
    from hpcpipe.layout import RunLayout

    job = load_job(config, sets, nproc)
    stored = RunLayout(job.run_dir).config
    given = Path(config)
    own = resumes and given.is_file() and stored.is_file() and given.resolve() == stored.resolve()
    check_plain_env(job.launch, load_config(stored).launch if own else None)
    return job


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
        _print_blocks(console, headers, rows)
        return
    columns = [
        Column(h, no_wrap=True, min_width=widest[h]) if h in typed else Column(h, overflow="fold")
        for h in headers
    ]
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console.print(table)


def _print_blocks(view: Console, headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """One block of ``header: value`` lines per row: every value whole at any terminal width."""
    for row in rows:
        for header, cell in zip(headers, row, strict=True):
            view.print(f"[bold]{escape(header)}[/]: ", end="", soft_wrap=True)
            view.print(cell, soft_wrap=True)
        view.print()


def print_whole(table: Table, view: Console | None = None, wraps: Collection[str] = ()) -> None:
    """Print a rich ``table`` without cutting a typed value off (a number, a name, a verdict).

    Every column but the ``wraps`` ones keeps its widest cell on one line; those (free text: a
    finding, a detail; a figure with its unit) share the rest of the width and wrap between
    words, never inside one. A terminal too narrow for that gets one block of ``header: value``
    lines per row (after the title); a file or a pipe gets the table as wide as it needs, instead
    of rich's 80 columns with the values cut to "...".
    """
    view = view or console
    ranges = [(column, _cells_range(view, column)) for column in table.columns]
    wrapping = [(column, cells) for column, cells in ranges if str(column.header) in wraps]
    for column, cells in ranges:
        column.no_wrap, column.min_width, column.overflow = True, cells.maximum, "fold"
    # What the typed columns take whole: their widest cells, each column's padding, the borders.
    typed = sum(cells.maximum for column, cells in ranges if str(column.header) not in wraps)
    frame = table._extra_width + 2 * len(ranges) + typed
    room = view.width - frame
    if not view.is_terminal:  # a file or a pipe: every cell whole, however wide
        widths = [cells.maximum for _, cells in wrapping]
    elif room >= sum(cells.minimum for _, cells in wrapping):
        widths = _share(room, [cells for _, cells in wrapping])
    else:
        _print_as_blocks(view, table)
        return
    for (column, _), width in zip(wrapping, widths, strict=True):
        column.no_wrap, column.min_width, column.width = False, None, width
    table.width = frame + sum(widths)  # rich must not shrink it to the console's width
    view.print(table, crop=False)


def _print_as_blocks(view: Console, table: Table) -> None:
    if table.title:
        view.print(table.title, soft_wrap=True)
    headers = [str(column.header) for column in table.columns]
    _print_blocks(view, headers, list(zip(*(column.cells for column in table.columns), strict=True)))


def _share(room: int, ranges: Sequence[Measurement]) -> list[int]:
    """Widths of the wrapping columns within ``room``: each its longest word at least, the rest
    shared in proportion to what each lacks of its widest cell (all whole when ``room`` allows)."""
    widths = [cells.minimum for cells in ranges]
    lacking = [cells.maximum - cells.minimum for cells in ranges]
    spare = room - sum(widths)
    if spare >= sum(lacking):
        return [cells.maximum for cells in ranges]
    return [width + spare * lack // sum(lacking) for width, lack in zip(widths, lacking, strict=True)]


def _cells_range(view: Console, column: Column) -> Measurement:
    """The widths of a column's header and cells in terminal cells (markup left out): the
    longest word among them, and the widest whole cell."""
    wide = view.options.update_width(10_000)
    widths = [Measurement.get(view, wide, cell) for cell in (column.header, *column.cells)]
    return Measurement(max(w.minimum for w in widths), max(w.maximum for w in widths))
