"""A model's reply -> the function calls it makes (or none), whatever call syntax it used.

Accepted, in this order: ``<tool_call>{...}</tool_call>`` blocks (hpcpipe's format, Hermes,
Qwen2.5), Glaive's ``<functioncall> {...}`` (arguments as an object or as a quoted JSON string),
and a bare JSON object or list of ``{"name", "arguments"}``. A reply with none of them makes no
call; a reply that starts a call but whose JSON does not parse is an *invalid* call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_GLAIVE = "<functioncall>"


@dataclass(frozen=True)
class ParsedReply:
    calls: list[dict[str, Any]] = field(default_factory=list)  # {"name": str, "arguments": dict}
    attempted: bool = False  # the reply tried to call a function
    valid: bool = True  # every attempted call parsed

    @property
    def makes_call(self) -> bool:
        return self.attempted


def parse_reply(text: str) -> ParsedReply:
    if "<tool_call>" in text:
        return _parse_all([m.group(1) for m in _TOOL_CALL.finditer(text)])
    if _GLAIVE in text:
        parts = [p.split("<|endoftext|>")[0].strip() for p in text.split(_GLAIVE)[1:]]
        return _parse_all(parts)
    stripped = text.strip()
    if stripped.startswith(("{", "[")) and '"name"' in stripped:
        return _parse_all([stripped])
    return ParsedReply()


def _parse_all(chunks: list[str]) -> ParsedReply:
    calls: list[dict[str, Any]] = []
    for chunk in chunks:
        parsed = _parse_call_json(chunk)
        if parsed is None:
            return ParsedReply(calls, attempted=True, valid=False)
        calls.extend(parsed)
    return ParsedReply(calls, attempted=True, valid=bool(calls))


def _parse_call_json(chunk: str) -> list[dict[str, Any]] | None:
    try:
        value, _ = json.JSONDecoder().raw_decode(chunk.strip())
    except json.JSONDecodeError:
        value = _glaive_quoted(chunk)
        if value is None:
            return None
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        call = _normalise(item)
        if call is None:
            return None
        calls.append(call)
    return calls


def _normalise(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    return {"name": item["name"], "arguments": args} if isinstance(args, dict) else None


def _glaive_quoted(chunk: str) -> Any:
    """Glaive writes ``"arguments": '{...}'``: a single-quoted JSON string, apostrophes unescaped."""
    match = re.match(
        r'\s*\{\s*"name"\s*:\s*"([^"]+)"\s*,\s*"arguments"\s*:\s*\'(.*)\'\s*\}', chunk, re.DOTALL
    )
    if match is None:
        return None
    return {"name": match.group(1), "arguments": match.group(2)}
