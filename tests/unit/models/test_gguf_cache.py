"""The GGUF cache's bookkeeping (``models/gguf_cache.py``), with stand-in loaders: the first load
keeps what it built, the next reads it back, another file content is another entry, and
HPCPIPE_GGUF_CACHE=0 turns it off. tests/e2e/test_gguf_dequantised_once.py loads the real SmolLM2 file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcpipe.models.gguf_cache import cached_load, kept_root


class Built:
    def __init__(self, value: str) -> None:
        self.value = value

    def save_pretrained(self, out: Path) -> None:
        (out / "config.json").write_text(json.dumps({"value": self.value}))


def _load(gguf: Path, cache: Path, value: str) -> tuple[str, str]:
    def read(entry: Path) -> Built:
        return Built(json.loads((entry / "config.json").read_text())["value"])

    loaded = cached_load(gguf, cache, "model", lambda: Built(value), read)
    return loaded.value, "file" if loaded.value == value else "kept"


def test_the_first_load_is_kept_and_the_next_reads_it(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    assert _load(gguf, tmp_path / "cache", "built") == ("built", "file")
    assert _load(gguf, tmp_path / "cache", "again") == ("built", "kept")
    [entry] = (tmp_path / "cache").glob("gguf-*/model")
    assert (entry / "config.json").is_file()


def test_another_content_is_another_entry(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    _load(gguf, tmp_path / "cache", "first")
    gguf.write_bytes(b"GGUF two, longer")  # another size: another key even within one mtime tick
    assert _load(gguf, tmp_path / "cache", "second") == ("second", "file")
    assert len(list((tmp_path / "cache").glob("gguf-*"))) == 2


def test_the_cache_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HPCPIPE_GGUF_CACHE", "0")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    _load(gguf, tmp_path / "cache", "first")
    assert _load(gguf, tmp_path / "cache", "second") == ("second", "file")
    assert not (tmp_path / "cache").exists()


def test_copies_are_kept_once_per_machine_and_under_the_prepared_dir_when_that_cache_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run's source points at the machine cache's ``models/`` (a new prepared directory or a
    bare ``.gguf`` evaluation reuses the copy); ``HPCPIPE_CACHE_DIR=`` falls back to the prepared
    directory's ``models/``, and an evaluation then keeps nothing."""
    from hpcpipe.config import ModelConfig
    from hpcpipe.models.hf_lm import resolve_source

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    cfg = ModelConfig(name_or_path=str(tmp_path), gguf_file="m.gguf")
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", str(tmp_path / "machine"))
    assert kept_root(None) == tmp_path / "machine" / "models"
    for prepared in ("one", "two"):
        assert resolve_source(cfg, str(tmp_path / prepared)).cache_dir == str(tmp_path / "machine" / "models")
    monkeypatch.setenv("HPCPIPE_CACHE_DIR", "")
    assert kept_root(None) is None
    assert resolve_source(cfg, str(tmp_path / "one")).cache_dir == str(tmp_path / "one" / "models")


@pytest.mark.parametrize("name", ["@tiny-llama", "@tiny-llama-random", "@random:d64-l2-h4-kv2"])
def test_a_gguf_file_beside_a_built_model_is_refused(tmp_path: Path, name: str) -> None:
    """The built model was trained and model.gguf_file ignored without a word."""
    from hpcpipe.config import ModelConfig
    from hpcpipe.errors import ConfigError
    from hpcpipe.models.hf_lm import resolve_source

    cfg = ModelConfig(name_or_path=name, gguf_file="smollm2.gguf")
    with pytest.raises(ConfigError, match=f"model.gguf_file: not read with model.name_or_path={name}"):
        resolve_source(cfg, str(tmp_path))
