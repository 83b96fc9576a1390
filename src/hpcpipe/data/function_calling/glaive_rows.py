"""Generated conversations as Glaive v2 rows (``{"system", "chat"}``), the format users' own
function-calling data most often comes in, and JSON-lines files of them.

Parallel calls: Glaive v2 has one call per assistant turn, so hpcpipe writes one ``<functioncall>``
line per call in one assistant turn, followed by one ``FUNCTION RESPONSE`` turn per call, in call order;
``parse_glaive`` returns them as the ``tool_calls`` of one message.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from hpcpipe.config.synthetic import SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.formats import GLAIVE_CALL, GLAIVE_END
from hpcpipe.data.function_calling.generator import generate_conversations


def to_glaive(conv: Conversation, rng: random.Random | None = None) -> dict[str, str]:
    """``conv`` as a Glaive v2 row. With ``rng``, ~15% of calls write their arguments as a plain object."""
    system = next((m.content for m in conv.messages if m.role == "system"), "")
    head = f"SYSTEM: {system}"
    if conv.tools:
        head += "\n" + "\n\n".join(_indented(json.dumps(t, ensure_ascii=False)) for t in conv.tools)
    turns = [_glaive_turn(m, rng) for m in conv.messages if m.role != "system"]
    return {"system": head + "\n\n", "chat": "".join(t + "\n\n\n" for t in turns)}


@lru_cache(maxsize=4096)
def _indented(compact: str) -> str:
    """A function's schema as Glaive lists it (JSON indented by 4), from its compact JSON. The
    same schemas recur row after row (40 everyday functions, a few thousand spellings once names
    are dotted or namespaced), and ``json`` indents in pure Python: 3.6 times the compact C
    encoder's time, which makes the key (2026-12-03, "AMD EPYC")."""
    return json.dumps(json.loads(compact), indent=4, ensure_ascii=False)


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


def generate_glaive_rows(n: int, seed: int, mix: SyntheticMix | None = None) -> list[dict[str, str]]:
    """``n`` Glaive v2 rows (``{"system", "chat"}``).

    ``parse_glaive(rows[i]) == generate_conversations(n, seed, mix)[i]``: the rows add only the Glaive
    spelling of calls (a separate random stream picks quoted or object arguments).
    """
    style = random.Random(f"glaive-style:{seed}")  # how calls are quoted: apart from what is said
    return [to_glaive(conv, style) for conv in generate_conversations(n, seed, mix)]


def write_jsonl(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One JSON object per line, UTF-8 and unescaped (as the public dumps are)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
