"""Shared by the ``data.synthetic_mix`` tests: mixes, generated rows parsed back as a trainer
reads them, share checks, and what a conversation's turns hold."""

from __future__ import annotations

import math
from collections.abc import Iterator

from hpcpipe.config.synthetic import SHAPE_FIELDS, SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.formats import parse_glaive
from hpcpipe.data.function_calling.generator import LIBRARY, SCIENCE_LIBRARY
from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows
from hpcpipe.data.function_calling.library import Spec

SPECS: dict[str, Spec] = {spec.name: spec for spec in LIBRARY + SCIENCE_LIBRARY}


def only(**knobs: float) -> SyntheticMix:
    """A mix of the shapes named in ``knobs`` (every other shape weighs 0) and the other knobs given."""
    shapes = {name: knobs.pop(name, 0) for name in SHAPE_FIELDS}
    return SyntheticMix(**shapes, **knobs)


def rows(mix: SyntheticMix, n: int, seed: int = 0) -> list[Conversation]:
    """``n`` generated Glaive rows, parsed back as a trainer reads them."""
    return [parse_glaive(row) for row in generate_glaive_rows(n, seed, mix)]


def assert_share(count: int, n: int, p: float, what: str) -> None:
    """``count`` of ``n`` is within 4 binomial standard deviations of the share ``p``."""
    margin = 4 * math.sqrt(p * (1 - p) / n)
    assert abs(count / n - p) <= margin, (
        f"{what}: {count}/{n} = {count / n:.3f}, expected {p:.3f} ± {margin:.3f}"
    )


def first_assistant(conv: Conversation) -> Message:
    return next(m for m in conv.messages if m.role == "assistant")


def first_calls(conv: Conversation) -> tuple[ToolCall, ...]:
    return first_assistant(conv).tool_calls


def listed(conv: Conversation) -> list[str]:
    return [tool["name"] for tool in conv.tools]


def spec_of(name: str) -> Spec:
    """The library function a call or tool names, with or without its dotted namespace."""
    return SPECS[name.rsplit(".", 1)[-1]]


def calls_with_request(conv: Conversation) -> Iterator[tuple[ToolCall, str]]:
    """Every call of ``conv`` and the user message it answers (the last one before it)."""
    user = ""
    for message in conv.messages:
        if message.role == "user":
            user = message.content
        for call in message.tool_calls:
            yield call, user


def declines_naming_the_listed_functions(message: Message, conv: Conversation) -> bool:
    """A refusal says what the listed functions can do instead: every one's capability."""
    return not message.tool_calls and all(
        spec_of(name).capability in message.content for name in listed(conv)
    )


def first_request(conv: Conversation) -> str:
    return next(m.content for m in conv.messages if m.role == "user")
