"""Synthetic Glaive v2 function-calling rows: realistic, varied, and the same for the same seed.

Offline runs and tests need function-calling data without downloading a data set. This writes rows
in the exact Glaive v2 format that ``function_calling.parse_glaive`` reads (so the real data set can
replace them), from libraries of function schemas in many domains: ``schemas.json`` (everyday
functions) and ``science.json`` (math, science, finance and statistics ones, drawn at
``data.synthetic_mix.science``), shipped in this package and validated on load (their format is in
``schemas.py``, how argument values are drawn in ``draws.py``, what the functions return in
``results.py`` and ``science_results.py``).

Conversation shapes, mixed by seed: a single call (call -> ``FUNCTION RESPONSE`` -> an answer that
uses the result), parallel calls (one function on several values, or two functions), parallel
calls of several functions, two requests in one chat, a clarifying question before the call, a
polite refusal when no listed function fits, a general question while functions are listed, and
general chat under the "no access to external functions" system prompt. Each row lists 1-4
functions, the right one(s) among distractors from other domains (so exactly one function fits
each request). User requests state every argument value in words, through several templates per
function, so a model can learn to extract them. How often each shape comes, and the other knobs
(made-up values to copy, conversations that end at the call, namespaced names...), are
``data.synthetic_mix`` (``hpcpipe.config.synthetic.SyntheticMix``).

Glaive v2 rows of these conversations: ``glaive_rows.py``; what they say besides requests and calls
(answers, refusals, thanks): ``phrases.py``; cities in the "City, ST" form a description asks for
(``mix.place_formats``): ``places.py``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.fields import siblings
from hpcpipe.data.function_calling.formats import GLAIVE_NO_FUNCTIONS, GLAIVE_WITH_FUNCTIONS
from hpcpipe.data.function_calling.library import Param, Spec, build_library
from hpcpipe.data.function_calling.phrases import (
    ASK_OPENERS,
    ASKS,
    CONNECTORS,
    GREETINGS,
    NO_ACCESS_REFUSALS,
    PREAMBLES,
    QA,
    REFUSALS,
    RESTATED_REFUSALS,
    RESTATEMENT,
    SAME_FOR,
    THANKS,
    WELCOME,
)
from hpcpipe.data.function_calling.places import PLACE_PARAMS, calls_a_place, with_places
from hpcpipe.data.function_calling.results import join_words
from hpcpipe.data.function_calling.schemas import SCIENCE, load_catalogue

SHAPES = SHAPE_FIELDS
CALL_SHAPES = ("single", "parallel", "parallel_multiple")  # the first assistant turn calls

LIBRARY: tuple[Spec, ...] = build_library(load_catalogue())
SCIENCE_LIBRARY: tuple[Spec, ...] = build_library(load_catalogue(shipped=SCIENCE))
_BY_NAME: dict[str, Spec] = {s.name: s for s in LIBRARY + SCIENCE_LIBRARY}


def _display(value: Any) -> Any:
    """An argument as a request states it: lists in words; numbers and objects stay for ``format``."""
    if isinstance(value, list):
        return join_words([str(v) for v in value])
    return value


# --------------------------------------------------------------------------------------- conversation shapes


@dataclass
class _Draft:
    """A conversation being built: the functions it lists and its messages after the system prompt."""

    listed: list[Spec]
    messages: list[Message]
    system: str = GLAIVE_WITH_FUNCTIONS
    twin: _Draft | None = None  # mix.twins: the same request where no listed function fits
    follow_ups: bool = False  # mix.follow_ups: more requests against the same functions follow


@dataclass
class _Gen:
    """One generator's random stream and mix: every shape draws from both."""

    r: random.Random
    mix: SyntheticMix
    restate: bool = False  # this conversation's replies restate the request first (mix.restate)


def _sample_args(spec: Spec, g: _Gen) -> dict[str, Any]:
    """Every required argument, and optional ones at ``mix.optional_args`` (omitted ones teach defaults)."""
    r, mix = g.r, g.mix
    args: dict[str, Any] = {}
    for p in spec.params:
        if p.required or r.random() < mix.optional_args:
            args[p.name] = _draw(p, g, args)
    return args


def _draw(param: Param, g: _Gen, args: dict[str, Any]) -> Any:
    """One value of ``param``; a free-text one is made up at ``mix.copy_values``."""
    r, value = g.r, param.gen(g.r, args)
    if g.mix.copy_values and param.free_text and r.random() < g.mix.copy_values:
        value = [_made_up(r, v) for v in value] if isinstance(value, list) else _made_up(r, value)
    return value


