"""Function-calling rows -> Conversation (Glaive v2, OpenAI, Hermes), malformed rows, and the
synthetic Glaive generator read back by the parser (row files and the held-out split:
test_row_files.py)."""

from __future__ import annotations

import hashlib
import json
import random
import string
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tests.unit.data.function_calling.glaive_text import SONG_TOOL, glaive_row

from hpcpipe.config.synthetic import SyntheticMix
from hpcpipe.data.function_calling.conversation import Conversation, Message, ToolCall
from hpcpipe.data.function_calling.formats import (
    GLAIVE_NO_FUNCTIONS,
    GLAIVE_WITH_FUNCTIONS,
    REASONS,
    MalformedRow,
    parse_glaive,
    parse_hermes,
    parse_openai,
)
from hpcpipe.data.function_calling.generator import LIBRARY, generate_conversations
from hpcpipe.data.function_calling.glaive_rows import generate_glaive_rows, to_glaive, write_jsonl
from hpcpipe.data.function_calling.row_files import read_conversations

NEWS_TOOL = {
    "name": "get_news",
    "description": "Get news",
    "parameters": {"type": "object", "properties": {}},
}


def _reason(parse: Any, row: Any) -> str:
    with pytest.raises(MalformedRow) as info:
        parse(row)
    assert info.value.reason in REASONS
    return info.value.reason


# ---------------------------------------------------------------------------------------------- glaive


def test_glaive_apostrophes_inside_single_quoted_arguments_survive() -> None:
    row = glaive_row(
        "USER: Play Don't Stop Me Now, please.",
        'ASSISTANT: <functioncall> {"name": "play_song", "arguments": \'{"title": "Don\'t Stop Me Now"}\'} '
        "<|endoftext|>",
        'FUNCTION RESPONSE: {"status": "playing", "title": "Don\'t Stop Me Now"}',
        "ASSISTANT: Now playing 'Don't Stop Me Now'. <|endoftext|>",
    )
    conv = parse_glaive(row)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert conv.messages[0].content == GLAIVE_WITH_FUNCTIONS
    assert conv.messages[2] == Message(
        "assistant", "", (ToolCall("play_song", {"title": "Don't Stop Me Now"}),)
    )
    assert conv.messages[3].content == '{"status": "playing", "title": "Don\'t Stop Me Now"}'
    assert conv.messages[4].content == "Now playing 'Don't Stop Me Now'."
    assert conv.tools == (SONG_TOOL,)


def test_glaive_arguments_as_object_as_json_string_and_python_escaped() -> None:
    def call(arguments: str) -> ToolCall:
        row = glaive_row(
            "USER: play it",
            f'ASSISTANT: <functioncall> {{"name": "play_song", "arguments": {arguments}}} <|endoftext|>',
        )
        return parse_glaive(row).messages[2].tool_calls[0]

    expected = ToolCall("play_song", {"title": "Don't Stop"})
    assert call('{"title": "Don\'t Stop"}') == expected  # a plain object
    assert call('"{\\"title\\": \\"Don\'t Stop\\"}"') == expected  # a JSON string holding JSON
    assert call('\'{"title": "Don\\\'t Stop"}\'') == expected  # Python-escaped apostrophe
    assert call("'{}'") == ToolCall("play_song", {})
    assert call("''") == ToolCall("play_song", {})


def test_glaive_text_before_the_call_is_content_and_markers_inside_arguments_do_not_split() -> None:
    args = '{"title": "<functioncall> is a tag, isn\'t it?"}'
    row = glaive_row(
        "USER: play the odd one",
        f'ASSISTANT: Sure, one moment. <functioncall> {{"name": "play_song", "arguments": \'{args}\'}} '
        "<|endoftext|>",
        'FUNCTION RESPONSE: {"status": "playing"}',
        "ASSISTANT: Playing. <|endoftext|>",
    )
    message = parse_glaive(row).messages[2]
    assert message.content == "Sure, one moment."
    assert message.tool_calls == (ToolCall("play_song", json.loads(args)),)


