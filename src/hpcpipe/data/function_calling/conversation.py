"""One conversation type for function-calling data, whatever format it was read from.

Glaive v2, OpenAI-style ``messages`` + ``tools`` and Hermes ``<tool_call>`` rows are all
normalised into a ``Conversation`` (``hpcpipe.data.function_calling.formats``): a tuple of messages and
the JSON schemas of the functions the assistant may call. Tools follow the OpenAI "function"
object: ``{"name": ..., "description": ..., "parameters": {JSON schema}}``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]  # parsed JSON object

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class Message:
    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()  # assistant messages only


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    source: str = field(default="", compare=False)  # "file:line", for error reports

    def key(self) -> str:
        """Canonical JSON of the content (not the source): the input of the held-out hash split."""
        payload = {
            "tools": list(self.tools),
            "messages": [[m.role, m.content, [c.to_json() for c in m.tool_calls]] for m in self.messages],
        }
        return json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
