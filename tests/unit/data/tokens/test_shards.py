"""Prepare + manifest: hashes that match the files, reuse without rewriting, damage detected."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens import shards
from hpcpipe.data.tokens.corpus import iter_documents, plan_splits, scan_corpus
from hpcpipe.data.tokens.shards import (
    MANIFEST_FILE,
    PreparedDataset,
    load_tokenizer,
    open_dataset,
    prepare_dataset,
    verify_dataset,
)
from hpcpipe.data.tokens.tokenizer import ByteTokenizer
from hpcpipe.errors import DataError


def _cfg(corpus: Path, prepared: Path, **kw: Any) -> DataConfig:
    base: dict[str, Any] = {"tokenizer": "bytes", "shard_tokens": 4096, "val_fraction": 0.1}
    return DataConfig(sources=[str(corpus)], prepared_dir=str(prepared), **(base | kw))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def prepared(tiny_corpus: Path, tmp_path: Path) -> PreparedDataset:
    return prepare_dataset(_cfg(tiny_corpus, tmp_path / "prepared"))


def test_manifest_hashes_and_counts_match_the_files(prepared: PreparedDataset) -> None:
    m = prepared.manifest
    assert prepared.path.name == m["fingerprint"][:16] and not prepared.reused
    assert prepared.manifest_sha256 == _sha256(prepared.path / MANIFEST_FILE)
    assert m["dtype"] == "uint16" and (prepared.vocab_size, prepared.eos_id) == (257, 256)
    for split in ("train", "val"):
        entries = prepared.shards(split)
        assert all(e["tokens"] == 4096 for e in entries[:-1]) and 0 < entries[-1]["tokens"] <= 4096
        for entry in entries:
            path = prepared.path / entry["file"]
            assert entry["sha256"] == _sha256(path)
            assert path.stat().st_size == entry["tokens"] * 2
        assert m["splits"][split]["tokens"] == prepared.tokens(split)
    assert len(prepared.shards("train")) > 1
    assert sorted(p.name for p in prepared.path.parent.iterdir()) == [prepared.path.name]  # no temp dirs


def test_shards_hold_each_document_followed_by_eos(prepared: PreparedDataset, tiny_corpus: Path) -> None:
    cfg = _cfg(tiny_corpus, prepared.path.parent)
    scan = scan_corpus(cfg)
    plan = plan_splits(scan.keys, scan.sizes, cfg.val_fraction)
    expected: dict[str, list[str]] = {"train": [], "val": []}
    for doc in iter_documents(cfg):
        for split, part in plan.route(doc):
            expected[split].append(part.text)
    tok = load_tokenizer(prepared.path)
    assert isinstance(tok, ByteTokenizer)
    for split in ("train", "val"):
        ids = np.concatenate([np.fromfile(p, dtype="<u2") for p in prepared.shard_paths(split)])
        assert int((ids == tok.eos_id).sum()) == prepared.documents(split) == len(expected[split])
        assert tok.decode(ids.tolist()) == "".join(t + "<|endoftext|>" for t in expected[split])


def test_second_prepare_reuses_without_rewriting(prepared: PreparedDataset, tiny_corpus: Path) -> None:
    mtimes = {p.name: p.stat().st_mtime_ns for p in prepared.path.iterdir()}
    again = prepare_dataset(_cfg(tiny_corpus, prepared.path.parent))
    assert again.reused and again.path == prepared.path
    assert again.manifest_sha256 == prepared.manifest_sha256
    assert {p.name: p.stat().st_mtime_ns for p in again.path.iterdir()} == mtimes


def test_same_inputs_give_identical_bpe_datasets(tiny_corpus: Path, tmp_path: Path) -> None:
    cfg = _cfg(tiny_corpus, tmp_path / "one", tokenizer="bpe", vocab_size=512, shard_tokens=1 << 20)
    one = prepare_dataset(cfg)
    two = prepare_dataset(cfg.model_copy(update={"prepared_dir": str(tmp_path / "two")}))
    assert one.manifest_sha256 == two.manifest_sha256  # location is not part of the identity
    assert one.manifest["tokenizer"]["kind"] == "bpe" and one.vocab_size == 512
    assert _sha256(one.path / "tokenizer.json") == one.manifest["tokenizer"]["sha256"]
    tok = load_tokenizer(two.path)
    assert tok.decode(tok.encode("def f(): pass\n")) == "def f(): pass\n"
    ids = np.fromfile(one.shard_paths("val")[0], dtype="<u2")
    assert ids.max() < 512 and ids[-1] == one.eos_id


def test_the_manifest_records_only_what_makes_the_dataset(tiny_corpus: Path, tmp_path: Path) -> None:
    """Where the dataset is cached and how it is loaded are not the data: the manifest's SHA-256
    (lineage's dataset identity, the staging key) is the same without them."""
    one = prepare_dataset(_cfg(tiny_corpus, tmp_path / "one"))
    loading = {"cache_dir": "/mnt/nvme/c", "num_workers": 3, "pin_memory": True, "augment": False}
    two = prepare_dataset(_cfg(tiny_corpus, tmp_path / "two", **loading))
    assert one.manifest_sha256 == two.manifest_sha256
    recorded = one.manifest["data_config"]
    assert recorded["sources"] == [str(tiny_corpus)] and recorded["format"] == "tokens"
    assert not {"cache_dir", "num_workers", "pin_memory", "augment", "synthetic_mix"} & set(recorded)


def test_a_manifest_written_with_the_whole_config_is_reused_as_it_is(
    prepared: PreparedDataset, tiny_corpus: Path
) -> None:
    """A dataset prepared before the manifest held only identity fields keeps its manifest, so a run
    whose lineage recorded its SHA-256 resumes on the same identity (no dataset_changed)."""
    manifest = prepared.path / MANIFEST_FILE
    old = json.loads(manifest.read_text())
    old["data_config"] |= {"cache_dir": "/mnt/nvme/c", "num_workers": 0, "pin_memory": False}
    manifest.write_text(json.dumps(old, indent=1))
    written = manifest.read_bytes()
    again = prepare_dataset(_cfg(tiny_corpus, prepared.path.parent))
    assert again.reused and again.manifest_sha256 == _sha256(manifest) and manifest.read_bytes() == written


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("flip", "train-00001.bin: shard corrupted"),
        ("truncate", "train-00001.bin: shard is 8190 bytes, the manifest says 8192"),
        ("delete", "train-00001.bin: shard missing"),
    ],
)
def test_verify_names_the_damaged_shard(prepared: PreparedDataset, damage: str, needle: str) -> None:
    shard = prepared.path / "train-00001.bin"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[100] ^= 0x01
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(bytes(data[:-2]))
    else:
        shard.unlink()
    with pytest.raises(DataError, match=needle):
        verify_dataset(prepared.path)


