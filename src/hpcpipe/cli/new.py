"""`hpcpipe new recipe NAME`: a package to bring your own model to hpcpipe."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hpcpipe.cli.common import console

app = typer.Typer(help="Start something of your own: `hpcpipe new recipe NAME`.", no_args_is_help=True)


@app.command("recipe")
def new_recipe(
    name: Annotated[
        str, typer.Argument(help="The recipe's name (run.recipe), e.g. my-recipe.", show_default=False)
    ],
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir", help="Where to write the package (default: ./NAME; must be empty).", show_default=False
        ),
    ] = None,
) -> None:
    """Write an installable recipe package: pyproject.toml with the `hpcpipe.recipes` entry point,
    the recipe module (a working DatasetRecipe to replace with your model, data and loss), a job,
    a README, a Dockerfile on top of hpcpipe's image, and a test that runs `hpcpipe recipes check`.

    Examples:

      hpcpipe new recipe my-recipe && pip install -e './my-recipe\\[test]' && hpcpipe recipes check my-recipe

      hpcpipe new recipe text-classifier --dir packages/text-classifier
    """
    from hpcpipe import __version__
    from hpcpipe.scaffold.recipe import write_package

    out = directory or Path(name)
    written = write_package(name, out, __version__)
    console.print(f"wrote [bold]{out}[/] ({len(written)} files)")
    for path in written:
        console.print(f"  {path}", highlight=False)
    console.print(
        f"next: pip install -e '{out}[test]', then hpcpipe recipes check {name}; "
        f"hpcpipe train {out}/job.yaml",
        markup=False,
        highlight=False,
    )
