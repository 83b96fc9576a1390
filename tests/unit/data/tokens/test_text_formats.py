"""The user's text for hf-causal-lm: Parquet columns and chat JSON lines read through the datasets
library, and every way a data file can be wrong is one line naming the file (exit 2, no run
directory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.helpers import run_cli

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.corpus import iter_documents, scan_corpus
from hpcpipe.errors import DataError


def _render(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)


def _cfg(fmt: str, *sources: Path, **kw: Any) -> DataConfig:
    return DataConfig(format=fmt, sources=[str(s) for s in sources], **kw)


def test_parquet_rows_are_documents_keyed_by_row(tmp_path: Path) -> None:
    pq.write_table(pa.table({"body": ["first text", "", "third"], "n": [1, 2, 3]}), tmp_path / "a.parquet")
    docs = list(iter_documents(_cfg("parquet", tmp_path, text_field="body")))
    assert [(d.key.rsplit("#", 1)[1], d.text) for d in docs] == [("0", "first text"), ("2", "third")]


def test_chat_lines_are_rendered_with_the_template(tmp_path: Path) -> None:
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    [doc] = iter_documents(_cfg("chat", tmp_path / "chat.jsonl"), render=_render)
    assert doc.text == "<|user|>hi\n<|assistant|>hello\n" and doc.key.endswith("#1")


def test_the_format_and_the_tokenizer_name_the_prepared_dataset(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        json.dumps({"text": "x y z", "messages": [{"role": "user", "content": "q"}]})
    )
    plain = scan_corpus(_cfg("tokens", tmp_path / "a.jsonl")).fingerprint
    assert scan_corpus(_cfg("tokens", tmp_path / "a.jsonl"), tokenizer="abc").fingerprint != plain
    assert scan_corpus(_cfg("chat", tmp_path / "a.jsonl"), render=_render).fingerprint != plain


@pytest.mark.parametrize(
    ("fmt", "write", "needle"),
    [
        ("parquet", lambda p: p.write_bytes(b"PAR1 not really"), "not a readable parquet file"),
        (
            "parquet",
            lambda p: pq.write_table(pa.table({"other": ["x"]}), p),
            "no column 'text' (data.text_field",
        ),
        (
            "parquet",
            lambda p: pq.write_table(pa.table({"text": [1, 2]}), p),
            "row 0: column 'text' is not text",
        ),
        (
            "chat",
            lambda p: p.write_text('{"text": "no messages"}\n'),
            "no 'messages' field (data.messages_field)",
        ),
        ("chat", lambda p: p.write_text('{"messages": "hi"}\n'), ":1: 'messages' is not a list of messages"),
        (
            "chat",
            lambda p: p.write_text('{"messages": [{"content": "x"}]}\n'),
            ":1: a message without a role",
        ),
        ("chat", lambda p: p.write_text("not json\n"), "not a readable json file"),
        ("tokens", lambda p: p.write_text(""), "holds no text (data.sources names it)"),
        ("tokens", lambda p: p.write_text('{"body": "x"}\n'), ":1: no 'text' field (data.text_field)"),
        ("tokens", lambda p: p.write_bytes(b"\xff\xfe bad"), "not UTF-8 text"),
    ],
)
def test_a_bad_data_file_is_one_line_naming_it(tmp_path: Path, fmt: str, write: Any, needle: str) -> None:
    path = tmp_path / {"parquet": "a.parquet", "chat": "a.jsonl", "tokens": "a.jsonl"}[fmt]
    write(path)
    with pytest.raises(DataError) as err:
        list(iter_documents(_cfg(fmt, path), render=_render))
    assert str(path) in str(err.value) and needle in str(err.value) and "\n" not in str(err.value)


def test_the_chat_template_refusing_a_conversation_names_the_line(tmp_path: Path) -> None:
    def strict(messages: list[dict[str, Any]]) -> str:
        raise ValueError("Conversation roles must alternate user/assistant")

    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n")
    with pytest.raises(
        DataError, match=r"a\.jsonl:1: the chat template refused the conversation \(Conversation"
    ):
        list(iter_documents(_cfg("chat", path), render=strict))


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["data.sources=[{tmp}/missing.txt]"], "data.sources: '{tmp}/missing.txt' does not exist"),
        (["data.sources=[{tmp}/empty.txt]"], "{tmp}/empty.txt: holds no text"),
        (
            ["data.format=parquet", "data.sources=[{tmp}/empty.txt]"],
            "{tmp}/empty.txt: not a readable parquet file",
        ),
        (["data.format=chat", "data.sources=[{tmp}/text.jsonl]"], "{tmp}/text.jsonl: no 'messages' field"),
        (["data.format=glaive"], "data.format 'glaive' does not fit run.recipe 'hf-causal-lm'"),
    ],
)
def test_hf_causal_lm_refuses_bad_data_before_any_run_directory(
    tmp_path: Path, sets: list[str], needle: str
) -> None:
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "text.jsonl").write_text('{"text": "a"}\n')
    base = [f"run.out_dir={tmp_path}/runs", f"data.prepared_dir={tmp_path}/prepared"]
    args = [a for s in [*base, *sets] for a in ("--set", s.format(tmp=tmp_path))]
    proc = run_cli("train", "hf-causal-lm-tiny", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and needle.format(tmp=tmp_path) in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
