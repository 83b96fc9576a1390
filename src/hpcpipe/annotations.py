"""What a field's type annotation means to the config rules, shared by hpcpipe's own sections
(``config/section.py``) and a recipe's ``Args`` (``recipes/args.py``)."""

from __future__ import annotations

import types
import typing
from typing import Any


def is_number(annotation: Any) -> bool:
    """int, float, or an optional one (``int | None``), ``Annotated`` constraints looked through."""
    if typing.get_origin(annotation) is typing.Annotated:
        return is_number(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return bool(args) and all(is_number(arg) for arg in args)
    return annotation in (int, float)