# Made-up names are 2-3 of these (copy_values).
_SYLLABLES: tuple[str, ...] = ("ka", "lo", "mer", "vi", "dun", "sa", "tor", "el", "qui", "ban", "ro")
_SYLLABLES += ("zen", "fa", "li", "mo", "ther")


def _made_up(r: random.Random, like: str) -> str:
    """A made-up name with as many words as ``like`` (at most 3), capitalised as it is."""
    words = ["".join(r.choice(_SYLLABLES) for _ in range(r.randint(2, 3))) for _ in like.split()[:3]]
    text = " ".join(words) or "".join(r.choice(_SYLLABLES) for _ in range(3))
    return text.title() if like[:1].isupper() else text


def _request(spec: Spec, args: dict[str, Any], g: _Gen, said: Mapping[str, str] | None = None) -> str:
    """A user request stating every argument value: a template plus one sentence per optional value.
    ``said`` replaces how some values are worded ("Lima, Oslo and Cairo" for one city)."""
    r = g.r
    ctx = {k: _display(v) for k, v in args.items()}
    if g.mix.written_numbers:  # no draw at 0: older mixes keep their rows
        ctx |= {p.name: _written(args[p.name], p, spec, g) for p in spec.params if p.name in args}
    ctx |= dict(said or {})
    parts = [r.choice(spec.requests).format(**ctx)]
    for p in spec.params:
        if not p.required and p.name in args:
            parts.append(p.phrase_for(args[p.name]).format(**ctx))
    return " ".join(parts)


def _written(value: Any, param: Param, spec: Spec, g: _Gen) -> Any:
    """A number as people type it, at ``mix.written_numbers``: 125,000; $89.90 for an amount of
    money when the function takes no currency. The call keeps the plain number."""
    r = g.r
    if isinstance(value, bool) or not isinstance(value, int | float) or r.random() >= g.mix.written_numbers:
        return _display(value)
    text = f"{value:,}" if abs(value) >= 1000 else str(value)
    if param.money and not any("currency" in p.name for p in spec.params):
        cents = isinstance(value, float) and not value.is_integer()
        text = r.choice("$€£") + (f"{value:,.2f}" if cents else text)
    return text


def _answer(spec: Spec, args: dict[str, Any], result: dict[str, Any], r: random.Random) -> str:
    ctx = {**{k: _display(v) for k, v in args.items()}, **result}
    answer = r.choice(spec.answers)
    return answer(ctx) if callable(answer) else answer.format(**ctx)


def _result_text(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False)


def _combine(first: str, second: str, r: random.Random) -> str:
    """Two requests in one message; the second starts lower-case unless it starts with "I"."""
    if not (second.startswith("I ") or second.startswith("I'")):
        second = second[0].lower() + second[1:]
    return f"{first} {r.choice(CONNECTORS)}{second}"


def _call_turns(spec: Spec, g: _Gen, user: str | None = None) -> list[Message]:
    """request -> call -> FUNCTION RESPONSE -> answer; ``user`` replaces the drawn request text."""
    r = g.r
    args = _sample_args(spec, g)
    result = spec.result(args, r)
    preamble = r.choice(PREAMBLES) if r.random() < 0.2 else ""
    return [
        Message("user", user if user is not None else _request(spec, args, g)),
        Message("assistant", preamble, (ToolCall(spec.name, args),)),
        Message("tool", _result_text(result)),
        Message("assistant", _answer(spec, args, result, r)),
    ]


def _pick(g: _Gen, count: int, exclude: Collection[str] = ()) -> list[Spec]:
    """``count`` functions from different domains, none in ``exclude``."""
    chosen: list[Spec] = []
    domains = set(exclude)
    for spec in _shuffled(g):
        if len(chosen) == count:
            break
        if spec.domain not in domains:
            chosen.append(spec)
            domains.add(spec.domain)
    return chosen


def _library(g: _Gen) -> tuple[Spec, ...]:
    """The functions drawn from: the everyday ones, and the math and science ones at ``mix.science``."""
    return LIBRARY + SCIENCE_LIBRARY if g.mix.science else LIBRARY


