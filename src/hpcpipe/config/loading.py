"""Loading a job: a preset name or YAML path -> dict -> ``--set`` overrides -> validated JobConfig.

Overrides are dotted keys (``train.lr=1e-3``), each value parsed to its field's type; an unknown
key or a bad value is a ConfigError naming the key (one line, exit 2 at the CLI).
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ValidationError

from hpcpipe.config.job import JobConfig
from hpcpipe.config.run import RunConfig
from hpcpipe.errors import ConfigError, hide_credentials, stable_repr
from hpcpipe.yamlfile import load_yaml_text, read_yaml_file


def load_config(source: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> JobConfig:
    """Load a preset name or YAML path, apply ``section.key=value`` overrides, validate."""
    return load_values(_read_source(source), overrides, origin=str(source))


def load_values(raw: dict[str, Any], overrides: list[str] | tuple[str, ...], origin: str) -> JobConfig:
    """``raw`` (a job's sections, as a YAML file holds them) with overrides applied, validated;
    ``origin`` names where ``raw`` came from in an error."""
    _switching_recipe(raw, [item.partition("=")[::2] for item in overrides])
    for item in overrides:
        _apply_override(raw, item)
    return validate_config(raw, origin=origin)


def with_overrides(job: JobConfig, overrides: list[str] | tuple[str, ...]) -> JobConfig:
    """``job`` with ``--set section.key=value`` overrides applied (ConfigError on a bad one)."""
    raw = job.to_dict()
    _switching_recipe(raw, [item.partition("=")[::2] for item in overrides])
    for item in overrides:
        _apply_override(raw, item)
    return validate_config(raw, origin="--set")


def apply_values(job: JobConfig, values: dict[str, Any]) -> JobConfig:
    """``job`` with typed values set by dotted key (an unknown key or a bad value: ConfigError)."""
    raw = job.to_dict()
    _switching_recipe(raw, list(values.items()))
    for key, value in values.items():
        _field_annotation(key, raw)  # names the key when JobConfig has no such key
        node = raw
        for part in key.split(".")[:-1]:
            if node.get(part) is None:  # an optional section that was off (null) comes on
                node[part] = {}
            node = node[part]
        _drop_other_spelling(node, key)
        node[key.rsplit(".", 1)[-1]] = value
    return validate_config(raw, origin=", ".join(f"{k}={v}" for k, v in values.items()) or "config")


def validate_config(raw: dict[str, Any], origin: str = "config") -> JobConfig:
    try:
        return JobConfig.model_validate(raw)
    except RecursionError:  # a self-referencing YAML alias (`steps: &a [*a]`), or deep nesting
        raise ConfigError(f"{origin or 'config'}: a value refers to itself or is nested too deeply") from None
    except ValidationError as exc:
        raise ConfigError(f"{origin or 'config'}: {first_error(exc)}") from None
    except ConfigError as exc:  # the recipe's checks (run.recipe, recipe.<key>) name their key
        raise ConfigError(f"{origin or 'config'}: {exc}") from None


def job_source_path(source: str | Path) -> Path:
    """The file a job source names: a path (``.yaml``/``.yml``, or one with a ``/``) or a shipped
    preset's file; a ConfigError naming it when there is no such file."""
    from hpcpipe.presets import preset_path

    path = Path(source)
    looks_like_path = path.suffix.lower() in {".yaml", ".yml"} or "/" in str(source)
    if looks_like_path and path.is_dir():  # a bare name is a preset, whatever the directory holds
        raise ConfigError(f"{path}: a directory, not a job file (give its config.yaml, or a preset)")
    if not looks_like_path:
        path = preset_path(str(source))  # raises ConfigError naming the known presets
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    return path


def _read_source(source: str | Path) -> dict[str, Any]:
    path = job_source_path(source)
    data = read_yaml_file(path, "job file")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def _current_recipe(raw: dict[str, Any]) -> str:
    return str((raw.get("run") or {}).get("recipe", RunConfig.model_fields["recipe"].default))


def _switching_recipe(raw: dict[str, Any], values: list[tuple[str, Any]]) -> None:
    """An override that names another ``run.recipe`` empties the ``recipe:`` section first: its
    keys were the previous recipe's (a loaded job holds every default of its recipe's Args), and
    the new recipe starts from its own defaults and the ``recipe.*`` overrides given with it."""
    new = [str(value).strip() for key, value in values if key.strip() == "run.recipe"]
    if new and new[-1] != _current_recipe(raw):
        raw["recipe"] = {}
        # Before any recipe.* override is read: given ahead of run.recipe, they were checked
        # against the old recipe's keys ("unknown config key 'recipe.finetune'").
        if isinstance(raw.get("run"), dict) or raw.get("run") is None:
            raw["run"] = {**(raw.get("run") or {}), "recipe": new[-1]}


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, value = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    annotation = _field_annotation(key, raw)
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if child is None:  # an optional section that was off (observe.profile: null) comes on
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {key}: {part!r} is not a section")
        node = child
    _drop_other_spelling(node, key)
    node[parts[-1]] = _merged(node.get(parts[-1]), _parse_value(value, annotation), annotation)


def _merged(old: Any, new: Any, annotation: Any) -> Any:
    """A mapping given for a section (``--set 'train={lr: 0.01}'``) goes into the section's
    keys, those of its subsections too: replaced whole, it reset every other key the job file
    set to its default. A value that is no mapping, or a free-form dict field, replaces."""
    model = _optional_section(annotation)
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return new
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return new
    merged = dict(old)
    for key, value in new.items():
        field = _field_named(model, str(key))
        if field is not None and field.alias:  # one key per field: async_save given, async held
            merged.pop(field.alias if key != field.alias else _name_of(model, field), None)
        merged[key] = _merged(old.get(key), value, field.annotation) if field is not None else value
    return merged


def _optional_section(annotation: Any) -> Any:
    """``Section | None`` -> ``Section`` (an optional section's keys can be set one by one)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(models) == 1:
            return models[0]
    return annotation


def _field_annotation(key: str, raw: dict[str, Any]) -> Any:
    """The annotation of a dotted key; a ConfigError for a key JobConfig does not have. Keys of
    the ``recipe:`` section are the recipe's (its ``Args``; the recipe ``raw`` names)."""
    section, _, rest = key.partition(".")
    if section == "recipe" and rest:
        return _recipe_annotation(rest, raw)
    model: type[BaseModel] = JobConfig
    parts = key.split(".")
    for depth, part in enumerate(parts):
        field = _field_named(model, part)
        if field is None:
            prefix = ".".join(parts[:depth]) or "top level"
            known = ", ".join(field.alias or name for name, field in model.model_fields.items())
            raise ConfigError(f"unknown config key {key!r} (keys in {prefix}: {known})")
        annotation = field.annotation
        if depth == len(parts) - 1:
            return annotation
        annotation = _optional_section(annotation)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            raise ConfigError(f"unknown config key {key!r}: {'.'.join(parts[: depth + 1])} is a value")
        model = annotation
    raise AssertionError("unreachable")


def _recipe_annotation(key: str, raw: dict[str, Any]) -> Any:
    from hpcpipe.recipes.args import args_annotation
    from hpcpipe.recipes.registry import recipe_class

    ref = _current_recipe(raw)
    try:
        recipe = recipe_class(str(ref))
    except ConfigError:
        return Any  # validation names the bad run.recipe
    return args_annotation(recipe.Args, key, recipe.name)


def _field_named(model: type[BaseModel], key: str) -> Any:
    """The field a YAML key names: its alias (``checkpoint.async``) or its Python name."""
    for name, field in model.model_fields.items():
        if key in (name, field.alias):
            return field
    return None


def _name_of(model: type[BaseModel], field: Any) -> str:
    return next(name for name, other in model.model_fields.items() if other is field)


def _drop_other_spelling(node: dict[str, Any], key: str) -> None:
    """Forget the value ``node`` holds under the other name of the field ``key`` ends in: a saved
    config.yaml says ``async:``, and ``--set checkpoint.async_save=true`` added a second key for
    one field ("unknown config key 'checkpoint.async_save'")."""

    def is_model(model: Any) -> bool:
        return isinstance(model, type) and issubclass(model, BaseModel)

    model: Any = JobConfig
    *sections, leaf = key.split(".")
    for part in sections:  # None past recipe.* (a dict section) or a key already refused
        field = _field_named(model, part) if is_model(model) else None
        model = _optional_section(field.annotation) if field is not None else None
    if not is_model(model):
        return
    for name, field in model.model_fields.items():
        if field.alias and leaf in (name, field.alias):
            node.pop(field.alias if leaf == name else name, None)


def _parse_value(text: str, annotation: Any) -> Any:
    """Strings stay strings for str fields (``null`` clears an optional one); everything else is
    read as a YAML scalar/list."""
    if _is_plain_str(annotation):
        optional = type(None) in typing.get_args(annotation)
        return None if optional and text.strip() in {"null", "~"} else text
    try:
        return load_yaml_text(text) if text.strip() else None
    except RecursionError:
        raise ConfigError(f"--set value {text[:40]!r}: nested too deeply") from None
    except yaml.YAMLError:
        return text


def _is_plain_str(annotation: Any) -> bool:
    if annotation is str:
        return True
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return all(isinstance(arg, str) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        return len(args) == 1 and _is_plain_str(args[0])
    return False


def first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"]) or "config"
    message = err["msg"].removeprefix("Value error, ")  # our validators' ValueError text
    if err["type"] == "extra_forbidden":
        return f"unknown config key {loc!r}"
    if "input" in err and err["type"] not in {"missing"} and not isinstance(err["input"], dict):
        return f"{loc}: {message} (got {hide_credentials(stable_repr(err['input']))})"
    return f"{loc}: {message}"