def test_glaive_parallel_calls_are_one_message_and_responses_are_tool_turns() -> None:
    row = glaive_row(
        "USER: Play Despacito and get the news.",
        'ASSISTANT: <functioncall> {"name": "play_song", "arguments": \'{"title": "Despacito"}\'}\n'
        '<functioncall> {"name": "get_news", "arguments": {}} <|endoftext|>',
        'FUNCTION RESPONSE: {"status": "playing"}',
        'FUNCTION RESPONSE: {"headlines": ["Zürich wins"]}',
        "ASSISTANT: Playing Despacito. Top story: Zürich wins. <|endoftext|>",
        tools=(SONG_TOOL, NEWS_TOOL),
    )
    conv = parse_glaive(row)
    assert conv.messages[2].tool_calls == (
        ToolCall("play_song", {"title": "Despacito"}),
        ToolCall("get_news", {}),
    )
    assert [m.role for m in conv.messages[3:5]] == ["tool", "tool"]
    assert [t["name"] for t in conv.tools] == ["play_song", "get_news"]


def test_glaive_row_without_a_call_and_no_access_prompt_are_valid() -> None:
    refusal = glaive_row(
        "USER: Can you book me a flight to São Paulo?",
        "ASSISTANT: I'm sorry, but I can't book flights. I can play songs, though. <|endoftext|>",
        tools=(SONG_TOOL, NEWS_TOOL),
    )
    conv = parse_glaive(refusal)
    assert len(conv.tools) == 2 and not any(m.tool_calls for m in conv.messages)

    chat = glaive_row("USER: What's 東京?", "ASSISTANT: The capital of Japan. <|endoftext|>", tools=())
    conv = parse_glaive(chat)
    assert conv.tools == ()
    assert conv.messages[0] == Message("system", GLAIVE_NO_FUNCTIONS)
    assert conv.messages[1:] == (
        Message("user", "What's 東京?"),
        Message("assistant", "The capital of Japan."),
    )


@pytest.mark.parametrize(
    ("chat", "reason"),
    [
        (("USER: play it", "ASSISTANT: Sure, here it"), "truncated"),  # no end marker
        (
            ("USER: play it", 'ASSISTANT: <functioncall> {"name": "play_song", "arguments": \'{"ti'),
            "truncated",
        ),
        (
            (
                "USER: play it",
                'ASSISTANT: <functioncall> {"name": "play_song", "arguments": \'{}\'} <|endoftext|>',
                'FUNCTION RESPONSE: {"status": "playing"}',
            ),
            "truncated",  # the answer after the result is missing
        ),
        (
            (
                "USER: play it",
                'ASSISTANT: <functioncall> {"name": "play_song", "arguments": [1]} <|endoftext|>',
            ),
            "bad_function_call",
        ),
        (("USER: play it", 'ASSISTANT: <functioncall> {"arguments": {}} <|endoftext|>'), "bad_function_call"),
        (
            (
                "USER: play it",
                'ASSISTANT: <functioncall> {"name": "x", "arguments": \'{oops}\'} <|endoftext|>',
            ),
            "bad_function_call",
        ),
        (("USER: hello", "USER: anyone?"), "no_assistant_turn"),
        (("USER: hello", "ASSISTANT:  <|endoftext|>"), "empty"),
        (("HUMAN: hello", "ASSISTANT: hi <|endoftext|>"), "unknown_role"),
        (("",), "empty"),
    ],
)
def test_glaive_malformed_rows_raise_with_a_reason(chat: tuple[str, ...], reason: str) -> None:
    assert _reason(parse_glaive, glaive_row(*chat)) == reason


def test_glaive_malformed_row_fields() -> None:
    assert _reason(parse_glaive, {"system": "SYSTEM: hi"}) == "no_chat"
    assert _reason(parse_glaive, ["not", "a", "row"]) == "bad_json"
    broken = {"system": f'SYSTEM: {GLAIVE_WITH_FUNCTIONS}\n{{\n  "name": "f",\n', "chat": "USER: x"}
    assert _reason(parse_glaive, broken) == "bad_tool_schema"
    nameless = {"system": f'SYSTEM: {GLAIVE_WITH_FUNCTIONS}\n{{"description": "d"}}', "chat": "USER: x"}
    assert _reason(parse_glaive, nameless) == "bad_tool_schema"


# ------------------------------------------------------------------------------------------ openai, hermes


