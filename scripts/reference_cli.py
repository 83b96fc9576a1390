"""docs/reference/cli.md: every command and option of ``hpcpipe``, read from the CLI itself (the
command tree Typer builds), with each option's type, default and help."""

from __future__ import annotations

from typing import Any

import typer
from reference_markdown import page, prose, table
from rich.text import Text

from hpcpipe.cli.app import app


def _plain(text: str | None) -> str:
    """Help text without Rich markup (``[bold]``)."""
    return Text.from_markup(text or "").plain.strip()


def _help(text: str | None) -> tuple[list[str], list[str]]:
    """A command's help: its prose, and its ``Examples:`` block as a code block (the columns of the
    examples' comments line up only in a fixed-width font)."""
    head, found, examples = _plain(text).partition("\nExamples:")
    shown = [line.strip() for line in examples.splitlines() if line.strip()]
    return [prose(head.strip()), ""], (["Examples:", "", "```", *shown, "```", ""] if found else [])


def _default(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False):
        return "on" if default else ""
    if callable(default) or default is None or default in ((), [], ""):
        return ""
    return f"`{getattr(default, 'value', default)}`"


def _kind(param: Any, ctx: typer.Context) -> str:
    """The value's type as a user reads it: ``int ≥ 1`` rather than click's ``int range``."""
    if getattr(param, "is_flag", False):
        return "flag"
    kind = param.display_type(ctx).strip("<> ").lower()
    if kind.endswith(" range"):
        low, high = getattr(param, "min", None), getattr(param, "max", None)
        base = kind.removesuffix(" range")
        bounds = [f"≥ {low}"] if low is not None else []
        bounds += [f"≤ {high}"] if high is not None else []
        kind = f"{base} {', '.join(bounds)}".strip()
    return kind


def _usage(path: str, cmd: Any) -> str:
    """``hpcpipe train [OPTIONS] CONFIG``, the arguments named as in the table."""
    pieces = [path]
    if any(p.param_type_name == "option" and not p.hidden for p in cmd.params):
        pieces.append("[OPTIONS]")
    for param in cmd.params:
        if param.param_type_name == "argument":
            name = param.name.upper() + ("..." if param.nargs == -1 else "")
            pieces.append(name if param.required else f"[{name}]")
    if getattr(cmd, "commands", None):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def _param_row(param: Any, ctx: typer.Context) -> tuple[object, ...]:
    if param.param_type_name == "argument":
        name = f"`{param.name.upper()}`"
    else:
        name = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    return (name, _kind(param, ctx), _default(param), _plain(param.help))


def _command(path: str, cmd: Any, body: list[str]) -> None:
    if cmd.hidden:
        return
    ctx = typer.Context(cmd, info_name=path)
    about, examples = _help(cmd.help)
    body += [f"## `{path}`", "", *about, "```", _usage(path, cmd), "```", "", *examples]
    params = [p for p in cmd.params if not p.hidden]
    if params:
        rows = [_param_row(p, ctx) for p in params]
        body += [*table(("Argument / option", "Type", "Default", "Help"), rows), ""]
    for name in sorted(getattr(cmd, "commands", {})):
        _command(f"{path} {name}", cmd.commands[name], body)


def build() -> str:
    body: list[str] = []
    _command("hpcpipe", typer.main.get_command(app), body)
    intro = (
        "Every command and option of `hpcpipe`; `hpcpipe COMMAND --help` prints the same in a "
        "terminal. Bad input (a config key, a flag, a path) ends with one line naming it and exit "
        "code 2 ([exit codes](exit-codes.md))."
    )
    return page("Command-line reference", intro, body)
