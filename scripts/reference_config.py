"""docs/reference/config.md: every key of a job's config, from the pydantic models in
src/hpcpipe/config/ (type, default, description). A field without a description is an error."""

from __future__ import annotations

import inspect
import json
import typing
from enum import Enum
from types import NoneType, UnionType
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from reference_markdown import MissingDescription, from_docstring, page, table

from hpcpipe.config import JobConfig


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The config models inside ``annotation`` (a section, ``X | None``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [s for arg in typing.get_args(annotation) for s in _sections(arg)]


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, UnionType):
        return " | ".join(_type_name(a) for a in args)
    if annotation is NoneType:
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section (below)"
    if origin is dict and _sections(annotation):
        return "mapping of names to sections (below)"
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(json.dumps(m.value) for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, Enum):
        value = value.value
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value}`"


def _where(model: type[BaseModel], name: str) -> str:
    path = inspect.getsourcefile(model) or "?"
    return f"{model.__name__}.{name} in {path[path.find('src/') :]}"


def _rows(model: type[BaseModel], prefix: str, out: list[tuple[str, type[BaseModel], str]]) -> None:
    """Every section below ``model`` as (dotted path, model, how it is written), depth first."""
    for name, info in model.model_fields.items():
        for sub in _sections(info.annotation):
            mapped = typing.get_origin(info.annotation) is dict
            path = f"{prefix}{name}" + (".<name>" if mapped else "")
            optional = type(None) in typing.get_args(info.annotation)
            out.append((path, sub, "An optional section: null (off) or a mapping." if optional else ""))
            _rows(sub, path + ".", out)


def _section_doc(model: type[BaseModel], path: str) -> str:
    doc = model.__dict__.get("__doc__")
    if not doc:
        raise MissingDescription(
            f"config section {path} ({model.__name__}) has no docstring: say what it configures"
        )
    return from_docstring(doc)


def _leaf_rows(model: type[BaseModel], path: str) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for field_name, info in model.model_fields.items():
        name = info.alias or field_name  # the key as written in YAML (checkpoint.async)
        key = f"{path}.{name}" if path else name
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            continue  # a nested section: its own heading (and its class docstring) below
        if not info.description:
            raise MissingDescription(
                f"config field {key} ({_where(model, field_name)}) has no description: "
                "add Field(..., description=...)"
            )
        rows.append((f"`{key}`", _type_name(info.annotation), _default(info), info.description))
    return rows


def build() -> str:
    sections: list[tuple[str, type[BaseModel], str]] = [("", JobConfig, "")]
    _rows(JobConfig, "", sections)
    body: list[str] = []
    for path, model, note in sections:
        doc = _section_doc(model, path or "(the job)")
        heading = f"`{path}`" if path else "The job (top level)"
        body += [f"## {heading}", "", doc, ""]
        if note:
            body += [f"*{note}*", ""]
        rows = _leaf_rows(model, path)
        if rows:
            body += [*table(("Key", "Type", "Default", "Description"), rows), ""]
    intro = (
        "Every key of a job's config, with its type, default and meaning. A job is a preset name "
        "(`hpcpipe presets list --names`) or a YAML file with these sections; `--set section.key=value` "
        "overrides any key (parsed to the key's type; lists as `--set data.sources=[a.txt,docs/]`; "
        "`null` clears an optional key). Unknown keys are refused with one line naming the key. "
        "`hpcpipe presets show NAME` prints every key of a preset with its value. The `recipe:` "
        "section's keys belong to the recipe: `hpcpipe recipes show NAME` lists them."
    )
    return page("Configuration reference", intro, body)