def test_openai_tools_parallel_calls_and_tool_messages() -> None:
    row = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Play two songs in Zürich."}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "play_song", "arguments": '{"title": "Don\'t Stop"}'},
                    },
                    {
                        "type": "function",
                        "function": {"name": "play_song", "arguments": {"title": "上を向いて"}},
                    },
                ],
            },
            {"role": "tool", "content": '{"ok": true}'},
            {"role": "tool", "content": '{"ok": true}'},
            {"role": "assistant", "content": "Both are queued."},
        ],
        "tools": [{"type": "function", "function": SONG_TOOL}, NEWS_TOOL],
    }
    conv = parse_openai(row)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert conv.messages[1].content == "Play two songs in Zürich."
    assert conv.messages[2] == Message(
        "assistant",
        "",
        (ToolCall("play_song", {"title": "Don't Stop"}), ToolCall("play_song", {"title": "上を向いて"})),
    )
    assert conv.tools == (SONG_TOOL, NEWS_TOOL)


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([{"role": "robot", "content": "hi"}], "unknown_role"),
        ([{"role": "user", "content": "hi"}], "no_assistant_turn"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}],
            "bad_function_call",
        ),
        ([{"role": "assistant", "content": 3}], "bad_message"),
        ([], "empty"),
    ],
)
def test_openai_malformed_rows(messages: list[Any], reason: str) -> None:
    assert _reason(parse_openai, {"messages": messages}) == reason


def test_openai_bad_tools_and_missing_messages() -> None:
    ok = [{"role": "assistant", "content": "hi"}]
    assert _reason(parse_openai, {"messages": ok, "tools": [{"type": "function"}]}) == "bad_tool_schema"
    assert _reason(parse_openai, {"conversations": ok}) == "no_chat"


HERMES_SYSTEM = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. Here are the available tools: "
    f"<tools> {json.dumps([{'type': 'function', 'function': SONG_TOOL}])} "
    "</tools> Call them in <tool_call></tool_call> tags."
)


def test_hermes_tools_block_parallel_tool_calls_and_responses() -> None:
    row = {
        "conversations": [
            {"from": "system", "value": HERMES_SYSTEM},
            {"from": "human", "value": "Play Despacito and Don't Stop Me Now."},
            {
                "from": "gpt",
                "value": '<tool_call>\n{"name": "play_song", "arguments": {"title": "Despacito"}}\n'
                "</tool_call>\n<tool_call>\n"
                "{'name': 'play_song', 'arguments': {'title': \"Don't Stop Me Now\"}}\n</tool_call>",
            },
            {
                "from": "tool",
                "value": '<tool_response>\n{"ok": true}\n</tool_response>\n'
                '<tool_response>\n{"ok": false}\n</tool_response>',
            },
            {"from": "gpt", "value": "The first is playing; the second failed."},
        ]
    }
    conv = parse_hermes(row)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert "<tools>" not in conv.messages[0].content
    assert conv.messages[0].content.endswith(
        "Here are the available tools: Call them in <tool_call></tool_call> tags."
    )
    assert conv.messages[2].tool_calls == (
        ToolCall("play_song", {"title": "Despacito"}),
        ToolCall("play_song", {"title": "Don't Stop Me Now"}),  # a Python-literal call, as some dumps hold
    )
    assert [m.content for m in conv.messages[3:5]] == ['{"ok": true}', '{"ok": false}']
    assert conv.tools == (SONG_TOOL,)


def test_hermes_row_level_tools_and_several_objects_in_the_block() -> None:
    turns = [
        {
            "from": "system",
            "value": f"Tools: <tools>\n{json.dumps(SONG_TOOL)}\n{json.dumps(NEWS_TOOL)}\n</tools>",
        },
        {"from": "human", "value": "news?"},
        {"from": "gpt", "value": '<tool_call>{"name": "get_news", "arguments": "{}"}</tool_call>'},
        {"from": "tool", "value": "[]"},
        {"from": "gpt", "value": "Nothing new."},
    ]
    assert [t["name"] for t in parse_hermes({"conversations": turns}).tools] == ["play_song", "get_news"]
    row_level = parse_hermes({"conversations": turns, "tools": json.dumps([NEWS_TOOL])})
    assert row_level.tools == (NEWS_TOOL,)
    assert row_level.messages[0].content == "Tools:"
    assert row_level.messages[3] == Message("tool", "[]")


@pytest.mark.parametrize(
    ("turn", "reason"),
    [
        ({"from": "gpt", "value": '<tool_call>\n{"name": "f", "arguments": {'}, "truncated"),
        ({"from": "gpt", "value": "<tool_call>not json at all</tool_call>"}, "bad_function_call"),
        ({"from": "narrator", "value": "..."}, "unknown_role"),
        ({"from": "gpt", "value": None}, "bad_message"),
    ],
)
def test_hermes_malformed_rows(turn: dict[str, Any], reason: str) -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, turn, {"from": "gpt", "value": "ok"}]}
    assert _reason(parse_hermes, row) == reason


