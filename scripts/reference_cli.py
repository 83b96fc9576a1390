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
    return prose(Text.from_markup(text or "").plain.strip())


def _default(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if getattr(param, "is_flag", False):
        return "on" if default else ""
    if callable(default) or default is None or default in ((), []):
        return ""
    return f"`{getattr(default, 'value', default)}`"


def _param_row(param: Any, ctx: typer.Context) -> tuple[object, ...]:
    if param.param_type_name == "argument":
        name = f"`{param.name.upper()}`"
    else:
        name = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    kind = "flag" if getattr(param, "is_flag", False) else param.display_type(ctx).strip("<> ").lower()
    return (name, kind, _default(param), _plain(param.help))


def _command(path: str, cmd: Any, body: list[str]) -> None:
    if cmd.hidden:
        return
    ctx = typer.Context(cmd, info_name=path)
    usage = " ".join(cmd.collect_usage_pieces(ctx))
    body += [f"## `{path}`", "", _plain(cmd.help), "", "```", f"{path} {usage}".rstrip(), "```", ""]
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
