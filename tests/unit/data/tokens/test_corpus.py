"""Corpus: which files and documents, in which order, the fingerprint, and the train/val split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens.corpus import (
    corpus_fingerprint,
    iter_documents,
    plan_splits,
    scan_corpus,
)
from hpcpipe.errors import DataError


def _cfg(tmp_path: Path, sources: list[str], **kw: Any) -> DataConfig:
    return DataConfig(sources=sources, prepared_dir=str(tmp_path / "prepared"), **kw)


def _tree(root: Path) -> Path:
    (root / "b").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "z.py").write_text("z = 1\n")
    (root / "a.py").write_text("a = 1\n")
    (root / "b" / "c.py").write_text("c = 1\n")
    (root / "b" / "notes.bin").write_bytes(b"\x00\x01")
    (root / "__pycache__" / "a.py").write_text("cached = 1\n")
    (root / "image.py").write_bytes(b"\x89PNG\x00\x00")  # binary with a wanted suffix: skipped
    return root


def test_directory_walk_is_sorted_filtered_and_pruned(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    docs = list(iter_documents(_cfg(tmp_path, [str(root)], extensions=[".py"])))
    assert [d.key for d in docs] == [f"{root}/a.py", f"{root}/b/c.py", f"{root}/z.py"]
    assert docs[0].text == "a = 1\n"


def test_explicit_file_glob_and_duplicates_read_once(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    notes = tmp_path / "notes.weird"
    notes.write_text("any suffix is fine when named\n")
    sources = [str(notes), str(root / "*.py"), str(root)]
    keys = [d.key for d in iter_documents(_cfg(tmp_path, sources, extensions=[".py"]))]
    assert keys == [str(notes), f"{root}/a.py", f"{root}/z.py", f"{root}/b/c.py"]


def test_jsonl_records_are_documents(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    rows = [{"body": "first"}, {"body": "second\u2028line", "other": 1}]
    path.write_text(json.dumps(rows[0]) + "\r\n\n" + json.dumps(rows[1], ensure_ascii=False) + "\n")
    docs = list(iter_documents(_cfg(tmp_path, [str(path)], text_field="body")))
    assert [(d.key, d.text) for d in docs] == [(f"{path}#1", "first"), (f"{path}#3", "second\u2028line")]
    walked = list(iter_documents(_cfg(tmp_path, [str(tmp_path)], text_field="body")))  # found in a dir
    assert [d.key for d in walked] == [f"{tmp_path}/chat.jsonl#1", f"{tmp_path}/chat.jsonl#3"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("{not json", ":2: not valid JSON"),
        ('{"other": "x"}', ":2: no 'text' field"),
        ('["a list"]', ":2: expected a JSON object"),
        ('{"text": 3}', ":2: field 'text' is not a string"),
        # legal JSON, but no text: it crashed the prepare with a UnicodeEncodeError
        (r'{"text": "a \ud800 b"}', ":2: field 'text' holds a lone surrogate escape"),
        (r'{"text": "\ud83d\ude00 \udfff"}', ":2: field 'text' holds a lone surrogate escape"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n' + line + "\n")
    with pytest.raises(DataError, match=str(path)) as err:
        list(iter_documents(_cfg(tmp_path, [str(path)])))
    assert needle in str(err.value)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("{tmp}/missing.txt", "missing.txt' does not exist"),
        ("{tmp}/*.nothing", "matches no file"),
    ],
)
def test_missing_sources_are_named(tmp_path: Path, source: str, needle: str) -> None:
    with pytest.raises(DataError, match=needle):
        list(iter_documents(_cfg(tmp_path, [source.format(tmp=tmp_path)])))


def test_empty_corpus_and_explicit_binary_file(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no text found"):
        scan_corpus(_cfg(tmp_path, [str(tmp_path / "empty")]))
    blob = tmp_path / "blob.txt"
    blob.write_bytes(b"\xff\xfe\x00 binary")
    with pytest.raises(DataError, match=f"{blob}: not UTF-8 text"):
        list(iter_documents(_cfg(tmp_path, [str(blob)])))


def test_max_bytes_cuts_without_splitting_characters(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.txt").write_text("é" * 10)  # 20 bytes
    (tmp_path / "c" / "b.txt").write_text("never read")
    docs = list(iter_documents(_cfg(tmp_path, [str(tmp_path / "c")], max_bytes=7)))
    assert [d.text for d in docs] == ["ééé"]  # 6 bytes: the 4th character would be cut in half
    scan = scan_corpus(_cfg(tmp_path, [str(tmp_path / "c")], max_bytes=7))
    assert scan.files == 1  # b.txt was never read, so it is not part of the fingerprint


def test_fingerprint_tracks_content_and_output_shaping_config(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    base = _cfg(tmp_path, [str(root)])
    fp = corpus_fingerprint(base)
    assert fp == corpus_fingerprint(base)
    assert fp == corpus_fingerprint(base.model_copy(update={"prepared_dir": "elsewhere"}))
    assert fp != corpus_fingerprint(base.model_copy(update={"vocab_size": 300}))
    assert fp != corpus_fingerprint(base.model_copy(update={"val_fraction": 0.1}))
    as_bytes = base.model_copy(update={"tokenizer": "bytes"})
    assert corpus_fingerprint(as_bytes) == corpus_fingerprint(as_bytes.model_copy(update={"vocab_size": 300}))
    (root / "a.py").write_text("a = 2\n")
    assert corpus_fingerprint(base) != fp


def test_split_holds_out_about_the_byte_fraction_deterministically() -> None:
    keys = [f"doc{i}" for i in range(400)]
    sizes = [100 + (i * 37) % 900 for i in range(400)]
    plan = plan_splits(keys, sizes, 0.1)
    assert plan == plan_splits(keys, sizes, 0.1)
    val_bytes = sum(s for k, s in zip(keys, sizes, strict=True) if k in plan.val_keys)
    assert 0.09 * sum(sizes) < val_bytes <= 0.1 * sum(sizes)


def test_split_keeps_both_sides_non_empty() -> None:
    # one huge document would blow the budget: the smallest still goes to validation
    plan = plan_splits(["big", "small"], [10_000, 10], 0.01)
    assert plan.val_keys == {"small"}
    single = plan_splits(["only"], [1000], 0.1)
    assert single.cut_key == "only"


def test_single_document_is_cut_at_a_line_break(tmp_path: Path) -> None:
    path = tmp_path / "one.txt"
    path.write_text("".join(f"line {i}\n" for i in range(100)))
    [doc] = iter_documents(_cfg(tmp_path, [str(path)]))
    plan = plan_splits([doc.key], [len(doc.text)], 0.1)
    routed = list(plan.route(doc))
    assert [split for split, _ in routed] == ["train", "val"]
    assert routed[0][1].text + routed[1][1].text == doc.text
    assert routed[0][1].text.endswith("\n") and routed[1][1].text.startswith("line ")


def test_stdlib_source_skips_site_packages(tmp_path: Path) -> None:
    docs = list(iter_documents(_cfg(tmp_path, ["@stdlib"], extensions=[".py"], max_bytes=200_000)))
    assert docs and all(d.key.startswith("@stdlib/") for d in docs)
    assert not any("site-packages" in d.key for d in docs)
    assert sum(len(d.text.encode()) for d in docs) == 200_000
