"""Function-calling row files: reading JSONL and JSON-array files with malformed rows counted by
reason, the malformed report, and the held-out split by content hash."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from tests.unit.data.function_calling.glaive_text import glaive_row

from hpcpipe.data.function_calling.conversation import Conversation, Message
from hpcpipe.data.function_calling.generator import generate_conversations
from hpcpipe.data.function_calling.row_files import held_out, read_conversations, write_malformed_report
from hpcpipe.errors import DataError


def test_read_conversations_counts_malformed_lines_and_names_sources(tmp_path: Path) -> None:
    good = glaive_row("USER: play Despacito", "ASSISTANT: Playing. <|endoftext|>")
    lines = [
        json.dumps(good),
        "{not json",
        "",  # blank lines are not rows
        json.dumps(glaive_row("USER: hi", "ASSISTANT: cut off")),
        json.dumps({"chat": 42}),
        json.dumps([1, 2]),
        json.dumps(good, ensure_ascii=False),
    ]
    path = tmp_path / "glaive.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    convs, bad = read_conversations([path], "glaive")
    assert [c.source for c in convs] == ["glaive.jsonl:1", "glaive.jsonl:7"]
    assert bad == Counter({"bad_json": 2, "truncated": 1, "no_chat": 1})


def test_a_lone_surrogate_escape_is_one_counted_row(tmp_path: Path) -> None:
    """A lone "\\ud800" is legal JSON but no text: the row is counted (bad_json), not a UnicodeEncodeError
    ending the prepare at the held-out split; an escaped pair (an emoji) is text and kept."""
    good = json.dumps(glaive_row("USER: smile \U0001f600", "ASSISTANT: Done. <|endoftext|>"))
    assert "\\ud83d\\ude00" in good
    lone = good.replace("\\ud83d\\ude00", "\\ud800")
    path = tmp_path / "glaive.jsonl"
    path.write_text(f"{good}\n{lone}\n", encoding="utf-8")
    convs, bad = read_conversations([path], "glaive")
    assert [c.source for c in convs] == ["glaive.jsonl:1"] and bad == Counter({"bad_json": 1})


def test_read_conversations_reads_a_json_array_file(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"x": 1},
    ]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows, indent=2))
    convs, bad = read_conversations([path], "openai")
    assert [c.source for c in convs] == ["rows.json:1"]
    assert bad == Counter({"no_chat": 1})


def test_read_conversations_missing_file_is_a_one_line_data_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DataError, match=r"nope\.jsonl") as info:
        read_conversations([missing], "hermes")
    assert "\n" not in str(info.value)


def test_write_malformed_report(tmp_path: Path) -> None:
    path = tmp_path / "out" / "malformed.json"
    write_malformed_report(Counter({"truncated": 3, "bad_json": 1}), total=10, path=path)
    report = json.loads(path.read_text())
    assert report == {
        "total_rows": 10,
        "valid_rows": 6,
        "malformed_rows": 4,
        "malformed": {"bad_json": 1, "truncated": 3},
    }
    assert list(report["malformed"]) == ["bad_json", "truncated"]


def test_held_out_is_a_deterministic_content_hash_near_the_fraction() -> None:
    convs = generate_conversations(1000, seed=3)
    first = [held_out(c, 0.2, seed=7) for c in convs]
    assert first == [held_out(c, 0.2, seed=7) for c in convs]
    assert 140 <= sum(first) <= 260
    renamed = Conversation(convs[0].messages, convs[0].tools, source="elsewhere.jsonl:99")
    assert held_out(renamed, 0.2, seed=7) == first[0]  # the source is not content
    assert first != [held_out(c, 0.2, seed=8) for c in convs]
    assert not any(held_out(c, 0.0, seed=7) for c in convs[:50])
    assert all(held_out(c, 1.0, seed=7) for c in convs[:50])


def test_held_out_pinned_value() -> None:
    """The split must not change between machines or versions: pin one answer of the hash."""
    conv = Conversation((Message("user", "hi"), Message("assistant", "hello")))
    assert [held_out(conv, 0.5, seed) for seed in range(8)] == _PINNED


_PINNED = [True, False, True, False, True, False, True, True]