def test_damaged_dataset_is_rebuilt(prepared: PreparedDataset, tiny_corpus: Path) -> None:
    shard = prepared.path / "val-00000.bin"
    shard.write_bytes(b"\x00" * shard.stat().st_size)
    rebuilt = prepare_dataset(_cfg(tiny_corpus, prepared.path.parent))
    assert not rebuilt.reused and rebuilt.path == prepared.path
    verify_dataset(rebuilt.path)
    assert sorted(p.name for p in prepared.path.parent.iterdir()) == [prepared.path.name]


def test_crash_leaves_no_dataset_behind(
    tiny_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(path: Path, data: bytes) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(shards, "_write_synced", crash)
    with pytest.raises(OSError, match="disk full"):
        prepare_dataset(_cfg(tiny_corpus, tmp_path / "prepared"))
    assert list((tmp_path / "prepared").iterdir()) == []


def test_bad_dataset_directories(tmp_path: Path, prepared: PreparedDataset) -> None:
    with pytest.raises(DataError, match="not a prepared dataset"):
        open_dataset(tmp_path)
    manifest = json.loads((prepared.path / MANIFEST_FILE).read_text())
    manifest["splits"]["train"]["shards"][0]["file"] = "../escape.bin"
    (prepared.path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="not a plain file name"):
        open_dataset(prepared.path)
    (prepared.path / MANIFEST_FILE).write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        verify_dataset(prepared.path)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (
            lambda m: m["splits"]["train"]["shards"][0].pop("tokens"),
            r"incomplete manifest \(missing 'tokens'\)",
        ),
        (
            lambda m: m["splits"]["train"]["shards"][0].update(tokens="abc"),
            r"splits\.train\.shards\[0\]\.tokens is 'abc', not a non-negative integer",
        ),
        (lambda m: m["splits"]["val"].update(documents=-1), r"splits\.val\.documents is -1"),
        (lambda m: m["tokenizer"].update(vocab_size=None), r"tokenizer\.vocab_size is None"),
        (
            lambda m: m["splits"]["train"]["shards"][0].update(sha256=7),
            r"shards\[0\]\.sha256 is not a string",
        ),
    ],
)
def test_a_damaged_manifest_field_is_named_before_anything_reads_it(
    prepared: PreparedDataset, edit: Any, needle: str
) -> None:
    manifest = json.loads((prepared.path / MANIFEST_FILE).read_text())
    edit(manifest)
    (prepared.path / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=needle):
        open_dataset(prepared.path)  # verify, staging and training all open it through here
