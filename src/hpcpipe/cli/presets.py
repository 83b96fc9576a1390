"""`hpcpipe presets list|show`: the shipped job presets."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from hpcpipe.cli.common import console
from hpcpipe.config import load_config
from hpcpipe.presets import preset_names, preset_path

app = typer.Typer(help="List and show the shipped job presets.", no_args_is_help=True)


@app.command("list")
def list_presets() -> None:
    """List shipped presets with their model size and parallel strategy."""
    table = Table("preset", "model", "tokens/step", "steps", "parallel", "description")
    for name in preset_names():
        cfg = load_config(name)
        first_line = preset_path(name).read_text().splitlines()[0].lstrip("# ")
        m, t = cfg.model, cfg.train
        table.add_row(
            name,
            f"{m.variant} L{m.n_layers} d{m.d_model} T{m.seq_len}",
            str(t.global_batch_size * m.seq_len),
            str(t.steps),
            f"{cfg.parallel.strategy} x{cfg.parallel.nproc}",
            first_line,
        )
    console.print(table)


@app.command("show")
def show_preset(
    name: Annotated[str, typer.Argument(help="Preset name or YAML path.")],
    resolved: Annotated[
        bool, typer.Option("--resolved/--raw", help="Show every key with defaults filled in.")
    ] = True,
) -> None:
    """Print a preset as YAML (resolved: every key, with defaults filled in)."""
    cfg = load_config(name)
    text = cfg.to_yaml() if resolved else preset_path(name).read_text()
    console.print(text, markup=False, highlight=False, end="")
