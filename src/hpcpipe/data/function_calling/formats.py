"""Function-calling rows in three public formats -> ``Conversation``; bad rows are counted, never fatal.

Formats (``data.format``; :mod:`hpcpipe.data.function_calling.row_files` reads files of them):

* ``glaive``: Glaive v2 (glaiveai/glaive-function-calling-v2), ``{"system": str, "chat": str}``. The
  system text is ``SYSTEM: <prose>`` followed by pretty-printed function objects separated by blank
  lines (not a JSON array); the chat is ``USER:`` / ``ASSISTANT:`` / ``FUNCTION RESPONSE:`` turns,
  assistant turns end in ``<|endoftext|>`` and a call is written
  ``<functioncall> {"name": "f", "arguments": '{"a": 1}'}`` (arguments: JSON inside single quotes,
  unescaped apostrophes included, or a plain JSON object). Glaive has one call per turn; hpcpipe
  writes parallel calls as several ``<functioncall>`` lines in one assistant turn (``generator.py``) and
  reads them back as the ``tool_calls`` of one message.
* ``openai``: ``{"messages": [...], "tools": [...]}`` with ``tool_calls`` on assistant messages.
* ``hermes``: ShareGPT ``{"conversations": [{"from", "value"}]}`` with ``<tools>``, ``<tool_call>``
  and ``<tool_response>`` blocks (JSON, or the Python-literal dicts some Hermes dumps hold).

A row that cannot become a conversation raises ``MalformedRow`` with one of ``REASONS``;
``row_files.read_conversations`` counts them, so a dirty public dump costs rows, not the run.
"""

from __future__ import annotations

import ast
import json
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpcpipe.data.function_calling.conversation import Conversation, Message, Role, ToolCall

GLAIVE_END = "<|endoftext|>"
GLAIVE_CALL = "<functioncall>"
GLAIVE_WITH_FUNCTIONS = (
    "You are a helpful assistant with access to the following functions. Use them if required -"
)
GLAIVE_NO_FUNCTIONS = "You are a helpful assistant, with no access to external functions."

REASONS: dict[str, str] = {
    "bad_json": "the line is not JSON (or holds a lone surrogate escape), or the row is not a JSON object",
    "no_chat": "the row has no chat / messages / conversations field",
    "empty": "the chat is empty, or an assistant turn has neither text nor a call",
    "unknown_role": "a turn has a role the format does not define",
    "bad_message": "a message is not an object or its content is not text",
    "bad_function_call": "a call is not {name, arguments-object} (or its arguments are not JSON)",
    "bad_tool_schema": "a function definition is not JSON or has no name",
    "truncated": "the row is cut off (unfinished last turn, unclosed call or JSON)",
    "no_assistant_turn": "the conversation has no assistant message",
    "unparseable": "a row shape the parsers did not foresee (backstop, see the message)",
}

_JSON = json.JSONDecoder()
_SEPARATORS = re.compile(r"[\s,]*")  # between JSON values in a tools text


