"""The function library the generator uses: ``schemas.json`` entries bound to their Python parts.

``schemas.py`` validates the file; this turns each entry into a ``Spec`` whose draws and result are
callables with the pools bound, and whose answers are templates or answer functions, so the
generator only calls them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpcpipe.data.function_calling.draws import Gen, Pools, draw_function
from hpcpipe.data.function_calling.results import ANSWERS, RESULTS, AnswerFn
from hpcpipe.data.function_calling.schemas import Catalogue, ParamEntry, SpecEntry, phrase_key

BoundResult = Callable[[dict[str, Any], random.Random], dict[str, Any]]  # (arguments, rng) -> response


@dataclass(frozen=True)
class Param:
    name: str
    schema: dict[str, Any]
    gen: Gen
    required: bool = True
    # How a request states an optional value: a template, or one sentence per value (keyed by phrase_key).
    phrase: str | Mapping[str, str] = ""
    # A name, title or item drawn from a list pool that no result looks up: a made-up word may
    # replace it (``data.synthetic_mix.copy_values``), so the model must copy it from the request.
    free_text: bool = False
    # Another parameter's draw reads this one (an "other" or a "derive"): changing this value
    # alone would leave that one inconsistent (a flight to where it starts, a book's old author).
    has_dependents: bool = False
    # Drawn as an amount of money (a "money" draw): a request may write it with a currency sign.
    money: bool = False

    def phrase_for(self, value: Any) -> str:
        return self.phrase if isinstance(self.phrase, str) else self.phrase[phrase_key(value)]


@dataclass(frozen=True, eq=False)  # identity: one library entry is one function
class Spec:
    name: str
    description: str
    domain: str  # distractors and refusals come from other domains, so one function fits a request
    capability: str  # verb phrase: "I can help you <capability>" / "I can't <capability>"
    params: tuple[Param, ...]
    requests: tuple[str, ...]  # every template names every required parameter
    result: BoundResult
    answers: tuple[str | AnswerFn, ...]

    @property
    def rich(self) -> bool:
        """Has an enum or a nested-object argument (``data.synthetic_mix.enum_nested``)."""
        return any(_rich(p.schema) for p in self.params)

    def schema(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "object",
                "properties": {p.name: p.schema for p in self.params},
                "required": [p.name for p in self.params if p.required],
            },
        }


def build_library(catalogue: Catalogue) -> tuple[Spec, ...]:
    return tuple(_spec(entry, catalogue.pools) for entry in catalogue.specs)


def _spec(entry: SpecEntry, pools: Pools) -> Spec:
    result = RESULTS[entry.result].function
    answers: tuple[str | AnswerFn, ...] = (
        (ANSWERS[entry.answer],) if entry.answer is not None else tuple(entry.answers)
    )
    read_by_others = {name for p in entry.params for name in p.draw.earlier_params()}
    return Spec(
        entry.name,
        entry.description,
        entry.domain,
        entry.capability,
        tuple(_param(p, pools, p.name in read_by_others) for p in entry.params),
        tuple(entry.requests),
        lambda args, r: result(args, r, pools),
        answers,
    )


def _param(entry: ParamEntry, pools: Pools, has_dependents: bool) -> Param:
    return Param(
        entry.name,
        entry.json_schema,
        draw_function(entry.draw, pools),
        entry.required,
        entry.phrase,
        _free_text(entry, pools),
        has_dependents,
        entry.draw.money is not None,
    )


def _free_text(entry: ParamEntry, pools: Pools) -> bool:
    """Words picked from a list pool (mapping pools are the ones results look values up in)."""
    schema = entry.json_schema
    item = (schema.get("items") or {}) if schema.get("type") == "array" else schema
    pool = entry.draw.pick if isinstance(entry.draw.pick, str) else (entry.draw.several or (None,))[0]
    return (
        isinstance(pool, str)
        and isinstance(pools.get(pool), list)
        and item.get("type") == "string"
        and "enum" not in item
        # words, not codes: no e-mail addresses, links or flight numbers ("LX 17")
        and all(isinstance(v, str) and not any(c in v for c in "@:/0123456789") for v in pools[pool])
    )


def _rich(schema: Mapping[str, Any]) -> bool:
    if "enum" in schema or schema.get("type") == "object":
        return True
    items = schema.get("items")
    return isinstance(items, Mapping) and _rich(items)
