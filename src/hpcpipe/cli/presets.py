"""`hpcpipe presets list|show`: the shipped job presets."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from hpcpipe.cli.common import console, print_table
from hpcpipe.config import load_config
from hpcpipe.config.loading import job_source_path
from hpcpipe.errors import ConfigError, one_line
from hpcpipe.presets import preset_names, preset_path
from hpcpipe.recipes.registry import RecipeImportError, recipe_class

app = typer.Typer(help="List and show the shipped job presets.", no_args_is_help=True)


@app.command("list")
def list_presets(
    names_only: Annotated[
        bool, typer.Option("--names", help="One preset name per line, nothing else (for scripts).")
    ] = False,
) -> None:
    """List shipped presets with their model size, batch, steps and parallel strategy.

    On a terminal: a table whose name column is never cut (descriptions wrap). Piped: plain
    tab-separated columns, one preset per line, so `hpcpipe presets list | grep fashion` finds it.
    """
    if names_only:
        for name in preset_names():
            typer.echo(name)
        return
    header = ("preset", "model", "global batch", "steps", "parallel", "description")
    rows = [_row(name) for name in preset_names()]
    print_table(header, rows, typed={"preset"})


def _row(name: str) -> tuple[str, ...]:
    first_line = preset_path(name).read_text().splitlines()[0].lstrip("# ")
    try:
        cfg = load_config(name)
    except (ConfigError, RecipeImportError) as exc:
        # Its recipe cannot be used here (an installed package claims the built-in's name, or
        # its module is broken): the other presets are still listed, this one with why.
        why = f"[red]unusable[/]: {escape(one_line(str(exc)))}"
        return (name, why, "", "", "", first_line)
    t = cfg.train
    return (
        name,
        recipe_class(cfg.run.recipe).describe_model(cfg),
        str(t.global_batch_size),
        str(t.steps),
        f"{cfg.parallel.strategy} x{cfg.parallel.nproc}",
        first_line,
    )


@app.command("show")
def show_preset(
    name: Annotated[str, typer.Argument(help="Preset name or YAML path.")],
    resolved: Annotated[
        bool, typer.Option("--resolved/--raw", help="Show every key with defaults filled in.")
    ] = True,
) -> None:
    """Print a preset or job file as YAML (resolved: every key, with defaults filled in; raw: the
    file's own text)."""
    cfg = load_config(name)
    text = cfg.to_yaml() if resolved else job_source_path(name).read_text()
    console.print(text, markup=False, highlight=False, end="")
