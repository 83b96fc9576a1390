"""`hpcpipe recipes list|show|check`: the built-in and installed recipes, their arguments, and the
properties every recipe must have (also as `hpcpipe recipe ...`)."""

from __future__ import annotations

import contextlib
import sys
import typing
from typing import Annotated, Any

import typer
from rich.markup import escape

from hpcpipe.cli.common import JsonOption, console, err_console, print_table, write_json
from hpcpipe.errors import ConfigError, UserError, one_line

app = typer.Typer(
    help="Recipes: the built-in ones, those installed packages register (entry-point group "
    "hpcpipe.recipes), their arguments (the job's recipe: section), and `check`, which runs the "
    "properties every recipe must have. Write your own with `hpcpipe new recipe NAME`.",
    no_args_is_help=True,
)

RecipeArg = Annotated[
    str,
    typer.Argument(
        help="A recipe name (`hpcpipe recipes list`) or an import path package.module:Class.",
        show_default=False,
    ),
]


@app.command("list")
def list_recipes(json_out: JsonOption = None) -> None:
    """List every recipe run.recipe can name: hpcpipe's built-ins and those of installed packages,
    with the package each comes from.

    Example: hpcpipe recipes list
    """
    from hpcpipe.recipes.registry import RecipeImportError, collision_message, recipe_class, registry

    reg = registry()
    rows: list[dict[str, Any]] = []
    for name, entry in reg.recipes.items():
        try:
            summary = recipe_class(name).summary
        except Exception as exc:  # a broken package's recipe is listed all the same, with why
            named = isinstance(exc, ConfigError | RecipeImportError)  # their message names the recipe
            why = str(exc) if named else f"{type(exc).__name__}: {exc}"
            summary = f"[red]unusable[/]: {escape(one_line(why))}"
        rows.append({"name": name, "package": f"{entry.package} {entry.version}", "summary": summary})
    for name, entries in reg.collisions.items():
        rows.append(
            {
                "name": name,
                "package": " + ".join(e.package for e in entries),
                "summary": f"[red]unusable[/]: {escape(collision_message(name, entries))}",
            }
        )
    if json_out != "-":
        print_table(("recipe", "package", "summary"), [tuple(r.values()) for r in rows], typed={"recipe"})
    write_json({"recipes": rows}, json_out)


@app.command("show")
def show_recipe(recipe: RecipeArg, json_out: JsonOption = None) -> None:
    """Show a recipe's declaration and its arguments (the job's recipe: section) with their
    types and defaults.

    Examples:

      hpcpipe recipes show gpt

      hpcpipe recipes show mypkg.recipes:MyRecipe
    """
    from hpcpipe.recipes.args import REQUIRED, args_fields
    from hpcpipe.recipes.registry import package_of, recipe_class

    cls = recipe_class(recipe)
    args = [
        {
            "key": key,
            "type": _type_name(annotation),
            "default": None if default is REQUIRED else default,
            "required": default is REQUIRED,
            "description": description,
        }
        for key, (annotation, default, description) in (args_fields(cls.Args) if cls.Args else {}).items()
    ]
    shown = {
        "name": cls.name,
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "package": package_of(cls),
        "summary": cls.summary,
        "metric_goals": dict(cls.metric_goals),
        "model_variants": list(cls.model_variants) if cls.model_variants is not None else None,
        "data_formats": list(cls.data_formats) if cls.data_formats is not None else None,
        "export_formats": list(cls.export_formats),
        "evaluations": list(cls.evaluations),
        "args": args,
    }
    if json_out != "-":
        _print_recipe(shown)
    write_json(shown, json_out)


def _print_recipe(shown: dict[str, Any]) -> None:
    console.print(f"[bold]{shown['name']}[/]  {shown['summary']}")
    console.print(f"class {shown['class']} (package {shown['package'] or 'not installed: an import path'})")
    goals = ", ".join(f"{k} ({v})" for k, v in shown["metric_goals"].items())
    console.print(f"metrics: {goals}")
    for key, label in (("model_variants", "model.variant"), ("data_formats", "data.format")):
        if shown[key] is not None:
            console.print(f"{label}: {', '.join(shown[key])}")
    console.print(f"export formats: {', '.join(shown['export_formats']) or 'none'}")
    if not shown["args"]:
        console.print("arguments: none (no recipe: section)")
        return
    rows = [
        (
            f"recipe.{a['key']}",
            a["type"],
            "required" if a["required"] else repr(a["default"]),
            a["description"],
        )
        for a in shown["args"]
    ]
    print_table(("key", "type", "default", "description"), rows, typed={"key"})


