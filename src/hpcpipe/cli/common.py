"""Options and helpers shared by CLI verbs. Heavy imports (torch) stay inside the verbs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from hpcpipe.config import JobConfig, load_config

console = Console()
err_console = Console(stderr=True)

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
    path = Path(target)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
