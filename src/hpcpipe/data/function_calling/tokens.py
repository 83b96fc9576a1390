"""Conversations -> token ids with assistant-only labels, through the model's own chat template.

Rendering. The tokenizer's chat template renders the messages. When the template takes ``tools``
(its source mentions ``tools``: Qwen2.5, Llama 3.1, Hermes...), tools and calls are passed the
transformers way (``tools=``, ``tool_calls=``) and the template decides the text. Otherwise
hpcpipe's own documented format is used inside the template's messages (``TOOLS_SYSTEM`` below):
the tool schemas go into the system message as JSON lines in ``<tools></tools>``, each call the
assistant makes is a ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block, and a
function's result comes back as a user message in ``<tool_response></tool_response>``. A
tokenizer without any template gets ``CHATML_TEMPLATE`` (``<|im_start|>role ... <|im_end|>``).

Masking. The loss covers exactly the assistant turns, through their end-of-turn token: for
assistant message i the supervised characters are those the template adds between rendering
messages[:i] with the generation prompt and rendering messages[:i+1]. Tokens are labelled from
their character offsets in the full rendering, so the mask is exact whatever the tokenizer merges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall

IGNORE = -100  # label of tokens the loss skips
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS_SYSTEM = (
    "You may call one or more functions to answer the user. The functions, as JSON schemas:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call functions, reply with one <tool_call></tool_call> block per call, each holding a JSON "
    'object {{"name": <function name>, "arguments": <arguments object>}}. '
    "If no function fits the request, answer in plain text without a call."
)


class RenderError(ValueError):
    """The template cannot render this conversation consistently (counted as a malformed row)."""

    reason = "template_error"


@dataclass(frozen=True)
class Encoded:
    input_ids: np.ndarray  # (T,) int32
    labels: np.ndarray  # (T,) int32, IGNORE outside assistant turns
    context: int = 0  # leading tokens before the first user turn: the system prompt with the tools

    @property
    def supervised(self) -> int:
        return int((self.labels != IGNORE).sum())


CALL_OPEN = "<tool_call>"  # opens every call block an assistant turn writes


def format_call(call: ToolCall) -> str:
    return f"{CALL_OPEN}\n" + json.dumps(call.to_json(), ensure_ascii=False) + "\n</tool_call>"


class ChatFormat:
    """How one tokenizer renders conversations; ``encode`` for training, ``prompt`` for generation."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.own_template = not tokenizer.chat_template
        if self.own_template:
            tokenizer.chat_template = CHATML_TEMPLATE
        self.native_tools = "tools" in str(tokenizer.chat_template)

    def messages(
        self, conv: Conversation, upto: int | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The template's messages for ``conv.messages[:upto]`` and its ``tools`` argument."""
        chosen = conv.messages[:upto]
        if self.native_tools:
            tools = [{"type": "function", "function": t} for t in conv.tools] or None
            return [_native_message(m) for m in chosen], tools
        out = [_own_message(m) for m in chosen]
        if conv.tools:
            block = TOOLS_SYSTEM.format(
                tools="\n".join(json.dumps(t, ensure_ascii=False) for t in conv.tools)
            )
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}".strip()}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out, None

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, generation: bool
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation, tokenize=False
            )
        except Exception as exc:  # jinja raises its own exception types for unsupported roles
            raise RenderError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        return str(text)

    def prompt(self, conv: Conversation, upto: int) -> str:
        """The text a model continues to write assistant message ``upto``."""
        messages, tools = self.messages(conv, upto)
        return self.render(messages, tools, generation=True)

    def encode(self, conv: Conversation) -> Encoded:
        """Token ids of the whole conversation and labels on its assistant turns only."""
        messages, tools = self.messages(conv)
        full = self.render(messages, tools, generation=False)
        spans = []
        for i, message in enumerate(conv.messages):
            if message.role != "assistant":
                continue
            before = self.render(*self.messages(conv, i), generation=True)
            through = self.render(*self.messages(conv, i + 1), generation=False)
            if not (through.startswith(before) and full.startswith(through)):
                raise RenderError("the chat template does not render prefixes of a conversation as prefixes")
            spans.append((len(before), len(through)))
        enc = self.tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.asarray(enc["input_ids"], dtype=np.int32)
        starts = np.asarray([start for start, _ in enc["offset_mapping"]], dtype=np.int64)
        supervised = np.zeros(len(ids), dtype=bool)
        for lo, hi in spans:
            supervised |= (starts >= lo) & (starts < hi)
        context = int(np.searchsorted(starts, self._context_chars(conv, full)))
        return Encoded(ids, np.where(supervised, ids, IGNORE).astype(np.int32), context)

    def _context_chars(self, conv: Conversation, full: str) -> int:
        """Characters of ``full`` before the first turn that is not the system prompt: the system
        prompt with the tool schemas as the template renders them (0 when it renders no prefix)."""
        first = next((i for i, m in enumerate(conv.messages) if m.role != "system"), len(conv.messages))
        try:
            text = self.render(*self.messages(conv, first), generation=False)
        except RenderError:  # a template that renders no conversation without a user turn
            return 0
        return len(text) if full.startswith(text) else 0


def _native_message(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    return out


def _own_message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    if message.role == "assistant" and message.tool_calls:
        calls = "\n".join(format_call(c) for c in message.tool_calls)
        return {"role": "assistant", "content": f"{message.content}\n{calls}".strip()}
    return {"role": message.role, "content": message.content}