def _type_name(annotation: Any) -> str:
    """``list[str]``, ``int | None``, ``Literal['a', 'b']``: as a user reads it."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


@app.command("check")
def check(
    recipe: RecipeArg,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="A job YAML or preset to check the recipe with (default: the recipe at test "
            "size, its check_overrides).",
            show_default=False,
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", "-s", help="Override a key of the checked job (repeatable).", show_default=False
        ),
    ] = None,
    work: Annotated[
        str | None,
        typer.Option(
            "--work",
            help="Directory for the check's runs (default: a temporary one, removed). What a "
            "previous check wrote there is removed first; a directory holding anything else is "
            "refused.",
            show_default=False,
        ),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only", help="Run only these properties (repeatable; default: all).", show_default=False
        ),
    ] = None,
    json_out: JsonOption = None,
) -> None:
    """Run, at test size on the CPU, the properties every recipe must have, and print a PASS/FAIL
    table (exit 1 on a failure): the loader gives the same batches from the same seed, step and
    rank (other samples on each of 2 ranks, and the same global batch at 1 and 2 ranks); 2 DDP
    ranks whose rank 1 is SIGKILLed at step 4 restart and resume bit for bit; one process, 2 DDP
    ranks and 2 FSDP2 ranks agree; the checkpoint round-trips; the export loads; evaluation
    reports val_loss; bad recipe arguments are refused.

    Examples:

      hpcpipe recipes check gpt

      hpcpipe recipes check stdlib-classifier --json check.json
    """
    from hpcpipe.launch import zygote
    from hpcpipe.recipecheck.runner import MULTI_RANK, PROPERTIES, check_recipe, report_dict, worker_imports

    unknown = sorted(set(only or ()) - set(PROPERTIES))
    if unknown:
        raise UserError(f"--only {unknown[0]}: not a property (known: {', '.join(PROPERTIES)})")
    if set(only or PROPERTIES) & MULTI_RANK:
        # Before the status line starts its thread and before anything computes: the check's
        # 2-rank runs fork from this process's imports (launch/zygote.py).
        zygote.prestart(worker_imports(recipe))
    quiet = json_out == "-"
    live = console.is_terminal and not quiet
    status = console.status("checking") if live else contextlib.nullcontext()
    with status as shown:

        def say(name: str) -> None:
            if shown is not None:
                shown.update(f"checking {name}")

        # Libraries that print on import (DeepSpeed, through transformers) write to stderr: standard
        # output carries the table, or the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            report = check_recipe(recipe, config, list(sets or ()), work, tuple(only or ()), say)
    if not quiet:
        _print_report(report)
    write_json(report_dict(report), json_out)
    if not report.passed:
        raise typer.Exit(1)


def _print_report(report: Any) -> None:
    """The PASS/FAIL table, then the traceback of each property the recipe's own code failed."""
    marks = {
        (True, False): "[green]PASS[/]",
        (False, True): "[yellow]SKIP[/]",
        (False, False): "[red]FAIL[/]",
    }
    rows = [(r.name, marks[(r.passed, r.skipped)], f"{r.seconds:.1f}", r.detail) for r in report.results]
    print_table(("property", "result", "s", "detail"), rows, typed={"property", "result"})
    for result in report.results:
        if result.traceback:  # the traceback as it is: "x[0]" is no markup
            err_console.print(f"[bold]{result.name}[/]: the recipe's code raised:", highlight=False)
            err_console.print(result.traceback, markup=False, highlight=False)
    if report.kept:
        err_console.print(
            f"the runs and their logs are kept in {report.kept} (remove it when done)", markup=False
        )
    verdict = "[green]PASS[/]" if report.passed else "[red]FAIL[/]"
    console.print(
        f"{verdict} recipe {report.recipe} in {report.seconds:.0f} s (parity: relative {report.rtol:g})"
    )