def _shuffled(g: _Gen) -> list[Spec]:
    """The library in random order; functions with enum or nested arguments come first
    ``mix.enum_nested`` times as often, math and science ones ``mix.science`` times as often,
    functions taking a city ``mix.place_functions`` times as often (a weighted shuffle: sort by
    u ** (1 / weight))."""
    library, mix = _library(g), g.mix
    if mix.enum_nested == 1 and not mix.science and mix.place_functions == 1:
        return g.r.sample(library, len(library))
    draw = g.r.random
    keys = [draw() ** exponent for exponent in _exponents(mix.enum_nested, mix.science, mix.place_functions)]
    return [library[i] for i in sorted(range(len(library)), key=keys.__getitem__, reverse=True)]


@cache
def _exponents(enum_nested: float, science: float, place_functions: float) -> tuple[float, ...]:
    """``1 / weight`` of each library function (in ``_library``'s order) for ``_shuffled``, worked
    out once per mix: every conversation shuffles the library at least once."""
    library = LIBRARY + SCIENCE_LIBRARY if science else LIBRARY
    weights = (
        (enum_nested if s.rich else 1.0)
        * (science if s in SCIENCE_LIBRARY else 1.0)
        * (place_functions if s.name in PLACE_PARAMS else 1.0)
        for s in library
    )
    return tuple(1 / w for w in weights)


def _with_distractors(needed: list[Spec], g: _Gen, most: int = 4) -> list[Spec]:
    """``needed`` plus distractors from other domains, 1-``most`` functions in all, shuffled; at
    ``mix.close_distractors`` one of them is of a needed function's field."""
    r, mix = g.r, g.mix
    unique = list(dict.fromkeys(needed))
    total = r.randint(len(unique), max(len(unique), most))
    if mix.close_distractors and r.random() < mix.close_distractors:  # no draw at 0
        domains = {s.domain for s in unique}
        kin = [s for spec in unique for s in siblings(spec, _library(g)) if s.domain not in domains]
        if kin:
            unique.append(r.choice(kin))
            total = max(total, len(unique))
    listed = unique + _pick(g, total - len(unique), {s.domain for s in unique})
    r.shuffle(listed)
    return listed


def _single(g: _Gen) -> _Draft:
    (spec,) = _pick(g, 1)
    draft = _Draft(_with_distractors([spec], g), _call_turns(spec, g))
    if g.mix.twins and g.r.random() < g.mix.twins:  # no draw at 0: older mixes keep their rows
        draft.twin = _twin(spec, draft, g)
    return draft


def _twin(spec: Spec, draft: _Draft, g: _Gen) -> _Draft:
    """The same request with ``spec`` swapped for a function of its own library (everyday or
    science) from another domain: now nothing listed fits, and the reply declines. Only whether
    the matching function is listed tells the pair apart."""
    r = g.r
    domains = {s.domain for s in draft.listed}
    own = SCIENCE_LIBRARY if spec in SCIENCE_LIBRARY else LIBRARY
    sibling = r.choice([s for s in own if s.domain not in domains])
    listed = [sibling if s is spec else s for s in draft.listed]
    return _Draft(listed, [draft.messages[0], _refusal_reply(spec, listed, g)])


def _distinct_args(spec: Spec, g: _Gen, taken: list[dict[str, Any]]) -> dict[str, Any]:
    """Arguments for another call of ``spec``: a second call must ask something else."""
    args = _sample_args(spec, g)
    for _ in range(10):
        if args not in taken:
            break
        args = _sample_args(spec, g)
    return args


def _calls_turns(specs: list[Spec], g: _Gen) -> list[Message]:
    """One request per call in one message -> the calls in one turn -> a response each -> one answer."""
    r = g.r
    args: list[dict[str, Any]] = []
    for i, spec in enumerate(specs):
        taken = [a for s, a in zip(specs[:i], args, strict=True) if s is spec]
        args.append(_distinct_args(spec, g, taken) if taken else _sample_args(spec, g))
    results = [spec.result(a, r) for spec, a in zip(specs, args, strict=True)]
    user = _request(specs[0], args[0], g)
    for spec, a in zip(specs[1:], args[1:], strict=True):
        user = _combine(user, _request(spec, a, g), r)
    return _turns_of_calls(specs, args, results, user, r)