class MalformedRow(Exception):
    """One row that cannot become a ``Conversation``; ``reason`` (a ``REASONS`` key) is what reports count."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


# ---------------------------------------------------------------------------------------------- glaive

# Turn markers only at a line start: "USER:" inside a sentence is text, not a turn.
_GLAIVE_TURN = re.compile(r"^(USER|ASSISTANT|FUNCTION RESPONSE):[ \t]*", re.MULTILINE)
# The function JSON starts on the first line that opens an object (or an array, for lenience).
_GLAIVE_TOOLS_START = re.compile(r"^[ \t]*[{\[]", re.MULTILINE)
# Fallback end of a single-quoted argument string: a quote followed by the end of the call object.
_CLOSE_QUOTE = re.compile(r"'(?=\s*[,}])")


def parse_glaive(row: Mapping[str, Any]) -> Conversation:
    """A Glaive v2 row as a conversation; the system prose stays a message, its functions become tools."""
    row = _as_row(row)
    chat = row.get("chat")
    if not isinstance(chat, str):
        raise MalformedRow("no_chat", "row has no 'chat' string")
    system = row.get("system") or ""
    if not isinstance(system, str):
        raise MalformedRow("bad_message", "'system' is not a string")
    prose, tools = _glaive_system(system)
    messages = [Message("system", prose)] if prose else []
    turns = _glaive_turns(chat)
    messages += [_glaive_message(role, text) for role, text in turns]
    _require_assistant(messages)
    last_role, last_text = turns[-1]
    # The dataset always ends on a finished assistant turn; anything else was cut when exported.
    if last_role != "ASSISTANT" or GLAIVE_END not in last_text:
        raise MalformedRow("truncated", f"the chat ends in an unfinished {last_role} turn")
    return _finish(messages, tools)


def _glaive_system(text: str) -> tuple[str, tuple[dict[str, Any], ...]]:
    """(prose, functions) of a Glaive system text: prose up to the first line opening a JSON object."""
    body = text.strip()
    if body.startswith("SYSTEM:"):
        body = body[len("SYSTEM:") :].lstrip()
    start = _GLAIVE_TOOLS_START.search(body)
    if start is None:
        return body, ()
    try:
        values = _json_values(body[start.start() :])
    except ValueError as exc:
        raise MalformedRow(
            "bad_tool_schema", f"function definitions in 'system' are not JSON ({exc})"
        ) from None
    return body[: start.start()].strip(), tuple(_tool(v) for v in values)


def _glaive_turns(chat: str) -> list[tuple[str, str]]:
    if not chat.strip():
        raise MalformedRow("empty", "'chat' is empty")
    parts = _GLAIVE_TURN.split(chat)  # [lead, role, text, role, text, ...]
    if parts[0].strip():
        raise MalformedRow("unknown_role", f"chat starts with {parts[0].strip()[:40]!r}, not a USER: turn")
    return list(zip(parts[1::2], parts[2::2], strict=True))


def _glaive_message(role: str, text: str) -> Message:
    if role == "ASSISTANT":
        return _glaive_assistant(text)
    # Only assistant turns should carry the end marker; drop a stray one rather than keep it as text.
    content = text.replace(GLAIVE_END, "").strip()
    return Message("user" if role == "USER" else "tool", content)


def _glaive_assistant(text: str) -> Message:
    """Text outside ``<functioncall>`` objects is the content; each object is one call, in order."""
    ended = GLAIVE_END in text
    body = text.replace(GLAIVE_END, "")
    pieces: list[str] = []
    calls: list[ToolCall] = []
    pos = 0
    while (start := body.find(GLAIVE_CALL, pos)) >= 0:
        pieces.append(body[pos:start])
        try:
            call, pos = _glaive_call(body, start + len(GLAIVE_CALL))
        except ValueError as exc:
            # A cut-off export loses the end marker too: unfinished call + no marker = truncated.
            reason = "bad_function_call" if ended else "truncated"
            raise MalformedRow(reason, f"<functioncall> cannot be read: {exc}") from None
        calls.append(call)
    pieces.append(body[pos:])
    content = " ".join(p.strip() for p in pieces if p.strip())
    return Message("assistant", content, tuple(calls))


def _glaive_call(text: str, pos: int) -> tuple[ToolCall, int]:
    """The call object at ``pos`` and the offset after it.

    Glaive's call is not JSON: a value may be a single-quoted string holding JSON (Python repr of a
    str), so the object is walked key by key; JSON values are decoded with ``raw_decode``.
    """
    pos = _expect(text, pos, "{")
    fields: dict[str, Any] = {}
    while True:
        pos = _skip_ws(text, pos)
        if text.startswith("}", pos):
            return _tool_call(fields.get("name"), _arguments(fields)), pos + 1
        key, pos = _JSON.raw_decode(text, pos)
        if not isinstance(key, str):
            raise ValueError(f"object key at offset {pos} is not a string")
        pos = _skip_ws(text, _expect(text, pos, ":"))
        if text.startswith("'", pos):
            fields[key], pos = _quoted_json(text, pos + 1)
        else:
            fields[key], pos = _JSON.raw_decode(text, pos)
        pos = _skip_ws(text, pos)
        if text.startswith(",", pos):
            pos += 1
        elif not text.startswith("}", pos):
            raise ValueError(
                f"expected ',' or '}}' at offset {pos}" + (" (text ends)" if pos >= len(text) else "")
            )


def _quoted_json(text: str, start: int) -> tuple[Any, int]:
    """The JSON inside ``'...'`` starting at ``start`` (after the quote) and the offset after the quote.

    Decoding the JSON in place means apostrophes inside its strings (``'{"t": "Don't"}'``) need no
    escaping and cannot end the span early. A Python-escaped body (``\\'``) or ``''`` falls back to
    the first closing quote that is followed by the end of the call object.
    """
    inner = _skip_ws(text, start)
    if not text.startswith("'", inner):
        try:
            value, end = _JSON.raw_decode(text, inner)
            end = _skip_ws(text, end)
            if text.startswith("'", end):
                return value, end + 1
        except json.JSONDecodeError:
            pass
    for close in _CLOSE_QUOTE.finditer(text, start):
        raw = text[start : close.start()].replace("\\'", "'")
        if not raw.strip():
            return "", close.end()
        try:
            return json.loads(raw), close.end()
        except json.JSONDecodeError:
            continue
    raise ValueError("single-quoted arguments are not closed or not JSON")


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _expect(text: str, pos: int, char: str) -> int:
    pos = _skip_ws(text, pos)
    if not text.startswith(char, pos):
        found = "the end of the text" if pos >= len(text) else repr(text[pos : pos + 10])
        raise ValueError(f"expected {char!r} at offset {pos}, found {found}")
    return pos + 1


# ---------------------------------------------------------------------------------------------- openai

_OPENAI_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",  # the pre-tools API's name for a function result
}


def parse_openai(row: Mapping[str, Any]) -> Conversation:
    """An OpenAI-style ``messages`` + ``tools`` row (tools wrapped in ``{"type": "function"}`` or bare)."""
    row = _as_row(row)
    raw = _maybe_json(row.get("messages"), "messages")
    if not isinstance(raw, list):
        raise MalformedRow("no_chat", "row has no 'messages' list")
    if not raw:
        raise MalformedRow("empty", "'messages' is empty")
    tools = _tools(row.get("tools", row.get("functions")))
    return _finish([_openai_message(m) for m in raw], tools)


def _openai_message(raw: Any) -> Message:
    if not isinstance(raw, Mapping):
        raise MalformedRow("bad_message", "a message is not an object")
    name = raw.get("role")
    role = _OPENAI_ROLES.get(name) if isinstance(name, str) else None
    if role is None:
        raise MalformedRow("unknown_role", f"unknown message role {name!r}")
    raw_calls = raw.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise MalformedRow("bad_function_call", "'tool_calls' is not a list")
    if isinstance(raw.get("function_call"), Mapping):  # the pre-tools API: one call per message
        raw_calls = [*raw_calls, {"function": raw["function_call"]}]
    calls = tuple(_openai_call(c) for c in raw_calls)
    if calls and role != "assistant":
        raise MalformedRow("bad_message", f"a {role} message has tool_calls")
    return Message(role, _text(raw.get("content")), calls)


def _openai_call(raw: Any) -> ToolCall:
    if not isinstance(raw, Mapping):
        raise MalformedRow("bad_function_call", "a tool call is not an object")
    fn = raw.get("function")
    fn = fn if isinstance(fn, Mapping) else raw
    return _tool_call(fn.get("name"), _arguments(fn))


def _text(content: Any) -> str:
    """Message text: a string, null (assistant turns that only call) or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Content parts: plain strings or {"type": "text", "text": ...}; images etc. are not text.
        parts = [p.get("text") if isinstance(p, Mapping) else p for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(p for p in parts if isinstance(p, str))
    raise MalformedRow("bad_message", f"message content is a {type(content).__name__}, not text")


# ---------------------------------------------------------------------------------------------- hermes

_HERMES_ROLES: dict[str, Role] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_TOOLS_BLOCK = re.compile(r"[ \t]*<tools>(.*?)</tools>[ \t]*", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)


def parse_hermes(row: Mapping[str, Any]) -> Conversation:
    """A Hermes / ShareGPT row; a row-level ``tools`` (JSON string or list) wins over the system block."""
    row = _as_row(row)
    turns = _maybe_json(row.get("conversations"), "conversations")
    if not isinstance(turns, list):
        raise MalformedRow("no_chat", "row has no 'conversations' list")
    if not turns:
        raise MalformedRow("empty", "'conversations' is empty")
    row_tools = row.get("tools")
    tools = _tools(row_tools) if row_tools not in (None, "", []) else ()
    messages: list[Message] = []
    for turn in turns:
        role, value = _hermes_turn(turn)
        if role == "system":
            prose, found = _hermes_system(value, parse_tools=not tools)
            tools = tools or found
            messages += [Message("system", prose)] if prose else []
        elif role == "assistant":
            messages.append(_hermes_assistant(value))
        elif role == "tool":
            messages += _hermes_tool(value)
        else:
            messages.append(Message(role, value.strip()))
    return _finish(messages, tools)


def _hermes_turn(raw: Any) -> tuple[Role, str]:
    if not isinstance(raw, Mapping):
        raise MalformedRow("bad_message", "a turn is not an object")
    name = raw.get("from", raw.get("role"))
    role = _HERMES_ROLES.get(name) if isinstance(name, str) else None
    if role is None:
        raise MalformedRow("unknown_role", f"unknown turn role {name!r}")
    value = raw.get("value", raw.get("content"))
    if not isinstance(value, str):
        raise MalformedRow("bad_message", f"a {name} turn's value is not text")
    return role, value


def _hermes_system(value: str, parse_tools: bool) -> tuple[str, tuple[dict[str, Any], ...]]:
    """(prose without the ``<tools>`` block, tools in the block): the template re-renders the tools."""
    if value.count("<tools>") != value.count("</tools>"):
        raise MalformedRow("truncated", "the system <tools> block is not closed")
    found: list[dict[str, Any]] = []
    blocks = list(_TOOLS_BLOCK.finditer(value)) if parse_tools else []
    for block in blocks:
        try:
            found += [_tool(v) for v in _json_values(block.group(1))]
        except ValueError as exc:
            raise MalformedRow("bad_tool_schema", f"<tools> is not JSON ({exc})") from None
    return _TOOLS_BLOCK.sub(" ", value).strip(), tuple(found)


def _hermes_assistant(value: str) -> Message:
    if value.count("<tool_call>") != value.count("</tool_call>"):
        raise MalformedRow("truncated", "a <tool_call> block is not closed")
    calls = []
    for block in _TOOL_CALL.finditer(value):
        try:
            obj = _lenient_json(block.group(1))
        except ValueError as exc:
            raise MalformedRow("bad_function_call", f"<tool_call> is not JSON ({exc})") from None
        if not isinstance(obj, Mapping):
            raise MalformedRow("bad_function_call", "<tool_call> does not hold an object")
        calls.append(_tool_call(obj.get("name"), _arguments(obj)))
    return Message("assistant", _TOOL_CALL.sub("", value).strip(), tuple(calls))


def _hermes_tool(value: str) -> list[Message]:
    """One tool message per ``<tool_response>`` block, so parallel results line up with their calls."""
    if value.count("<tool_response>") != value.count("</tool_response>"):
        raise MalformedRow("truncated", "a <tool_response> block is not closed")
    blocks = _TOOL_RESPONSE.findall(value)
    return [Message("tool", b.strip()) for b in blocks] if blocks else [Message("tool", value.strip())]


# ---------------------------------------------------------------------------------------------- shared


def _as_row(row: Any) -> Mapping[str, Any]:
    if not isinstance(row, Mapping):
        raise MalformedRow("bad_json", f"row is a JSON {type(row).__name__}, not an object")
    return row


def _maybe_json(value: Any, key: str) -> Any:
    """Some exports store a list field as a JSON string; decode it."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise MalformedRow("bad_json", f"'{key}' is a string but not JSON") from None


def _tools(value: Any) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    try:
        items = _json_values(value) if isinstance(value, str) else value
    except ValueError as exc:
        raise MalformedRow("bad_tool_schema", f"'tools' is not JSON ({exc})") from None
    if isinstance(items, Mapping):
        items = [items]
    if not isinstance(items, list):
        raise MalformedRow("bad_tool_schema", "'tools' is not a list")
    return tuple(_tool(t) for t in items)


def _tool(value: Any) -> dict[str, Any]:
    """A function object ``{"name", "description", "parameters"}``; the OpenAI wrapper is removed."""
    if (
        isinstance(value, Mapping)
        and value.get("type") == "function"
        and isinstance(value.get("function"), Mapping)
    ):
        value = value["function"]
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str) or not value["name"].strip():
        raise MalformedRow("bad_tool_schema", "a function definition is not an object with a name")
    if value.get("parameters") is not None and not isinstance(value["parameters"], Mapping):
        raise MalformedRow("bad_tool_schema", f"function {value['name']!r}: 'parameters' is not an object")
    return dict(value)


def _arguments(fields: Mapping[str, Any]) -> Any:
    # Some exports name the arguments "parameters"; a call without either takes no arguments.
    return fields.get("arguments", fields.get("parameters", {}))


def _tool_call(name: Any, arguments: Any) -> ToolCall:
    """A call with an object of arguments; arguments given as a JSON string are decoded."""
    if not isinstance(name, str) or not name.strip():
        raise MalformedRow("bad_function_call", "a call has no function name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise MalformedRow("bad_function_call", f"arguments of {name!r} are not JSON") from None
    if not isinstance(arguments, dict):
        raise MalformedRow("bad_function_call", f"arguments of {name!r} are not an object")
    return ToolCall(name, arguments)


def _json_values(text: str) -> list[Any]:
    """Every JSON value in ``text`` (lists flattened), separated by whitespace or commas.

    Glaive separates its function objects by blank lines; Hermes may hold one list, several objects
    or a Python literal (single quotes, True/None), which is tried last.
    """
    values: list[Any] = []
    pos = 0
    try:
        while (pos := _skip_separators(text, pos)) < len(text):
            value, pos = _JSON.raw_decode(text, pos)
            values += value if isinstance(value, list) else [value]
        return values
    except json.JSONDecodeError as exc:
        literal = _literal(text)
        if literal is None:
            raise ValueError(str(exc)) from None
        return list(literal) if isinstance(literal, list | tuple) else [literal]


def _skip_separators(text: str, pos: int) -> int:
    found = _SEPARATORS.match(text, pos)
    return found.end() if found else pos


def _lenient_json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        literal = _literal(text)
        if literal is None:
            raise ValueError(str(exc)) from None
        return literal


def _literal(text: str) -> Any:
    """A Python literal (never code: ``ast.literal_eval``), or None when ``text`` is not one."""
    try:
        with warnings.catch_warnings():  # odd escapes in dirty rows warn; the row is judged, not warned
            warnings.simplefilter("ignore")
            return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _require_assistant(messages: Sequence[Message]) -> None:
    if not any(m.role == "assistant" for m in messages):
        raise MalformedRow("no_assistant_turn", "the conversation has no assistant message")


def _finish(messages: Sequence[Message], tools: Sequence[dict[str, Any]]) -> Conversation:
    """The conversation, if it teaches something: an assistant turn, and no empty assistant turns."""
    _require_assistant(messages)
    if any(m.role == "assistant" and not m.content.strip() and not m.tool_calls for m in messages):
        raise MalformedRow("empty", "an assistant turn has neither text nor a call")
    return Conversation(tuple(messages), tuple(tools))


# ---------------------------------------------------------------------------------------------- by name

Parser = Callable[[Mapping[str, Any]], Conversation]
PARSERS: dict[str, Parser] = {"glaive": parse_glaive, "openai": parse_openai, "hermes": parse_hermes}
