"""Small Markdown helpers shared by the generated reference pages (scripts/build_reference.py)."""

from __future__ import annotations

import re


class MissingDescription(Exception):
    """Something the reference must describe has no description in the code (names it)."""


_RST_LITERAL = re.compile(r"``([^`]+)``")
_RST_HEADING = re.compile(r"^(\S[^\n]*)\n[-=]{3,}\n", re.M)  # a reST section title
_RST_ROLE = re.compile(r":(?:class|func|meth|attr|mod):`~?([^`]+)`")


def from_docstring(text: str | None) -> str:
    """A docstring as Markdown: reST ``literals`` and :roles:`x` become code spans."""
    if not text:
        return ""
    import inspect

    text = _RST_HEADING.sub(r"## \1\n", inspect.cleandoc(text))
    return prose(_RST_ROLE.sub(r"`\1`", _RST_LITERAL.sub(r"`\1`", text)))


_CODE_SPAN = re.compile(r"(`[^`]*`)")


def prose(text: str, pipes: bool = False) -> str:
    """``text`` with ``<``, ``>`` and ``*`` outside code spans escaped (``<out_dir>`` is not an HTML
    tag, ``train.*`` starts no emphasis),
    and with ``pipes`` its ``|`` too (a table cell; inside a code span one is not a separator)."""
    parts = _CODE_SPAN.split(text)
    escaped = [p.replace("<", "&lt;").replace(">", "&gt;").replace("*", "\\*") for p in parts[::2]]
    if pipes:
        escaped = [p.replace("|", "\\|") for p in escaped]
    parts[::2] = escaped
    return "".join(parts)


def cell(text: object) -> str:
    """One table cell: on one line, with the table's separator and angle brackets escaped."""
    return prose(" ".join(str(text).split()), pipes=True)


def table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def page(title: str, intro: str, body: list[str]) -> str:
    generated = (
        "Generated from the code by `scripts/build_reference.py` (`make docs`; a test keeps it current)."
    )
    return "\n".join([f"# {title}", "", intro, "", generated, "", *body]).rstrip() + "\n"