# ---------------------------------------------------------------------------------------------- generator


def _calls(conv: Conversation) -> list[ToolCall]:
    return [c for m in conv.messages for c in m.tool_calls]


def _shape_flags(conv: Conversation) -> set[str]:
    flags = set()
    if conv.messages[0].content == GLAIVE_NO_FUNCTIONS:
        flags.add("no_access")
    if _calls(conv):
        flags.add("call")
    elif conv.tools:
        flags.add("refusal")
    if any(len(m.tool_calls) > 1 for m in conv.messages):
        flags.add("parallel")
    if sum(len(m.tool_calls) > 0 for m in conv.messages) > 1:
        flags.add("multi_turn")
    first_call = next((i for i, m in enumerate(conv.messages) if m.tool_calls), 0)
    if any(m.role == "assistant" for m in conv.messages[:first_call]):  # asked for details first
        flags.add("clarify")
    return flags


def test_generated_rows_all_parse_back_exactly(tmp_path: Path) -> None:
    paths = []
    for seed in (0, 1):
        paths.append(tmp_path / f"synthetic-{seed}.jsonl")
        write_jsonl(generate_glaive_rows(1000, seed), paths[-1])
    convs, bad = read_conversations(paths, "glaive")
    assert bad == Counter() and len(convs) == 2000
    assert convs[:1000] == generate_conversations(1000, 0)
    assert convs[1000:] == generate_conversations(1000, 1)


def test_generated_rows_cover_every_shape() -> None:
    # The classic mix weighs every shape it has; test_generator.py (beside this file) checks the others.
    convs = generate_conversations(2000, seed=0, mix=SyntheticMix.classic())
    seen = Counter(flag for c in convs for flag in _shape_flags(c))
    for flag in ("call", "parallel", "multi_turn", "clarify", "refusal", "no_access"):
        assert seen[flag] >= 50, (flag, seen)
    assert {len(c.tools) for c in convs} == {0, 1, 2, 3, 4}
    rows = generate_glaive_rows(2000, seed=0, mix=SyntheticMix.classic())
    parallel = [r for r in rows if "\n<functioncall>" in r["chat"]]
    assert parallel, "parallel calls are two <functioncall> lines in one assistant turn"
    assert sum('"arguments": {' in r["chat"] for r in rows) > 50  # plain-object arguments, sometimes
    assert sum('"arguments": \'' in r["chat"] for r in rows) > 500  # single-quoted JSON, mostly


def test_generated_calls_use_listed_functions_and_requests_state_the_values() -> None:
    # Numbers as people write them ("58,183", "$89.90") have their own test (test_generator.py);
    # the math and science functions say some enum values in words ("miles per hour" for mph).
    for conv in generate_conversations(1000, seed=2, mix=SyntheticMix(written_numbers=0, science=0)):
        listed = {t["name"] for t in conv.tools}
        said = ""
        for m in conv.messages:
            if m.role == "user":
                said += " " + m.content
            for call in m.tool_calls:
                assert call.name in listed
                for value in _leaves(call.arguments):
                    assert _norm(str(value)) in _norm(said), (call, said)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list):
        return [x for v in value for x in _leaves(v)]
    return [] if isinstance(value, bool) else [value]  # booleans are stated as sentences


def _norm(text: str) -> str:
    return text.lower().replace("_", " ").replace("-", " ")  # "straight_line": "straight-line depreciation"


def test_generator_is_deterministic_per_seed() -> None:
    assert generate_glaive_rows(300, seed=5) == generate_glaive_rows(300, seed=5)
    assert generate_glaive_rows(300, seed=5) != generate_glaive_rows(300, seed=6)
    assert generate_conversations(500, seed=5)[:300] == generate_conversations(300, seed=5)


# The rows' SHA-256 (first 16 hex digits) for seed 11: the shipped results (the LoRA tables) were
# trained on rows from this generator, so a change to what it draws, or in which order, must be
# deliberate: update these with the note that says why.
STREAM = {
    "default": "e96de9a83d267a0a",
    "weighted": "9018353a5a295991",  # the weighted shuffle: enum_nested, science, place_functions
}