def _compact_turns(spec: Spec, count: int, g: _Gen) -> list[Message] | None:
    """``count`` calls of ``spec`` that differ in one required value, asked in few words: the
    first request in full, then "Do the same for B and C.", or (at ``mix.inline_lists``) one
    request naming every value ("What's the weather in A, B and C?"). None when no value can vary."""
    r, mix = g.r, g.mix
    first = _sample_args(spec, g)
    said_alone = (str, int, float)  # a list, an object or a yes/no does not read alone
    varies = [
        p for p in spec.params if p.required and not p.has_dependents and type(first[p.name]) in said_alone
    ]
    for param in varies:
        values = [first[param.name]]
        for _ in range(10 * count):
            if len(values) == count:
                break
            if (value := _draw(param, g, first)) not in values:
                values.append(value)
        if len(values) < count:
            continue
        args = [{**first, param.name: value} for value in values]
        results = [spec.result(a, r) for a in args]
        if mix.inline_lists and r.random() < mix.inline_lists:  # no draw at 0: older mixes keep their rows
            user = _request(spec, first, g, {param.name: join_words([str(_display(v)) for v in values])})
        else:
            said = join_words([str(_display(v)) for v in values[1:]])
            user = f"{_request(spec, first, g)} {r.choice(SAME_FOR).format(values=said)}"
        return _turns_of_calls([spec] * count, args, results, user, r)
    return None


def _turns_of_calls(
    specs: list[Spec], args: list[dict[str, Any]], results: list[dict[str, Any]], user: str, r: random.Random
) -> list[Message]:
    calls = tuple(ToolCall(spec.name, a) for spec, a in zip(specs, args, strict=True))
    preamble = r.choice(PREAMBLES) if r.random() < 0.2 else ""
    answers = [_answer(spec, a, res, r) for spec, a, res in zip(specs, args, results, strict=True)]
    return [
        Message("user", user),
        Message("assistant", preamble, calls),
        *(Message("tool", _result_text(res)) for res in results),
        Message("assistant", " ".join(answers)),
    ]


def _parallel(g: _Gen) -> _Draft:
    """Calls in one assistant turn: one function on 2..max_parallel_calls values, or two functions."""
    r, mix = g.r, g.mix
    first = _pick(g, 1)[0]
    if r.random() < mix.same_function_parallel:
        count = 2 if mix.max_parallel_calls == 2 else r.randint(2, mix.max_parallel_calls)
        specs = [first] * count
        wanted = bool(mix.compact_parallel) and r.random() < mix.compact_parallel  # no draw at 0
        compact = _compact_turns(first, count, g) if wanted else None
        if compact is not None:
            return _Draft(_with_distractors(specs, g), compact)
    else:
        specs = [first, _pick(g, 1, {first.domain})[0]]
    messages = _calls_turns(specs, g)
    return _Draft(_with_distractors(specs, g), messages)


def _parallel_multiple(g: _Gen) -> _Draft:
    """Two or three different functions in one turn, the first of them called twice."""
    specs = _pick(g, g.r.randint(2, 3))
    messages = _calls_turns([specs[0], *specs], g)
    return _Draft(_with_distractors(specs, g), messages)


def _multi_turn(g: _Gen) -> _Draft:
    """Two requests in turn: two calls (same or another listed function), or a call then a refusal."""
    r = g.r
    first = _pick(g, 1)[0]
    if r.random() < 0.2:
        listed = _with_distractors([first], g, most=3)
        out = _pick(g, 1, {s.domain for s in listed})[0]
        return _Draft(listed, _call_turns(first, g) + _refusal_turns(out, listed, g))
    second = first if r.random() < 0.4 else _pick(g, 1, {first.domain})[0]
    return _Draft(_with_distractors([first, second], g), _call_turns(first, g) + _call_turns(second, g))


def _clarify(g: _Gen) -> _Draft:
    """The user asks without details; the assistant asks for the required values, then calls."""
    r = g.r
    spec = _pick(g, 1)[0]
    needs = join_words([_ask(p) for p in spec.params if p.required])
    messages = [
        Message("user", r.choice(ASK_OPENERS).format(cap=spec.capability)),
        Message("assistant", r.choice(ASKS).format(needs=needs)),
        *_call_turns(spec, g),
    ]
    return _Draft(_with_distractors([spec], g), messages)


def _ask(param: Param) -> str:
    desc = param.schema["description"].split(";")[0].split(", e.g.")[0]
    return desc[0].lower() + desc[1:] if desc.startswith("The ") else desc


def _refusal_turns(out: Spec, listed: list[Spec], g: _Gen) -> list[Message]:
    return [Message("user", _request(out, _sample_args(out, g), g)), _refusal_reply(out, listed, g)]


