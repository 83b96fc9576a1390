"""The ranks after their node's preparer find its dataset by the corpus's file metadata, without
reading the corpus or hashing a shard, and prepare in full whenever anything changed."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from hpcpipe.config import DataConfig
from hpcpipe.data.tokens import corpus, shards
from hpcpipe.data.tokens.resolved import RECORDS, corpus_stat_key, prepared

LONG_AGO = time.time() - 3600


@pytest.fixture
def old_corpus(tiny_corpus: Path, tmp_path: Path) -> Path:
    """A copy whose files were last written an hour ago (not "racy")."""
    out = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, out)
    for path in out.iterdir():
        os.utime(path, (LONG_AGO, LONG_AGO))
    return out


def _cfg(corpus_dir: Path, tmp_path: Path) -> DataConfig:
    return DataConfig(
        sources=[str(corpus_dir)],
        prepared_dir=str(tmp_path / "prepared"),
        tokenizer="bytes",
        shard_tokens=4096,
        val_fraction=0.1,
    )


class _Reads:
    """Counts the corpus files read and the shards hashed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files = self.hashed = 0
        read, sha = corpus._read_bytes, shards._sha256_file

        def counted_read(path: Path) -> bytes:
            self.files += 1
            return read(path)

        def counted_sha(path: Path) -> str:
            self.hashed += 1
            return sha(path)

        monkeypatch.setattr(corpus, "_read_bytes", counted_read)
        monkeypatch.setattr(shards, "_sha256_file", counted_sha)

    @property
    def any(self) -> bool:
        return self.files + self.hashed > 0


def test_the_next_rank_reads_no_corpus_file_and_hashes_no_shard(
    old_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg(old_corpus, tmp_path)
    first = prepared(cfg)
    reads = _Reads(monkeypatch)
    again = prepared(cfg, quick=True)
    assert not reads.any
    assert again.path == first.path and again.manifest_sha256 == first.manifest_sha256
    prepared(cfg)  # the preparer's own path still verifies in full
    assert reads.files > 0 and reads.hashed > 0


@pytest.mark.parametrize("change", ["edited", "added", "removed", "shard-truncated", "record-escapes"])
def test_anything_changed_means_a_full_preparation(
    old_corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    cfg = _cfg(old_corpus, tmp_path)
    first = prepared(cfg)
    victim = sorted(old_corpus.iterdir())[0]
    if change == "edited":  # same size, an older mtime than before: only the mtime differs
        data = bytearray(victim.read_bytes())
        data[0] ^= 0x01
        victim.write_bytes(bytes(data))
        os.utime(victim, (LONG_AGO - 60, LONG_AGO - 60))
    elif change == "added":
        (old_corpus / "zz_new.py").write_text("print('new')\n")
        os.utime(old_corpus / "zz_new.py", (LONG_AGO, LONG_AGO))
    elif change == "removed":
        victim.unlink()
    elif change == "shard-truncated":
        shard = next(first.path.glob("train-*.bin"))
        shard.write_bytes(shard.read_bytes()[:-2])
    else:  # a record that names a directory outside prepared_dir is not followed
        record = next((Path(cfg.prepared_dir) / RECORDS).glob("*.json"))
        outside = tmp_path / "outside"
        shutil.copytree(first.path, outside)
        record.write_text(json.dumps({"dataset": "../outside", "manifest_sha256": first.manifest_sha256}))
    reads = _Reads(monkeypatch)
    found = prepared(cfg, quick=True)
    assert reads.any, "a full preparation reads the corpus and hashes the shards"
    if change in ("edited", "added", "removed"):
        assert found.manifest_sha256 != first.manifest_sha256
    shards.verify_dataset(found.path)


def test_a_file_written_moments_ago_makes_no_record(old_corpus: Path, tmp_path: Path) -> None:
    """Within two seconds a second write of the same size could keep the mtime. Stamped a little
    ahead here (as a file server's clock may stamp it), so the test does not race the clock."""
    ahead = time.time() + 600
    os.utime(sorted(old_corpus.iterdir())[3], (ahead, ahead))
    cfg = _cfg(old_corpus, tmp_path)
    assert corpus_stat_key(cfg) is None
    prepared(cfg)
    assert not list((Path(cfg.prepared_dir) / RECORDS).glob("*.json"))


def test_the_key_covers_the_config_and_a_given_tokenizer(old_corpus: Path, tmp_path: Path) -> None:
    cfg = _cfg(old_corpus, tmp_path)
    keys: set[Any] = {
        corpus_stat_key(cfg),
        corpus_stat_key(cfg.model_copy(update={"val_fraction": 0.2})),
        corpus_stat_key(cfg, "tokenizer-a"),
        corpus_stat_key(cfg, "tokenizer-b"),
    }
    assert None not in keys and len(keys) == 4
