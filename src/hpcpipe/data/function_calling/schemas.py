"""``schemas.json`` and ``science.json``, the generator's function libraries: their format, and
loading each once, validated. ``schemas.json`` holds 40 everyday functions (weather, flights,
e-mail...); ``science.json`` 24 math, science, finance and statistics ones, drawn only at
``data.synthetic_mix.science`` > 0.

Each file is one object::

    {"about": "...",                        # optional: a note for readers of the file
     "pools": {"cities": {...}, "people": [...], ...},   # named lists, or mappings (keys are drawn)
     "specs": [{                             # one per function
        "name": "get_current_weather", "description": "...",
        "domain": "weather",                 # distractors and refusals come from other domains
        "capability": "check the weather",   # "I can help you <capability>" / "I can't <capability>"
        "params": [{
            "name": "units",
            "schema": {"type": "string", ...},   # the argument's JSON schema, written to rows as is
            "draw": {"pick": ["celsius", "fahrenheit"]},  # how a value is drawn: see draws.py
            "required": false,                   # default true
            "phrase": {"celsius": "...", "fahrenheit": "..."}}],  # optional parameters only
        "requests": ["What's the weather like in {city}?", ...],  # str.format templates
        "result": "weather",                 # a result function of results.py
        "answers": ["Right now it's {temperature} degrees ...", ...]}]}  # or "answer": a function

How a request states an optional value (``phrase``): a template, or a mapping from the value to a
sentence. JSON keys are strings, so a key is the value itself for a string and its JSON text
otherwise (``"true"``, ``"15"``, ``"12.5"``): ``phrase_key`` is that rule. Answer templates are
filled from the arguments and the result together; an answer function gets the same fields.

Refused on load, with one line naming the file, the spec and the key: unknown keys; duplicate
spec or parameter names; a pool, result, answer or derive function that does not exist (pools read
by those functions included); a request template that does not name every required parameter, or
names one the spec lacks; a phrase on a required parameter or none on an optional one; a phrase
mapping without a sentence for a value the parameter's pick can draw; a draw that needs a parameter
not drawn before it.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import string
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError, model_validator
from pydantic_core import ErrorDetails

from hpcpipe.data.function_calling import science_results  # noqa: F401  (registers science.json's results)
from hpcpipe.data.function_calling.draws import Draw
from hpcpipe.data.function_calling.results import ANSWERS, RESULTS
from hpcpipe.errors import DataError, one_line

SHIPPED = "schemas.json"
SCIENCE = "science.json"  # math and science functions, drawn at data.synthetic_mix.science


def phrase_key(value: Any) -> str:
    """The key of ``value`` in a phrase mapping: a string itself, anything else its JSON text."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def template_fields(template: str, key: str) -> set[str]:
    """The names a ``str.format`` template reads (``{item[quantity]}`` reads ``item``).

    ``key`` says where the template is, for the error message.
    """
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{key}: {template!r}: {exc}") from None
    names = {f.split("[")[0].split(".")[0] for f in fields}
    if "" in names:
        raise ValueError(f"{key}: {template!r}: every field needs a name, not {{}}")
    return names


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ParamEntry(_Strict):
    """One parameter of a spec (see the module docstring)."""

    name: StrictStr = Field(min_length=1)
    json_schema: dict[str, Any] = Field(alias="schema")
    draw: Draw
    required: StrictBool = True
    phrase: StrictStr | dict[StrictStr, StrictStr] = ""

    @model_validator(mode="after")
    def _consistent(self) -> ParamEntry:
        if not isinstance(self.json_schema.get("type"), str):
            raise ValueError("schema: needs a 'type'")
        if not isinstance(self.json_schema.get("description"), str):
            raise ValueError("schema: needs a 'description' (clarifying questions quote it)")
        if self.required and self.phrase:
            raise ValueError("phrase: only optional parameters have one (requests state required ones)")
        if not self.required and not self.phrase:
            raise ValueError("phrase: an optional parameter needs one, so a request can state its value")
        if isinstance(self.phrase, dict) and isinstance(self.draw.pick, list):
            missing = [phrase_key(v) for v in self.draw.pick if phrase_key(v) not in self.phrase]
            if missing:
                raise ValueError(f"phrase: no sentence for {', '.join(missing)}")
        return self

    def phrase_templates(self) -> list[str]:
        return [self.phrase] if isinstance(self.phrase, str) else list(self.phrase.values())