def _refusal_reply(out: Spec, listed: list[Spec], g: _Gen) -> Message:
    """Declining a request for ``out``: what was asked and what the listed functions can do."""
    r = g.r
    if g.restate:
        return Message("assistant", f"{_restatement([out], listed)} {r.choice(RESTATED_REFUSALS)}")
    listed_caps = join_words([s.capability for s in listed], "or")
    return Message("assistant", r.choice(REFUSALS).format(cap=out.capability, listed=listed_caps))


def _restatement(wanted: Sequence[Spec], listed: Sequence[Spec]) -> str:
    """What the user wants and what the listed functions can do, before the reply decides."""
    need = join_words(list(dict.fromkeys(s.capability for s in wanted)))
    can = join_words([s.capability for s in listed], "or")
    return RESTATEMENT.format(need=need, s="s" if len(listed) > 1 else "", listed=can)


def _restated_calls(messages: list[Message], listed: Sequence[Spec]) -> list[Message]:
    """Each reply that calls functions opens with the restatement instead of a preamble."""
    return [
        replace(m, content=_restatement([_BY_NAME[c.name] for c in m.tool_calls], listed))
        if m.tool_calls
        else m
        for m in messages
    ]


FOLLOW_UP_SHAPES = ("single", "refusal")  # one request, one decision: more can follow


def _follow_ups(listed: list[Spec], g: _Gen) -> list[Message]:
    """One to three more requests against ``listed``: each served by one of them (a call, its
    result and the answer) or by none (a refusal), in the mix's proportion of single to refusal."""
    r, mix = g.r, g.mix
    calls = mix.single / (mix.single + mix.refusal)  # > 0: a follow-up shape has a weight
    messages: list[Message] = []
    for _ in range(r.randint(1, 3)):
        if r.random() < calls:
            messages += _call_turns(r.choice(listed), g)
        else:
            out = _near_miss(listed, g, swap=False) or _pick(g, 1, {s.domain for s in listed})[0]
            messages += _refusal_turns(out, listed, g)
    return messages


def _refusal(g: _Gen) -> _Draft:
    """A request no listed function can serve: a polite no, naming what the functions can do."""
    listed = _pick(g, g.r.randint(1, 3))
    out = _near_miss(listed, g) or _pick(g, 1, {s.domain for s in listed})[0]
    return _Draft(listed, _refusal_turns(out, listed, g))


def _near_miss(listed: list[Spec], g: _Gen, swap: bool = True) -> Spec | None:
    """At ``mix.near_misses``, a request to decline beside ``listed``: a function of a listed one's
    field, from a domain none of them has. When no listed function has a field, ``swap`` replaces
    one by a function that has (only before any turn used ``listed``)."""
    r, mix = g.r, g.mix
    if not mix.near_misses or r.random() >= mix.near_misses:  # no draw at 0
        return None
    library = _library(g)
    if swap and not any(siblings(s, library) for s in listed):
        taken = {s.domain for s in listed}
        close = next((s for s in _shuffled(g) if s.domain not in taken and siblings(s, library)), None)
        if close is not None:
            listed[r.randrange(len(listed))] = close
    domains = {s.domain for s in listed}
    kin = [k for s in listed for k in siblings(s, library) if k.domain not in domains]
    return r.choice(kin) if kin else None


def _chat(r: random.Random) -> list[Message]:
    """One or two general questions and their answers."""
    pairs = r.sample(QA, 2 if r.random() < 0.3 else 1)
    return [m for q, a in pairs for m in (Message("user", r.choice(GREETINGS) + q), Message("assistant", a))]


def _irrelevant(g: _Gen) -> _Draft:
    """Functions are listed, but the user asks a general question: a plain answer, no call."""
    return _Draft(_pick(g, g.r.randint(1, 4)), _chat(g.r))


def _no_access(g: _Gen) -> _Draft:
    """The "no access to external functions" prompt: general chat, or declining an action."""
    r = g.r
    if r.random() < 0.35:
        spec = r.choice(_library(g))
        messages = [
            Message("user", _request(spec, _sample_args(spec, g), g)),
            Message("assistant", r.choice(NO_ACCESS_REFUSALS).format(cap=spec.capability)),
        ]
    else:
        messages = _chat(r)
    return _Draft([], messages, GLAIVE_NO_FUNCTIONS)


