"""Tokenizers: raw bytes and locally trained byte-level BPE round-trip text exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcpipe.data.tokens.tokenizer import EOS_TOKEN, BPETokenizer, ByteTokenizer, Tokenizer, train_tokenizer
from hpcpipe.errors import DataError

SAMPLES = [
    "def f(x):\n    return x * 2  # doubled\n",
    "naïve café — 東京 🚀\ttabs\r\nand CRLF",
    "",
    "   leading spaces and trailing   ",
]


@pytest.fixture(scope="module")
def bpe(tiny_corpus: Path) -> BPETokenizer:
    texts = [p.read_text() for p in sorted(tiny_corpus.glob("*.py"))]
    return BPETokenizer.train(texts, vocab_size=600)


def test_bytes_round_trip_and_eos() -> None:
    tok = ByteTokenizer()
    assert isinstance(tok, Tokenizer)
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    for text in SAMPLES:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch(SAMPLES) == [tok.encode(t) for t in SAMPLES]
    assert tok.decode([*tok.encode("a"), tok.eos_id, *tok.encode("b")]) == f"a{EOS_TOKEN}b"


def test_bpe_round_trips_and_compresses(bpe: BPETokenizer) -> None:
    assert isinstance(bpe, Tokenizer)
    assert bpe.vocab_size == 600 and bpe.name == "bpe-600"
    assert bpe.eos_id == 0
    for text in SAMPLES:
        assert bpe.decode(bpe.encode(text)) == text
    code = "import os\n\ndef main():\n    return os.path.join('a', 'b')\n"
    assert len(bpe.encode(code)) < 0.75 * len(code.encode())  # merges learned from Python source
    assert bpe.encode_batch(SAMPLES) == [bpe.encode(t) for t in SAMPLES]


def test_bpe_never_emits_eos_for_text(bpe: BPETokenizer) -> None:
    ids = bpe.encode(f"a {EOS_TOKEN} b")
    assert bpe.eos_id not in ids
    assert bpe.decode(ids) == f"a {EOS_TOKEN} b"


def test_bpe_save_load_and_deterministic_training(
    bpe: BPETokenizer, tmp_path: Path, tiny_corpus: Path
) -> None:
    bpe.save(tmp_path / "tok.json")
    loaded = BPETokenizer.from_file(tmp_path / "tok.json")
    assert loaded.encode(SAMPLES[1]) == bpe.encode(SAMPLES[1])
    assert loaded.eos_id not in loaded.encode(EOS_TOKEN)  # the setting survives a reload
    texts = [p.read_text() for p in sorted(tiny_corpus.glob("*.py"))]
    again = BPETokenizer.train(texts, vocab_size=600)
    again.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "tok.json").read_bytes()


def test_train_tokenizer_kinds(tmp_path: Path) -> None:
    assert isinstance(train_tokenizer("bytes", [], 4096), ByteTokenizer)
    with pytest.raises(DataError, match="unknown kind 'words'"):
        train_tokenizer("words", [], 4096)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match=r"bad\.json"):
        BPETokenizer.from_file(tmp_path / "bad.json")