def test_the_generated_stream_is_the_one_the_shipped_results_were_trained_on() -> None:
    weighted = SyntheticMix(
        science=2.0, enum_nested=3.0, place_functions=2.0, dotted_names=0.5, copy_values=0.5
    )
    for name, mix in (("default", SyntheticMix()), ("weighted", weighted)):
        rows = json.dumps(generate_glaive_rows(400, 11, mix)).encode()
        assert hashlib.sha256(rows).hexdigest()[:16] == STREAM[name], name


def test_apostrophes_and_unicode_in_arguments_round_trip_exactly() -> None:
    convs = generate_conversations(2000, seed=1)
    rows = generate_glaive_rows(2000, seed=1)
    tricky = [
        (conv, row)
        for conv, row in zip(convs, rows, strict=True)
        if any(
            any(ch == "'" or ord(ch) > 127 for ch in json.dumps(c.arguments, ensure_ascii=False))
            for c in _calls(conv)
        )
    ]
    assert len(tricky) > 100
    for conv, row in tricky:
        assert _calls(parse_glaive(row)) == _calls(conv)
    texts = {str(v) for conv, _ in tricky for c in _calls(conv) for v in _leaves(c.arguments)}
    assert any("'" in t for t in texts) and any(any(ord(ch) > 0x3000 for ch in t) for t in texts)
    assert {"Zürich", "São Paulo", "Chicago O'Hare"} & texts


def test_to_glaive_writes_the_glaive_layout() -> None:
    conv = Conversation(
        (
            Message("system", GLAIVE_WITH_FUNCTIONS),
            Message("user", "Play Don't Stop Me Now"),
            Message("assistant", "On it.", (ToolCall("play_song", {"title": "Don't Stop Me Now"}),)),
            Message("tool", '{"status": "playing"}'),
            Message("assistant", "Enjoy!"),
        ),
        (SONG_TOOL,),
    )
    row = to_glaive(conv)
    assert row["system"].startswith(f'SYSTEM: {GLAIVE_WITH_FUNCTIONS}\n{{\n    "name": "play_song"')
    assert row["chat"] == (
        "USER: Play Don't Stop Me Now\n\n\n"
        'ASSISTANT: On it. <functioncall> {"name": "play_song", '
        '"arguments": \'{"title": "Don\'t Stop Me Now"}\'}'
        " <|endoftext|>\n\n\n"
        'FUNCTION RESPONSE: {"status": "playing"}\n\n\n'
        "ASSISTANT: Enjoy! <|endoftext|>\n\n\n"
    )
    assert parse_glaive(row) == conv


def test_function_library_is_broad_and_consistent() -> None:
    assert len(LIBRARY) >= 30 and len({s.name for s in LIBRARY}) == len(LIBRARY)
    kinds: set[str] = set()
    for spec in LIBRARY:
        schema = spec.schema()
        for param in spec.params:
            kinds.add("enum" if "enum" in param.schema else param.schema["type"])
            if param.required:
                assert all(f"{{{param.name}" in t for t in spec.requests), (spec.name, param.name)
                assert param.schema["description"].startswith("The "), (spec.name, param.name)
            else:
                assert param.phrase, (spec.name, param.name)
        assert len(spec.requests) >= 3, spec.name
        assert set(schema["parameters"]["required"]) <= set(schema["parameters"]["properties"])
        fields = {f for t in spec.requests for _, f, _, _ in string.Formatter().parse(t) if f}
        assert {f.split("[")[0] for f in fields} <= {p.name for p in spec.params}, spec.name
    assert kinds >= {"string", "integer", "number", "boolean", "enum", "array", "object"}


def test_cut_or_corrupted_glaive_rows_are_counted_never_crash() -> None:
    """A dump cut anywhere (or with a stray quote or brace) is a MalformedRow or a shorter valid chat."""
    rng = random.Random(0)
    reasons: Counter[str] = Counter()
    for row in generate_glaive_rows(100, seed=9):
        for _ in range(10):
            field = rng.choice(["chat", "system"])
            text = row[field][: rng.randrange(len(row[field]) + 1)]
            if rng.random() < 0.3 and text:
                at = rng.randrange(len(text))
                text = text[:at] + rng.choice("'\"{}[],:\\") + text[at + 1 :]
            try:
                parse_glaive({**row, field: text})
            except MalformedRow as exc:
                reasons[exc.reason] += 1
    assert {"truncated", "bad_tool_schema"} <= set(reasons) <= set(REASONS)