_BUILDERS: dict[str, Callable[[_Gen], _Draft]] = {
    "single": _single,
    "parallel": _parallel,
    "multi_turn": _multi_turn,
    "clarify": _clarify,
    "refusal": _refusal,
    "no_access": _no_access,
    "parallel_multiple": _parallel_multiple,
    "irrelevant": _irrelevant,
}


def _conversations(g: _Gen) -> list[Conversation]:
    """One drawn conversation, followed by its twin when it has one."""
    r, mix = g.r, g.mix
    shape = r.choices(SHAPES, weights=mix.shape_weights())[0]
    g.restate = bool(mix.restate) and r.random() < mix.restate  # no draw at 0: older mixes keep their rows
    draft = _BUILDERS[shape](g)
    if shape in FOLLOW_UP_SHAPES and mix.follow_ups and r.random() < mix.follow_ups:  # no draw at 0
        draft.messages += _follow_ups(draft.listed, g)
        draft.follow_ups = True
    if g.restate and draft.listed:
        draft.messages = _restated_calls(draft.messages, draft.listed)
    first = _finish(draft, shape, g)
    return [first] if draft.twin is None else [first, _finish(draft.twin, "refusal", g)]


def _finish(draft: _Draft, shape: str, g: _Gen) -> Conversation:
    """A draft as a conversation: cut at the call (call_only), a closing thanks, places in
    "City, Region" form (place_formats), namespaced names."""
    r, mix = g.r, g.mix
    calls_last = shape in CALL_SHAPES or (draft.follow_ups and _last_reply_calls(draft.messages))
    if calls_last and mix.call_only and r.random() < mix.call_only:
        # end at the last request's call: without follow-ups, [user, assistant with its calls]
        last_user = max(i for i, m in enumerate(draft.messages) if m.role == "user")
        del draft.messages[last_user + 2 :]
    elif draft.listed and draft.messages[-1].role == "assistant" and r.random() < 0.2:
        draft.messages += [Message("user", r.choice(THANKS)), Message("assistant", r.choice(WELCOME))]
    messages = (Message("system", draft.system), *draft.messages)
    conv = Conversation(messages, tuple(s.schema() for s in draft.listed))
    if mix.place_formats and calls_a_place(conv) and r.random() < mix.place_formats:  # no draw at 0
        conv = with_places(conv, r)
    if draft.listed and mix.dotted_names and r.random() < mix.dotted_names:
        return _namespaced(conv, _dotted(draft.listed, g))
    return conv


def _last_reply_calls(messages: list[Message]) -> bool:
    """Whether the reply to the last request calls functions (rather than declining)."""
    last_user = max(i for i, m in enumerate(messages) if m.role == "user")
    return bool(messages[last_user + 1].tool_calls)


def _dotted(listed: list[Spec], g: _Gen) -> dict[str, str]:
    """Each function's dotted name: its domain ("weather.current_weather_report"), or at
    ``mix.api_namespaces`` one made-up API name for them all ("KaloMer.current_weather_report")."""
    r, mix = g.r, g.mix
    if mix.api_namespaces and r.random() < mix.api_namespaces:  # no draw at 0: older mixes keep their rows
        words = [_made_up(r, "Api") for _ in range(r.randint(1, 2))]
        api = "_".join(w.upper() for w in words) if r.random() < 0.3 else "".join(words)
        return {s.name: f"{api}.{s.name}" for s in listed}
    return {s.name: f"{s.domain}.{s.name}" for s in listed}


def _namespaced(conv: Conversation, names: Mapping[str, str]) -> Conversation:
    """The same conversation with its functions renamed (schemas and calls alike)."""
    tools = tuple({**t, "name": names[t["name"]]} for t in conv.tools)
    messages = tuple(
        replace(m, tool_calls=tuple(replace(c, name=names[c.name]) for c in m.tool_calls))
        for m in conv.messages
    )
    return Conversation(messages, tools)


# ---------------------------------------------------------------------------------------------- public API


def generate_conversations(n: int, seed: int, mix: SyntheticMix | None = None) -> list[Conversation]:
    """``n`` conversations of ``mix`` (default: ``SyntheticMix()``); the same ``seed`` and mix give
    the same list, and a longer list extends a shorter one."""
    g = _Gen(random.Random(seed), mix or SyntheticMix())
    out: list[Conversation] = []
    while len(out) < n:
        out += _conversations(g)
    return out[:n]
