"""docs/reference/run-directory.md: the run directory and the other folders hpcpipe writes, from
hpcpipe.layout (its module docstring is the table; its classes hold the names)."""

from __future__ import annotations

import dataclasses
import inspect

from reference_markdown import from_docstring, page, table

from hpcpipe import layout


def _layouts() -> list[type]:
    return [
        cls
        for _, cls in inspect.getmembers(layout, inspect.isclass)
        if cls.__module__ == layout.__name__ and dataclasses.is_dataclass(cls)
    ]


def _names(cls: type) -> list[tuple[object, ...]]:
    return [
        (f"`{name}`", f"`{value}`")
        for name, value in vars(cls).items()
        if name.isupper() and isinstance(value, str)
    ]


def build() -> str:
    intro, _, rest = from_docstring(layout.__doc__).partition("\n\n")
    body = [rest, ""]
    for cls in _layouts():
        body += [f"## `{cls.__name__}`", "", from_docstring(cls.__doc__), ""]
        body += [*table(("Constant", "Name on disk"), _names(cls)), ""]
    return page("Run directory reference", intro, body)
