"""`hpcpipe lineage RUN_DIR`: which data, code and config made which model, from lineage.json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hpcpipe.cli.common import JsonOption, console, write_json
from hpcpipe.errors import UserError
from hpcpipe.layout import RunLayout


def lineage(
    run_dir: Annotated[Path, typer.Argument(help="A run directory (runs/<name>).", show_default=False)],
    json_out: JsonOption = None,
) -> None:
    """Print the run's pipeline graph: each step with its status, the config keys and upstream
    outputs it consumed, and the hashes of what it produced (dataset manifest, checkpoint,
    export, registered version, report). Read from RUN_DIR/lineage.json alone.

    Example:

      hpcpipe run quickstart && hpcpipe lineage runs/quickstart
    """
    from rich.tree import Tree

    from hpcpipe.observe.lineage_record import read_checked_lineage
    from hpcpipe.pipeline.steps import STEPS

    path = RunLayout(run_dir).lineage
    if not path.is_file():
        raise UserError(f"{run_dir}: no lineage.json (not a run directory, or never started)")
    record = read_checked_lineage(path)
    if json_out is not None:
        write_json(record, json_out)
        if json_out == "-":
            return
    versions = record.get("versions") or {}
    hosts = ",".join(str(host) for host in record.get("hosts") or [])
    root = Tree(
        f"[bold]{_e(run_dir.name)}[/]  code {_e(record.get('git_sha'))}  "
        f"config {_e(_short(record.get('config_hash')))}  hpcpipe {_e(versions.get('hpcpipe'))}  "
        f"torch {_e(versions.get('torch'))}  hosts {_e(hosts)} x{_e(record.get('world_size'))}"
    )
    steps = record.get("steps") or {}
    for step in STEPS:
        _add_step(root, step.name, steps.get(step.name), step.describe)
    console.print(root)


def _add_step(root: Any, name: str, rec: dict[str, Any] | None, describe: str) -> None:
    if rec is None:
        root.add(f"{name}: [dim]not run ({describe})[/]")
        return
    colour = {"done": "green", "failed": "red"}.get(str(rec.get("status", "")), "yellow")
    node = root.add(
        f"[{colour}]{name}[/]: {_e(rec.get('status'))}"
        + (f" ({_e(rec['reason'])})" if rec.get("reason") else "")
    )
    inputs = rec.get("inputs") or {}
    keys = ", ".join(inputs.get("config") or {})
    if keys:
        node.add(f"config: {_e(keys)}")
    for upstream, outputs in (inputs.get("upstream") or {}).items():
        node.add(f"from {_e(upstream)}: {_e(_outputs(outputs))}")
    if rec.get("outputs"):
        node.add(f"[bold]made[/]: {_e(_outputs(rec['outputs']))}")
    if rec.get("error"):
        node.add(f"[red]error[/]: {_e(rec['error'])}")


def _outputs(outputs: dict[str, str] | None) -> str:
    if not outputs:
        return "-"
    return ", ".join(f"{k} {_short(v)}" for k, v in outputs.items())


def _e(value: Any) -> str:
    """``value`` as text that rich prints as it is (the record's strings are not markup)."""
    from rich.markup import escape

    return escape(str(value))


def _short(value: Any) -> str:
    text = str(value)
    if ":" in text:  # step-00000020:<sha>
        head, _, tail = text.partition(":")
        return f"{head}:{tail[:12]}"
    return text[:12]
