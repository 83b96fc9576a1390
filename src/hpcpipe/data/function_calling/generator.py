"""Synthetic Glaive v2 function-calling rows: realistic, varied, and the same for the same seed.

Offline runs and tests need function-calling data without downloading a data set. This writes rows
in the exact Glaive v2 format that ``function_calling.parse_glaive`` reads (so the real data set can
replace them), from a library of function schemas in many domains: ``schemas.json``, shipped in
this package and validated on load (its format is in ``schemas.py``, how argument values are drawn
in ``draws.py``, what the functions return in ``results.py``).

Conversation shapes, mixed by seed: a single call (call -> ``FUNCTION RESPONSE`` -> an answer that
uses the result), parallel calls, two requests in one chat, a clarifying question before the call,
a polite refusal when no listed function fits, and general chat under the "no access to external
functions" system prompt. Each row lists 1-4 functions, the right one(s) among distractors from
other domains (so exactly one function fits each request). User requests state every argument
value in words, through several templates per function, so a model can learn to extract them.

Parallel calls: Glaive v2 has one call per assistant turn, so hpcpipe writes two ``<functioncall>``
lines in one assistant turn, followed by one ``FUNCTION RESPONSE`` turn per call, in call order;
``parse_glaive`` returns them as the ``tool_calls`` of one message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.formats import (
    GLAIVE_CALL,
    GLAIVE_END,
    GLAIVE_NO_FUNCTIONS,
    GLAIVE_WITH_FUNCTIONS,
)
from hpcpipe.data.function_calling.library import Param, Spec, build_library
from hpcpipe.data.function_calling.results import join_words
from hpcpipe.data.function_calling.schemas import load_catalogue

SHAPES = ("single", "parallel", "multi_turn", "clarify", "refusal", "no_access")
_SHAPE_WEIGHTS = (30, 12, 14, 10, 17, 17)

LIBRARY: tuple[Spec, ...] = build_library(load_catalogue())


def _display(value: Any) -> Any:
    """An argument as a request states it: lists in words; numbers and objects stay for ``format``."""
    if isinstance(value, list):
        return join_words([str(v) for v in value])
    return value


# ------------------------------------------------------------------------------------ chat without functions

_QA = (
    (
        "What's the capital of Switzerland?",
        "The capital of Switzerland is Bern, although Zürich is its largest city.",
    ),
    (
        "Can you explain what photosynthesis is?",
        "Photosynthesis is how plants turn sunlight, water and carbon dioxide into glucose and oxygen. It "
        "happens mostly in the chloroplasts of leaf cells.",
    ),
    (
        "Who wrote 'One Hundred Years of Solitude'?",
        "'One Hundred Years of Solitude' was written by Gabriel García Márquez and published in 1967.",
    ),
    (
        "How do you say 'thank you' in Japanese?",
        "'Thank you' in Japanese is ありがとう (arigatō). A more polite form is ありがとうございます.",
    ),
    (
        "What does 'déjà vu' mean?",
        "'Déjà vu' is French for 'already seen': the feeling that you've lived the present moment before.",
    ),
    (
        "How many continents are there?",
        "There are seven: Africa, Antarctica, Asia, Australia, Europe, North America and South America.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters much more than red (Rayleigh "
        "scattering), so the sky looks blue.",
    ),
    (
        "Who painted the Mona Lisa?",
        "Leonardo da Vinci painted the Mona Lisa in the early 1500s. It hangs in the Louvre in Paris.",
    ),
    ("What's the square root of 144?", "The square root of 144 is 12."),
    ("What's the tallest mountain in the world?", "Mount Everest, at 8,849 metres above sea level."),
    (
        "What's the plural of 'cactus'?",
        "Both 'cacti' and 'cactuses' are correct; 'cacti' is more common in writing.",
    ),
    (
        "Can you suggest a name for my new puppy?",
        "How about Biscuit, Luna, Miso or Pepper? Pick one that suits your puppy's personality!",
    ),
    ("How long does sunlight take to reach Earth?", "About 8 minutes and 20 seconds."),
    (
        "What's the difference between weather and climate?",
        "Weather is what the atmosphere does on a given day; climate is the average of that weather over "
        "decades.",
    ),
    ("Give me a synonym for 'happy'.", "Some synonyms for 'happy' are cheerful, joyful, content and glad."),
    (
        "Can you write a haiku about autumn?",
        "Crisp leaves drift and fall,\nthe maple's last red whisper —\nwind carries it home.",
    ),
)
_PREAMBLES = ("Sure, one moment.", "Sure! Let me do that.", "On it.", "Okay, just a second.")
_GREETINGS = ("", "", "Hi! ", "Hey, ", "Quick question: ", "Hello! ")
_THANKS = ("Thanks!", "Thank you, that's really helpful.", "Great, thanks a lot!", "Perfect, merci!")
_WELCOME = (
    "You're welcome! Let me know if there's anything else I can do.",
    "Happy to help! Anything else?",
    "My pleasure — just ask if you need anything else.",
)
_CONNECTORS = ("Also, ", "And ", "In addition, ", "Oh, and ")
_ASK_OPENERS = (
    "Can you help me {cap}?",
    "I need to {cap}.",
    "Hi, I'd like to {cap}.",
    "Could you {cap} for me?",
)
_ASKS = ("Of course! Could you tell me {needs}?", "Sure, I can help with that. Please give me {needs}.")
_REFUSALS = (
    "I'm sorry, but I can't {cap} — that's outside the functions I have. I can help you {listed} if you'd "
    "like.",
    "Unfortunately I'm not able to {cap}. My available functions only let me {listed}.",
    "I'm afraid I don't have a function to {cap}. I can, however, {listed}.",
)
_NO_ACCESS_REFUSALS = (
    "I'm sorry, but I can't {cap} because I don't have access to external functions or services. I'm happy "
    "to help with general questions, though.",
    "Unfortunately, I'm not able to {cap} — I have no access to external tools. Is there anything else I "
    "can help you with?",
)


# --------------------------------------------------------------------------------------- conversation shapes


@dataclass
class _Draft:
    """A conversation being built: the functions it lists and its messages after the system prompt."""

    listed: list[Spec]
    messages: list[Message]
    system: str = GLAIVE_WITH_FUNCTIONS


def _sample_args(spec: Spec, r: random.Random) -> dict[str, Any]:
    """Every required argument, and each optional one half the time (omitted ones teach defaults)."""
    args: dict[str, Any] = {}
    for p in spec.params:
        if p.required or r.random() < 0.5:
            args[p.name] = p.gen(r, args)
    return args


def _request(spec: Spec, args: dict[str, Any], r: random.Random) -> str:
    """A user request stating every argument value: a template plus one sentence per optional value."""
    ctx = {k: _display(v) for k, v in args.items()}
    parts = [r.choice(spec.requests).format(**ctx)]
    for p in spec.params:
        if not p.required and p.name in args:
            parts.append(p.phrase_for(args[p.name]).format(**ctx))
    return " ".join(parts)


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
    return f"{first} {r.choice(_CONNECTORS)}{second}"


def _call_turns(spec: Spec, r: random.Random, user: str | None = None) -> list[Message]:
    """request -> call -> FUNCTION RESPONSE -> answer; ``user`` replaces the drawn request text."""
    args = _sample_args(spec, r)
    result = spec.result(args, r)
    preamble = r.choice(_PREAMBLES) if r.random() < 0.2 else ""
    return [
        Message("user", user if user is not None else _request(spec, args, r)),
        Message("assistant", preamble, (ToolCall(spec.name, args),)),
        Message("tool", _result_text(result)),
        Message("assistant", _answer(spec, args, result, r)),
    ]


def _pick(r: random.Random, count: int, exclude: Collection[str] = ()) -> list[Spec]:
    """``count`` functions from different domains, none in ``exclude``."""
    chosen: list[Spec] = []
    domains = set(exclude)
    for spec in r.sample(LIBRARY, len(LIBRARY)):
        if len(chosen) == count:
            break
        if spec.domain not in domains:
            chosen.append(spec)
            domains.add(spec.domain)
    return chosen


def _with_distractors(needed: list[Spec], r: random.Random, most: int = 4) -> list[Spec]:
    """``needed`` plus distractors from other domains, 1-``most`` functions in all, shuffled."""
    unique = list(dict.fromkeys(needed))
    total = r.randint(len(unique), max(len(unique), most))
    listed = unique + _pick(r, total - len(unique), {s.domain for s in unique})
    r.shuffle(listed)
    return listed


def _single(r: random.Random) -> _Draft:
    (spec,) = _pick(r, 1)
    return _Draft(_with_distractors([spec], r), _call_turns(spec, r))


def _parallel(r: random.Random) -> _Draft:
    """Two calls in one assistant turn: the same function twice (two cities) or two functions."""
    first = _pick(r, 1)[0]
    second = first if r.random() < 0.4 else _pick(r, 1, {first.domain})[0]
    args1 = _sample_args(first, r)
    args2 = _sample_args(second, r)
    for _ in range(10):  # the same function twice must be asked two different things
        if second is not first or args2 != args1:
            break
        args2 = _sample_args(second, r)
    res1, res2 = first.result(args1, r), second.result(args2, r)
    calls = (ToolCall(first.name, args1), ToolCall(second.name, args2))
    messages = [
        Message("user", _combine(_request(first, args1, r), _request(second, args2, r), r)),
        Message("assistant", r.choice(_PREAMBLES) if r.random() < 0.2 else "", calls),
        Message("tool", _result_text(res1)),
        Message("tool", _result_text(res2)),
        Message("assistant", f"{_answer(first, args1, res1, r)} {_answer(second, args2, res2, r)}"),
    ]
    return _Draft(_with_distractors([first, second], r), messages)


def _multi_turn(r: random.Random) -> _Draft:
    """Two requests in turn: two calls (same or another listed function), or a call then a refusal."""
    first = _pick(r, 1)[0]
    if r.random() < 0.2:
        listed = _with_distractors([first], r, most=3)
        out = _pick(r, 1, {s.domain for s in listed})[0]
        return _Draft(listed, _call_turns(first, r) + _refusal_turns(out, listed, r))
    second = first if r.random() < 0.4 else _pick(r, 1, {first.domain})[0]
    return _Draft(_with_distractors([first, second], r), _call_turns(first, r) + _call_turns(second, r))


def _clarify(r: random.Random) -> _Draft:
    """The user asks without details; the assistant asks for the required values, then calls."""
    spec = _pick(r, 1)[0]
    needs = join_words([_ask(p) for p in spec.params if p.required])
    messages = [
        Message("user", r.choice(_ASK_OPENERS).format(cap=spec.capability)),
        Message("assistant", r.choice(_ASKS).format(needs=needs)),
        *_call_turns(spec, r),
    ]
    return _Draft(_with_distractors([spec], r), messages)


def _ask(param: Param) -> str:
    desc = param.schema["description"].split(";")[0].split(", e.g.")[0]
    return desc[0].lower() + desc[1:] if desc.startswith("The ") else desc


def _refusal_turns(out: Spec, listed: list[Spec], r: random.Random) -> list[Message]:
    listed_caps = join_words([s.capability for s in listed], "or")
    return [
        Message("user", _request(out, _sample_args(out, r), r)),
        Message("assistant", r.choice(_REFUSALS).format(cap=out.capability, listed=listed_caps)),
    ]


def _refusal(r: random.Random) -> _Draft:
    """A request no listed function can serve: a polite no, naming what the functions can do."""
    listed = _pick(r, r.randint(1, 3))
    out = _pick(r, 1, {s.domain for s in listed})[0]
    return _Draft(listed, _refusal_turns(out, listed, r))


def _no_access(r: random.Random) -> _Draft:
    """The "no access to external functions" prompt: general chat, or declining an action."""
    if r.random() < 0.35:
        spec = r.choice(LIBRARY)
        messages = [
            Message("user", _request(spec, _sample_args(spec, r), r)),
            Message("assistant", r.choice(_NO_ACCESS_REFUSALS).format(cap=spec.capability)),
        ]
    else:
        pairs = r.sample(_QA, 2 if r.random() < 0.3 else 1)
        messages = [
            m for q, a in pairs for m in (Message("user", r.choice(_GREETINGS) + q), Message("assistant", a))
        ]
    return _Draft([], messages, GLAIVE_NO_FUNCTIONS)


_BUILDERS: dict[str, Callable[[random.Random], _Draft]] = {
    "single": _single,
    "parallel": _parallel,
    "multi_turn": _multi_turn,
    "clarify": _clarify,
    "refusal": _refusal,
    "no_access": _no_access,
}


def _conversation(r: random.Random) -> Conversation:
    draft = _BUILDERS[r.choices(SHAPES, weights=_SHAPE_WEIGHTS)[0]](r)
    if draft.listed and draft.messages[-1].role == "assistant" and r.random() < 0.2:
        draft.messages += [Message("user", r.choice(_THANKS)), Message("assistant", r.choice(_WELCOME))]
    messages = (Message("system", draft.system), *draft.messages)
    return Conversation(messages, tuple(s.schema() for s in draft.listed))


# ---------------------------------------------------------------------------------------------- public API


def generate_conversations(n: int, seed: int) -> list[Conversation]:
    """``n`` conversations; the same ``seed`` gives the same list, and a longer list extends a shorter one."""
    r = random.Random(seed)
    return [_conversation(r) for _ in range(n)]


def to_glaive(conv: Conversation, rng: random.Random | None = None) -> dict[str, str]:
    """``conv`` as a Glaive v2 row. With ``rng``, ~15% of calls write their arguments as a plain object."""
    system = next((m.content for m in conv.messages if m.role == "system"), "")
    head = f"SYSTEM: {system}"
    if conv.tools:
        head += "\n" + "\n\n".join(json.dumps(t, indent=4, ensure_ascii=False) for t in conv.tools)
    turns = [_glaive_turn(m, rng) for m in conv.messages if m.role != "system"]
    return {"system": head + "\n\n", "chat": "".join(t + "\n\n\n" for t in turns)}


def _glaive_turn(message: Message, rng: random.Random | None) -> str:
    if message.role == "user":
        return f"USER: {message.content}"
    if message.role == "tool":
        return f"FUNCTION RESPONSE: {message.content}"
    calls = [f"{GLAIVE_CALL} {_glaive_call(c, rng)}" for c in message.tool_calls]
    # Text before the first call, parallel calls one per line, one end marker for the whole turn.
    body = " ".join(p for p in (message.content, "\n".join(calls)) if p)
    return f"ASSISTANT: {body} {GLAIVE_END}"


def _glaive_call(call: ToolCall, rng: random.Random | None) -> str:
    """Glaive's call object: arguments as single-quoted JSON text (apostrophes inside left as they are)."""
    args = json.dumps(call.arguments, ensure_ascii=False)
    as_object = rng is not None and rng.random() < 0.15
    # Glaive quotes the arguments string in single quotes and escapes nothing inside it.
    quoted = args if as_object else f"'{args}'"
    return f'{{"name": {json.dumps(call.name, ensure_ascii=False)}, "arguments": {quoted}}}'


def generate_glaive_rows(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` Glaive v2 rows (``{"system", "chat"}``).

    ``parse_glaive(rows[i]) == generate_conversations(n, seed)[i]``: the rows add only the Glaive
    spelling of calls (a separate random stream picks quoted or object arguments).
    """
    style = random.Random(f"glaive-style:{seed}")  # how calls are quoted: apart from what is said
    return [to_glaive(conv, style) for conv in generate_conversations(n, seed)]


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One JSON object per line, UTF-8 and unescaped (as the public dumps are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
