"""A recipe's own section: ``recipe:`` in the job, checked against the recipe's ``Args`` schema.

``Args`` is a pydantic model or a dataclass (validated through pydantic's ``TypeAdapter``). The
section is checked when the job loads, like every other section: an unknown key or a value of
the wrong type is one ConfigError naming ``recipe.<key>``. The checked section, with every default
filled in and as JSON values, is what ``config.yaml``, the training hash, lineage, ``--set`` and
HPO see; the recipe gets the typed instance (``parse_args``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from hpcpipe.annotations import is_number
from hpcpipe.errors import ConfigError, hide_credentials, stable_repr

REQUIRED = dataclasses.MISSING  # the default of a key that has none


def is_schema(schema: Any) -> bool:
    """A pydantic model class or a dataclass type: what ``Args`` may be."""
    from pydantic import BaseModel

    return isinstance(schema, type) and (issubclass(schema, BaseModel) or dataclasses.is_dataclass(schema))


def validate_args(schema: type | None, raw: Mapping[str, Any] | None, recipe: str) -> dict[str, Any]:
    """``raw`` checked against ``schema`` and filled with its defaults, as JSON-able values; a
    ConfigError naming ``recipe.<key>`` otherwise. ``recipe`` names the recipe in messages."""
    raw = dict(raw or {})
    if schema is None:
        if raw:
            key = next(iter(raw))
            raise ConfigError(f"unknown config key 'recipe.{key}' (recipe {recipe!r} takes no arguments)")
        return {}
    _check_given(schema, raw, "recipe", recipe)
    from pydantic import ValidationError

    adapter = _adapter(schema)
    try:
        value = adapter.validate_python(raw)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc)) from None
    dumped: dict[str, Any] = adapter.dump_python(value, mode="json")
    try:  # pydantic leaves defaults unchecked: written out, a bad one failed the recipe's start
        adapter.validate_python(dumped)
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        given = bool(loc) and str(loc[0]) in raw
        where = "" if given else f" (its default in the Args of recipe {recipe!r} breaks its own rule)"
        raise ConfigError(_first_error(exc) + where) from None
    return dumped


def _check_given(schema: type, raw: Mapping[str, Any], where: str, recipe: str) -> None:
    """The rules of hpcpipe's own sections for what the user gave, at every depth (nested
    models, lists and dicts of them): no unknown key (pydantic's default drops one inside a
    nested model, where ``--set`` refused it), no true/false for a number (read as 1), no inf or
    nan (given as a number or as text)."""
    fields = args_fields(schema)
    for key, value in raw.items():
        if key not in fields:
            known = ", ".join(fields)
            raise ConfigError(f"unknown config key '{where}.{key}' (keys in {where} ({recipe}): {known})")
        _check_value(fields[key][0], value, f"{where}.{key}", recipe)


def _check_value(annotation: Any, value: Any, where: str, recipe: str) -> None:
    inner = _optional_inner(annotation)
    origin, args = typing.get_origin(inner), typing.get_args(inner)
    if isinstance(value, Mapping) and is_schema(inner):
        _check_given(inner, value, where, recipe)
    elif isinstance(value, list) and origin in (list, tuple, set, frozenset) and args:
        for index, item in enumerate(value):
            _check_value(args[0], item, f"{where}.{index}", recipe)
    elif isinstance(value, Mapping) and origin is dict and len(args) == 2:
        for name, item in value.items():
            _check_value(args[1], item, f"{where}.{name}", recipe)
    elif is_number(annotation) and isinstance(value, bool):
        raise ConfigError(f"{where}: expected a number, not true or false")
    elif is_number(annotation) and not _finite(value):
        raise ConfigError(f"{where}: expected a finite number (got {value})")


def _finite(value: Any) -> bool:
    """False for inf and nan, as a float or as text pydantic would read as one ('inf', 'NaN')."""
    if not isinstance(value, float | str):
        return True
    try:
        return math.isfinite(float(value))
    except ValueError:
        return True  # not a number at all: pydantic's own message names it


def parse_args(schema: type | None, raw: Mapping[str, Any] | None) -> Any:
    """The typed instance of a checked ``recipe:`` section (None without a schema)."""
    if schema is None:
        return None
    from pydantic import ValidationError

    try:
        return _adapter(schema).validate_python(dict(raw or {}))
    except ValidationError as exc:  # a section that was not checked by validate_args
        raise ConfigError(_first_error(exc)) from None


def args_fields(schema: type) -> dict[str, tuple[Any, Any, str]]:
    """``{key: (annotation, default, description)}`` of a pydantic model or a dataclass, in
    declared order; a default of ``REQUIRED`` means the key has none. A dataclass field's
    description is ``field(metadata={"description": ...})``."""
    from pydantic import BaseModel

    if issubclass(schema, BaseModel):
        return {
            field.alias or name: (
                field.annotation,
                REQUIRED if field.is_required() else field.get_default(call_default_factory=True),
                field.description or "",
            )
            for name, field in schema.model_fields.items()
        }
    hints = typing.get_type_hints(schema)
    out: dict[str, tuple[Any, Any, str]] = {}
    for f in dataclasses.fields(schema):  # type: ignore[arg-type]  # a dataclass: is_schema
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = REQUIRED
        out[f.name] = (hints.get(f.name, Any), default, str(f.metadata.get("description", "")))
    return out


def args_annotation(schema: type | None, key: str, recipe: str) -> Any:
    """The annotation of ``recipe.<key>`` (dotted into nested models, for ``--set``); a
    ConfigError for a key the recipe does not have."""
    if schema is None:
        raise ConfigError(f"unknown config key 'recipe.{key}' (recipe {recipe!r} takes no arguments)")
    node: Any = schema
    parts = key.split(".")
    for depth, part in enumerate(parts):
        fields = args_fields(node) if is_schema(node) else {}
        if part not in fields:
            where = ".".join(["recipe", *parts[:depth]])
            known = ", ".join(fields) or "none"
            raise ConfigError(f"unknown config key 'recipe.{key}' (keys in {where} ({recipe}): {known})")
        annotation = fields[part][0]
        if depth == len(parts) - 1:
            return annotation
        node = _optional_inner(annotation)
    raise AssertionError("unreachable")


def _optional_inner(annotation: Any) -> Any:
    """``Model | None`` -> ``Model``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return annotation


@functools.cache
def _adapter(schema: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(schema)


def _first_error(exc: Any) -> str:
    err = exc.errors()[0]
    loc = ".".join(["recipe", *(str(part) for part in err["loc"])])
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return f"unknown config key {loc!r}"
    if "input" in err and err["type"] != "missing" and not isinstance(err["input"], dict):
        return f"{loc}: {message} (got {hide_credentials(stable_repr(err['input']))})"
    return f"{loc}: {message}"