class SpecEntry(_Strict):
    """One function of the library (see the module docstring)."""

    name: StrictStr = Field(min_length=1)
    description: StrictStr = Field(min_length=1)
    domain: StrictStr = Field(min_length=1)
    capability: StrictStr = Field(min_length=1)
    params: list[ParamEntry]
    requests: list[StrictStr] = Field(min_length=1)
    result: StrictStr
    answers: list[StrictStr] = Field(default_factory=list)
    answer: StrictStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SpecEntry:
        if self.result not in RESULTS:
            raise ValueError(f"result: unknown result function {self.result!r}{_close(self.result, RESULTS)}")
        if bool(self.answers) == (self.answer is not None):
            raise ValueError("answers: give answer templates ('answers') or an answer function ('answer')")
        if self.answer is not None and self.answer not in ANSWERS:
            raise ValueError(f"answer: unknown answer function {self.answer!r}{_close(self.answer, ANSWERS)}")
        for template in self.answers:
            template_fields(template, "answers")
        self._check_params()
        self._check_requests()
        return self

    def _check_params(self) -> None:
        names = [p.name for p in self.params]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"params: {', '.join(duplicates)} listed twice")
        drawn_always: set[str] = set()
        for param in self.params:
            for earlier in param.draw.earlier_params():
                if earlier not in drawn_always:
                    raise ValueError(
                        f"params.{param.name}.draw: needs the required parameter {earlier!r} listed before it"
                    )
            for template in param.phrase_templates():
                unknown = template_fields(template, f"params.{param.name}.phrase") - set(names)
                if unknown:
                    raise ValueError(f"params.{param.name}.phrase: names no parameter {', '.join(unknown)}")
            if param.required:
                drawn_always.add(param.name)

    def _check_requests(self) -> None:
        names = {p.name for p in self.params}
        required = [p.name for p in self.params if p.required]
        for template in self.requests:
            fields = template_fields(template, "requests")
            missing = [n for n in required if n not in fields]
            if missing:
                raise ValueError(f"requests: {template!r} does not name {', '.join(missing)}")
            if fields - names:
                raise ValueError(f"requests: {template!r} names no parameter {', '.join(fields - names)}")


class Catalogue(_Strict):
    """The whole file: pools and specs."""

    about: StrictStr = ""
    pools: dict[StrictStr, list[Any] | dict[StrictStr, Any]]
    specs: list[SpecEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _references(self) -> Catalogue:
        seen: set[str] = set()
        for spec in self.specs:
            if spec.name in seen:
                raise ValueError(f"spec {spec.name!r}: name: another spec has this name")
            seen.add(spec.name)
            for where, pools in _pools_read(spec):
                for pool in pools:
                    if pool not in self.pools:
                        close = _close(pool, self.pools)
                        raise ValueError(f"spec {spec.name!r}: {where}: no pool {pool!r} in pools{close}")
        return self


def _pools_read(spec: SpecEntry) -> Iterable[tuple[str, list[str]]]:
    """(key, the pools it needs) for each draw and the result function of ``spec``."""
    for param in spec.params:
        derive = f" (derive {param.draw.derive!r})" if param.draw.derive else ""
        yield f"params.{param.name}.draw{derive}", param.draw.pools_read()
    yield f"result {spec.result!r}", list(RESULTS[spec.result].reads)


def _close(name: str, known: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


# -------------------------------------------------------------------------------------------- loading


def load_catalogue(path: Path | None = None, shipped: str = SHIPPED) -> Catalogue:
    """The validated library at ``path``; without one, the shipped file ``shipped`` (read once):
    ``schemas.json`` (everyday functions) or ``science.json`` (math and science ones)."""
    if path is None:
        return _shipped(shipped)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the function library: {exc.strerror}") from None
    return parse_catalogue(text, str(path))


@functools.cache
def _shipped(name: str) -> Catalogue:
    return parse_catalogue(_shipped_text(name), str(resources.files(__package__).joinpath(name)))


@functools.cache
def _shipped_text(name: str) -> str:
    # importlib.resources, not __file__: the file is package data, also inside a wheel or a zip.
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def shipped_digest() -> str:
    """SHA-256 of the shipped libraries' text: prepared rows depend on it (their fingerprint)."""
    digest = hashlib.sha256()
    for name in (SHIPPED, SCIENCE):
        digest.update(_shipped_text(name).encode())
    return digest.hexdigest()


def parse_catalogue(text: str, source: str) -> Catalogue:
    """``text`` validated; DataError with one line naming ``source``, the spec and the key."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise DataError(f"{source}: the top level must be an object with 'pools' and 'specs'")
    try:
        return Catalogue.model_validate(raw)
    except ValidationError as exc:
        raise DataError(one_line(f"{source}: {_first_error(exc, raw)}")) from None


def _first_error(exc: ValidationError, raw: dict[str, Any]) -> str:
    """The first error as "spec 'NAME': params.PARAM.KEY: what is wrong"."""
    errors = exc.errors()
    where = _where(errors[0], raw)
    # A value that fits no member of a union fails once per member: say all of them.
    messages = [_message(e) for e in errors if _where(e, raw) == where]
    return ": ".join(p for p in (*where, ", or ".join(dict.fromkeys(messages))) if p)


def _message(err: ErrorDetails) -> str:
    return "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")


def _where(err: ErrorDetails, raw: dict[str, Any]) -> tuple[str, str]:
    """(spec label, key path) of an error: names, not indices, and no pydantic union-member tags."""
    node: Any = raw
    label = ""
    path: list[str] = []
    for part in err["loc"]:
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            name = node.get("name") if isinstance(node, dict) else None
            if path == ["specs"]:
                label, path = (f"spec {name!r}" if isinstance(name, str) else f"spec #{part + 1}"), []
            else:
                path.append(name if isinstance(name, str) else str(part))
        elif isinstance(node, dict) and part in node:
            node = node[part]
            path.append(str(part))
        elif err["type"] == "missing" and part == err["loc"][-1]:
            path.append(str(part))
        # else: a union member's tag ("list[any]"), not a key of the file
    return label, ".".join(path)
